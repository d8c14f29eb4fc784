"""What an operator does with the documents the replicas work on: the status report
(documents per phase and lease state, the latest errors, the live replicas), finding a
document, unlock and retry. The command line, the operator's page and the metrics
collector all act through it, so what an action means cannot differ between them::

    from orchestrator.operations import AsyncOperations

    status = await AsyncOperations(async_client["orchestrator"]).status(errors=0)
    status.counts()  # {collection: {phase: count}}

``Operations`` takes a ``MongoClient``'s database, ``AsyncOperations`` an
``AsyncMongoClient``'s; one design in two forms (the sync one is generated from the async
one). ``ReportStore``/``AsyncReportStore`` are the contract they rely on from the store.
"""

from orchestrator.core.errors import (
    AmbiguousId,
    DocumentChanged,
    DocumentNotFound,
    LeaseHeld,
    OperatorError,
)
from orchestrator.core.operator import Retried, error_phase, id_json, live_lease, parse_id_json
from orchestrator.core.status import PhaseCount, RecentError, Status
from orchestrator.mongo import AsyncOperations, AsyncReportStore, Operations, ReportStore

__all__ = [
    "AmbiguousId",
    "AsyncOperations",
    "AsyncReportStore",
    "DocumentChanged",
    "DocumentNotFound",
    "LeaseHeld",
    "Operations",
    "OperatorError",
    "PhaseCount",
    "RecentError",
    "ReportStore",
    "Retried",
    "Status",
    "error_phase",
    "id_json",
    "live_lease",
    "parse_id_json",
]
