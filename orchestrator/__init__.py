"""Run multi-step work on MongoDB documents from every replica of an API server, safely.

Each step is claimed with one atomic find-and-modify on ``lockedAt``, fenced by a lease
token, and released with ``unlock`` (next step at once), ``relock`` (wait, with
progressive backoff) or ``advance`` (next phase).
"""

from orchestrator.core.backoff import BackoffPolicy, ExponentialBackoff, ProgressiveBackoff
from orchestrator.core.clock import Clock, SystemClock
from orchestrator.core.distribution import library_version
from orchestrator.core.errors import (
    ConfigError,
    LeaseLost,
    OperatorError,
    OrchestratorError,
    ShardKeyRequired,
    StoreError,
)
from orchestrator.core.events import (
    AttemptFailedEvent,
    ClockMeasuredEvent,
    IdleProbeEvent,
    LeaseExtendedEvent,
    LeaseLostEvent,
    Listener,
    ScheduleFiredEvent,
    StepClaimedEvent,
    StepFinishedEvent,
    SubmittingEvent,
)
from orchestrator.core.lease_api import BlockingLease
from orchestrator.core.lease_values import Outcome
from orchestrator.core.outcomes import LeaseWrite, StepOutcome
from orchestrator.core.redact import redact
from orchestrator.core.resource import EPOCH, ErrorRecord, Resource
from orchestrator.core.settings import DEFAULT_DATABASE, Settings
from orchestrator.core.steps import StepTimeout, StopReport
from orchestrator.core.trees import Delivered, Owner, Signal
from orchestrator.mongo import AsyncLease, Lease
from orchestrator.operations import AsyncOperations, Operations, Status
from orchestrator.runners._async.engine import AsyncOrchestrator
from orchestrator.runners._sync.engine import Orchestrator
from orchestrator.runners.threads import ThreadLease

__version__ = library_version()
"""The installed distribution's version ("unknown" in a never-installed source tree)."""

__all__ = [
    "DEFAULT_DATABASE",
    "EPOCH",
    "AsyncLease",
    "AsyncOperations",
    "AsyncOrchestrator",
    "AttemptFailedEvent",
    "BackoffPolicy",
    "BlockingLease",
    "Clock",
    "ClockMeasuredEvent",
    "ConfigError",
    "Delivered",
    "ErrorRecord",
    "ExponentialBackoff",
    "IdleProbeEvent",
    "Lease",
    "LeaseExtendedEvent",
    "LeaseLost",
    "LeaseLostEvent",
    "LeaseWrite",
    "Listener",
    "Operations",
    "OperatorError",
    "Orchestrator",
    "OrchestratorError",
    "Outcome",
    "Owner",
    "ProgressiveBackoff",
    "Resource",
    "ScheduleFiredEvent",
    "Settings",
    "ShardKeyRequired",
    "Signal",
    "Status",
    "StepClaimedEvent",
    "StepFinishedEvent",
    "StepOutcome",
    "StepTimeout",
    "StopReport",
    "StoreError",
    "SubmittingEvent",
    "SystemClock",
    "ThreadLease",
    "__version__",
    "redact",
]
