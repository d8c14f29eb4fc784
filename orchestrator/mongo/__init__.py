"""The only package that talks to pymongo.

- ``_async/``: ``AsyncStore`` and ``connect_async``, ``AsyncLease``, and ``measure`` (the
  server clock's probe), written by hand;
- ``_sync/``: ``Store``, ``connect``, ``Lease`` and ``measure``, generated from them
  (``scripts/synchro.py``);
- ``common.py``: what both share that does no I/O (error mapping, options, index plans).
  What a lease decides is in ``orchestrator.core.lease``.
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
