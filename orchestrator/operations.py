"""What an operator does with the documents the replicas work on: the status report
(documents per phase and lease state, the latest errors, the live replicas, the pauses),
finding documents (by id, business key or ``Filter``, a page at a time) and their
history, retry, unlock and cancel of one document or of all a filter selects, pause and
resume, and the audit trail. The command line, the operator's page and the metrics
collector all act through it, so what an action means cannot differ between them::

    from orchestrator.operations import AsyncOperations

    status = await AsyncOperations(async_client["orchestrator"]).status(errors=0)
    status.counts()  # {collection: {phase: count}}

``Operations`` takes a ``MongoClient``'s database, ``AsyncOperations`` an
``AsyncMongoClient``'s; one design in two forms (the sync one is generated from the async
one). ``AsyncStatusCache``/``StatusCache`` compute the status report at most once per
period for every reader of a process (the page, its JSON API, the metrics collector).
``ReportStore``/``AsyncReportStore`` are the contract they rely on from the store.
"""

from orchestrator.core.audit import AuditEntry
from orchestrator.core.browse import Filter, LeaseState, Page, Row, UnindexedField, parse_fields
from orchestrator.core.errors import (
    AmbiguousId,
    DocumentChanged,
    DocumentNotFound,
    LeaseHeld,
    NoErrorPhase,
    OperatorError,
    UnhandledPhase,
)
from orchestrator.core.history import Entry
from orchestrator.core.operator import (
    Action,
    Bulk,
    Retried,
    default_actor,
    error_phase,
    id_json,
    live_lease,
    parse_id_json,
)
from orchestrator.core.pauses import Pause, Scope
from orchestrator.core.status import PhaseCount, RecentError, Status
from orchestrator.mongo import (
    AsyncOperations,
    AsyncReportStore,
    AsyncStatusCache,
    Operations,
    ReportStore,
    StatusCache,
)

__all__ = [
    "Action",
    "AmbiguousId",
    "AsyncOperations",
    "AsyncReportStore",
    "AsyncStatusCache",
    "AuditEntry",
    "Bulk",
    "DocumentChanged",
    "DocumentNotFound",
    "Entry",
    "Filter",
    "LeaseHeld",
    "LeaseState",
    "NoErrorPhase",
    "Operations",
    "OperatorError",
    "Page",
    "Pause",
    "PhaseCount",
    "RecentError",
    "ReportStore",
    "Retried",
    "Row",
    "Scope",
    "Status",
    "StatusCache",
    "UnhandledPhase",
    "UnindexedField",
    "default_actor",
    "error_phase",
    "id_json",
    "live_lease",
    "parse_fields",
    "parse_id_json",
]
