"""The engine's store: the one package the engine talks to pymongo through.

- ``_async/``: written by hand: the lease side of the store (``AsyncStore``,
  ``connect_async``) and its contract (``AsyncLeaseStore``), ``AsyncLease``, ``measure``
  (the server clock's probe);
- ``_sync/``: ``Store``, ``connect``, ``Lease``, ``measure``, generated from them
  (``scripts/synchro.py``);
- what both share that does no I/O, by topic: ``driver_errors.py`` (the driver's errors
  as the library's), ``connection.py`` (the server's checks, the client's, codec and
  write-concern options), ``index_plans.py`` (reuse, replace or refuse an index),
  ``probe_answers.py`` (the idle probe's rows as the scheduler reads them).
  What a lease decides is in ``orchestrator.core.lease``; the operator's reads and
  changes are ``orchestrator.operations``'.
"""

from orchestrator.mongo._async.lease import AsyncLease
from orchestrator.mongo._async.store import AsyncStore, check_reachable_async, connect_async
from orchestrator.mongo._sync.lease import Lease
from orchestrator.mongo._sync.store import Store, check_reachable, connect

__all__ = [
    "AsyncLease",
    "AsyncStore",
    "Lease",
    "Store",
    "check_reachable",
    "check_reachable_async",
    "connect",
    "connect_async",
]
