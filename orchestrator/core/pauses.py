"""Operators' pauses: a collection, a phase of it, or one handler, paused on every replica.

A pause is a document in ``Settings.pauses_collection`` (``orchestrator pause``, the page,
``orchestrator.operations``). Every replica reads them all with each tick's probe (in its
one round trip: no read of their own), or at a heartbeat when no probe read them in the
last interval, and claims nothing for a paused handler from then on; steps already
running finish. So a pause takes hold within a tick, at most one heartbeat interval
(``replicas.refresh_interval``), and each replica publishes the pauses it honours in its
record, for operators to see it has.

Everything here is pure; the store reads and writes them, the scheduler skips what they
cover.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

from orchestrator.core.clock import as_utc, bson_time
from orchestrator.core.errors import OperatorError

if TYPE_CHECKING:
    from orchestrator.core.registry import Handler


@dataclass(frozen=True)
class Scope:
    """What a pause covers: a ``collection``'s handlers, those of one ``phase`` of it, or the
    handler named ``handler`` (its ``module:function`` name) on it."""

    collection: str
    phase: str | None = None
    handler: str | None = None

    def __post_init__(self) -> None:
        for name in ("collection", "phase", "handler"):
            value = getattr(self, name)
            if value is None and name != "collection":
                continue
            if not isinstance(value, str) or not value or value.startswith("$") or "\x00" in value:
                raise OperatorError(f"a pause's {name} must be a name, not {value!r}")

    @property
    def key(self) -> str:
        """The pause's ``_id``: one pause per scope, so pausing twice is one pause."""
        return f"{self.collection}|{self.phase or ''}|{self.handler or ''}"

    def covers(self, handler: Handler) -> bool:
        """Whether ``handler``'s claims stop under this pause. A phase pause covers the
        handlers registered for that phase (``phase()``, or ``when()`` with a phase
        equality), not a ``when()`` filter that matches other phases too."""
        return (
            self.collection == handler.collection
            and (self.phase is None or self.phase == handler.phase)
            and (self.handler is None or self.handler == handler.name)
        )

    def describe(self) -> str:
        parts = [self.collection]
        if self.phase is not None:
            parts.append(f"phase {self.phase}")
        if self.handler is not None:
            parts.append(f"handler {self.handler}")
        return ", ".join(parts)


@dataclass(frozen=True)
class Pause:
    """A pause in force: its scope, who paused it, when (the server's time) and why."""

    scope: Scope
    by: str
    at: datetime | None
    why: str

    @classmethod
    def read(cls, doc: Mapping[str, Any]) -> Pause | None:
        """The pause stored as ``doc`` (``document``), or None for anything else: a
        replica skips what it cannot read, and never pauses on a guess."""
        try:
            scope = Scope(doc["collection"], doc.get("phase"), doc.get("handler"))
        except (KeyError, OperatorError):
            return None
        at = doc.get("at")
        return cls(
            scope=scope,
            by=str(doc.get("by", "")),
            at=as_utc(at) if isinstance(at, datetime) else None,
            why=str(doc.get("why", "")),
        )

    def document(self, at: datetime) -> dict[str, Any]:
        return {
            "_id": self.scope.key,
            "collection": self.scope.collection,
            "phase": self.scope.phase,
            "handler": self.scope.handler,
            "by": self.by,
            "at": bson_time(at),
            "why": self.why,
        }

    def to_dict(self) -> dict[str, Any]:
        return {
            "collection": self.scope.collection,
            "phase": self.scope.phase,
            "handler": self.scope.handler,
            "by": self.by,
            "at": self.at.isoformat() if self.at is not None else None,
            "why": self.why,
        }


MAX_PAUSES = 10_000
"""Pauses read at most: a runaway writer of that collection costs a bounded read."""


def read_all(docs: Iterable[Mapping[str, Any]]) -> list[Pause]:
    """The pauses among ``docs``, sorted by scope."""
    found = (Pause.read(doc) for doc in docs)
    return sorted((p for p in found if p is not None), key=lambda p: p.scope.key)


def paused(pauses: Iterable[Pause], handlers: Iterable[Handler]) -> frozenset[str]:
    """The keys of the ``handlers`` some pause covers."""
    scopes = [p.scope for p in pauses]
    return frozenset(h.key for h in handlers if any(s.covers(h) for s in scopes))


__all__ = ["Pause", "Scope", "paused", "read_all"]
