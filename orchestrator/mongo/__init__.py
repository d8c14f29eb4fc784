"""The only package that talks to pymongo.

- ``_async/``: written by hand: the lease side of the store (``AsyncStore``,
  ``connect_async``), ``AsyncLease``, ``measure`` (the server clock's probe), the
  operator's side (``AsyncReportStore``, its contract, kept by ``AsyncReports``) and
  ``AsyncOperations`` (status, find, unlock, retry: public as ``orchestrator.operations``)
  and ``AsyncStatusCache`` (its status report, shared by the page and the metrics);
- ``_sync/``: ``Store``, ``connect``, ``Lease``, ``measure``, ``ReportStore``, ``Reports``,
  ``Operations`` and ``StatusCache``, generated from them (``scripts/synchro.py``);
- ``common.py``: what both share that does no I/O (error mapping, options, index plans).
  What a lease decides is in ``orchestrator.core.lease``.
"""

from orchestrator.mongo._async.lease import AsyncLease
from orchestrator.mongo._async.operations import AsyncOperations
from orchestrator.mongo._async.reports import AsyncReports, AsyncReportStore
from orchestrator.mongo._async.status_cache import AsyncStatusCache
from orchestrator.mongo._async.store import AsyncStore, check_reachable_async, connect_async
from orchestrator.mongo._sync.lease import Lease
from orchestrator.mongo._sync.operations import Operations
from orchestrator.mongo._sync.reports import Reports, ReportStore
from orchestrator.mongo._sync.status_cache import StatusCache
from orchestrator.mongo._sync.store import Store, check_reachable, connect

__all__ = [
    "AsyncLease",
    "AsyncOperations",
    "AsyncReportStore",
    "AsyncReports",
    "AsyncStatusCache",
    "AsyncStore",
    "Lease",
    "Operations",
    "ReportStore",
    "Reports",
    "StatusCache",
    "Store",
    "check_reachable",
    "check_reachable_async",
    "connect",
    "connect_async",
]
