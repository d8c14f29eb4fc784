"""The operator's actions, unlock and retry, decided once for the command line and the page.

Each action is planned from the document as the operator saw it: the plan holds the
filter that applies it only while the document is still so (``queries.operator_guard``)
and the update. The command line and the page carry it out with their own store (sync or
async), so what an action means cannot differ between them.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from orchestrator.core import queries
from orchestrator.mongo.common import Document
from orchestrator.tools.loading import CommandError


@dataclass(frozen=True)
class Retry:
    """Send ``doc_id`` from ``source`` back to ``target`` with fresh counters."""

    collection: str
    doc_id: Any
    source: Any
    target: str
    guard: dict[str, Any]

    def update(self, now: datetime) -> dict[str, Any]:
        """The update at ``now``, the server's time: ``updatedAt`` starts the phase's clock
        for the replicas' backoff, so it must be on the clock they judge by."""
        return queries.operator_retry_update(self.target, now)


@dataclass(frozen=True)
class Unlock:
    """Make ``doc_id`` claimable at once; a live holder's later writes raise ``LeaseLost``."""

    collection: str
    doc_id: Any
    guard: dict[str, Any]

    def update(self) -> dict[str, Any]:
        return queries.release_update()


def error_phase(doc: Document) -> str | None:
    """The phase the document's last error happened in, where a retry sends it by default."""
    error = doc.get("lastError")
    phase = error.get("phase") if isinstance(error, dict) else None
    return phase if isinstance(phase, str) and phase else None


def plan_retry(collection: str, doc_id: Any, source: Any, target: str) -> Retry:
    """Back to ``target``, applied only while the document is still in ``source``, the
    phase the operator saw. ``CommandError`` when ``target`` is no phase name."""
    if not target or target.startswith("$"):
        raise CommandError(f"{target!r} is not a phase name")
    return Retry(collection, doc_id, source, target, queries.operator_guard(doc_id, source))


def plan_unlock(collection: str, doc_id: Any, phase: Any, token: Any) -> Unlock:
    """Release the lease, applied only while the document is in ``phase`` and held by the
    lease ``token`` (or by none, for None), as the operator saw it: an unlock confirmed
    for one holder never releases the next one's."""
    return Unlock(collection, doc_id, queries.operator_guard(doc_id, phase, token))


__all__ = ["Retry", "Unlock", "error_phase", "plan_retry", "plan_unlock"]
