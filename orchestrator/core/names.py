"""What the library names in a database: its own collections (each a setting's default)
and the indexes it makes on them and on the applications' collections. Stored names: a
change leaves the old collection or index behind, so they change only with a migration.
"""

REPLICAS_COLLECTION = "orchestrator.replicas"
"""Where replicas record themselves unless ``Settings.replicas_collection`` says otherwise."""

PAUSES_COLLECTION = "orchestrator.pauses"
"""Where the operators' pauses are kept unless ``Settings.pauses_collection`` says otherwise."""

AUDIT_COLLECTION = "orchestrator.audit"
"""Where operators' actions and take-overs are recorded unless ``Settings.audit_collection``
says otherwise."""

SLOTS_COLLECTION = "orchestrator.slots"
"""Where limited handlers' slots are kept unless ``Settings.slots_collection`` says otherwise."""

SCHEDULES_COLLECTION = "orchestrator.schedules"
"""Where each schedule's document is kept (its spec, next fire, counts) unless
``Settings.schedules_collection`` says otherwise."""

CLAIM_INDEX_NAME = "orchestrator_claim_until"
"""The claim's index (``claims.CLAIM_INDEX``) on each handled collection."""

ERRORS_INDEX_NAME = "orchestrator_errors"
"""The latest errors' index (``operators.ERRORS_INDEX``) on each handled collection."""

RETENTION_INDEX_NAME = "orchestrator_retention"
"""The TTL index (``retention.RETENTION_INDEX``) on each collection with a retention."""

IN_HOUSE_INDEX_NAME = "orchestrator_legacy_lock"
"""The in-house leases' index (``in_house.IN_HOUSE_INDEX``), made while migrating."""

UNIQUE_PREFIX = "orchestrator_unique_"
"""Names the unique index of each set of ``submit``'s keys (its fields follow)."""

SCHEDULE_RUNS_INDEX_NAME = "orchestrator_schedule_runs"
OWNER_INDEX_NAME = "orchestrator_owner"
"""A collection's children by their owner (``queries.trees.OWNER_INDEX``)."""
"""A schedule's runs' index (``queries.schedules.RUNS_INDEX``) on the collections
schedules submit to."""

REPLICA_INDEX_NAME = "orchestrator_replica_expiry"
"""The replicas' records' TTL index (``replica_records.REPLICA_INDEX``)."""

SLOT_INDEX_NAME = "orchestrator_slots"
"""The slots' index (``limit_slots.SLOT_INDEX``)."""

AUDIT_INDEX_NAME = "orchestrator_audit_expiry"
"""The audit trail's TTL index (``audit.AUDIT_INDEX``)."""

AUDIT_ORDER_INDEX_NAME = "orchestrator_audit_order"
"""The audit trail's latest-first index (``audit.AUDIT_ORDER_INDEX``)."""

AUDIT_KEY_INDEX_NAME = "orchestrator_audit_keys"
"""The audit trail's index by business key (``audit.AUDIT_KEY_INDEX``)."""
