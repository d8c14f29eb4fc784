"""What one replica's parts share: the store they write through, the server's clock they
judge leases by, the settings, the books of its steps and where it reports. The engine
makes one and hands it to each part (its steps, its cluster-wide limits, its record), so
a part's constructor names only what is its own; the sync twin is generated
(``scripts/synchro.py``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from orchestrator.core.clock import ServerClock
from orchestrator.core.retention import Retention
from orchestrator.core.settings import Settings
from orchestrator.mongo._async.contract import AsyncLeaseStore
from orchestrator.mongo._async.lease import AsyncLease
from orchestrator.runners.books import Books
from orchestrator.runners.reporter import Reporter

__all__ = ["AsyncReplicaParts"]


@dataclass(frozen=True)
class AsyncReplicaParts:
    """One replica's shared parts (see the module)."""

    store: AsyncLeaseStore
    clock: ServerClock
    settings: Settings
    books: Books[AsyncLease[Any]]
    report: Reporter
    retention: Mapping[str, Retention] = field(default_factory=dict)
    """Per collection, its retention (``Registry.retention``, which ``retain`` fills)."""
