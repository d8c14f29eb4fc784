"""Every MongoDB filter and update the orchestrator sends, as pure functions, one module per
sender: ``claims`` (a replica's claim and probe), ``lease_writes`` (a step's holder),
``submissions`` (``submit``), ``operators`` (the operators' tools), ``replica_records``
(a replica about itself) and ``limit_slots`` (a handler's cluster-wide limit). The
in-house pattern's leases, honoured during a migration, are ``core.in_house``'s.

Each returns plain dicts, so it can be checked without a database.
"""
