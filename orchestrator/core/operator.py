"""An operator's decisions, made once without I/O for every tool (the command line, the
page, ``orchestrator.operations``): which document an id names, where a retry sends a
document, and whether a replica holds it now.

An id typed as text may name two documents (the string ``"42"`` and the integer ``42``);
its canonical Extended JSON (``id_json``) names exactly one, whatever its type, so it
round-trips through a link, a form or a command line to the very same id.
"""

from __future__ import annotations

import getpass
import socket
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum
from typing import Any, TypeVar

from bson import json_util
from bson.errors import BSONError
from bson.json_util import CANONICAL_JSON_OPTIONS

from orchestrator.core import history, replicas
from orchestrator.core.browse import Filter, Row
from orchestrator.core.clock import as_utc
from orchestrator.core.errors import OperatorError, UnhandledPhase
from orchestrator.core.in_house import NO_IN_HOUSE, InHouse
from orchestrator.core.replicas import ReplicaRecord

T = TypeVar("T", str, int)


@dataclass(frozen=True)
class Retried:
    """A retry done: ``document`` after it, sent from ``source`` to ``target``;
    ``at``: the time stamped as ``updatedAt``, the server's unless ``server_time`` is
    False (then this machine's); ``lease_taken``: a replica held it, and lost its lease."""

    document: dict[str, Any]
    source: Any
    target: str
    at: datetime
    server_time: bool
    lease_taken: bool


class Action(StrEnum):
    """What an operator does to documents."""

    RETRY = "retry"
    UNLOCK = "unlock"
    CANCEL = "cancel"


@dataclass
class Bulk:
    """What an action on every document of a filter did (or, ``dry_run``, would do):
    ``changed`` the documents' rows as they were; ``skipped`` those left alone, each with
    why (held by a live lease, no error phase to retry to, changed meanwhile);
    ``targets``: the phase each changed document was (or would be) sent to, by its row's
    ``ref`` (else ``id``): a retry without ``target`` sends each to its own error phase."""

    action: Action
    filter: Filter
    dry_run: bool
    target: str | None
    changed: list[Row] = field(default_factory=list)
    skipped: list[tuple[Row, str]] = field(default_factory=list)
    targets: dict[str, str] = field(default_factory=dict)

    def target_of(self, row: Row) -> str | None:
        """The phase ``row``'s document was (or would be) sent to."""
        return self.targets.get(row.ref or row.id)

    def to_dict(self) -> dict[str, Any]:
        return {
            "action": self.action.value,
            "filter": self.filter.describe(),
            "dry_run": self.dry_run,
            "target": self.target,
            "changed": [{**row.to_dict(), "to": self.target_of(row)} for row in self.changed],
            "skipped": [{**row.to_dict(), "why": why} for row, why in self.skipped],
        }


def error_phase(doc: Mapping[str, Any]) -> str | None:
    """The phase the document's last error happened in, where a retry sends it by default;
    once retried (its error kept as ``previousError``), that error's phase, so a retry
    that failed again before its first claim can be repeated as it was."""
    for name in ("lastError", "previousError"):
        error = doc.get(name)
        phase = error.get("phase") if isinstance(error, dict) else None
        if isinstance(phase, str) and phase:
            return phase
    return None


def check_target(
    collection: str, target: str, records: Sequence[ReplicaRecord], *, action: Action
) -> None:
    """Refuse a ``target`` phase no live replica handles (``UnhandledPhase``, naming those
    they do): a document sent there would sit unclaimed, looking like any other. A phase
    where replicas leave documents on purpose (a failed or the cancelled phase) is fine
    for a cancel, never for a retry (nothing would retry it). With no replica live,
    nothing can be judged: refused too (forcing is the operator's call)."""
    check_phase_name(target)
    handled, open_filter = replicas.handled_phases(records, collection)
    if target in handled or open_filter:
        return
    if action is Action.CANCEL and target in replicas.resting_phases(records, collection):
        return
    why = "no replica is live" if not records else "no handler of it, on any live replica"
    raise UnhandledPhase(collection, target, sorted(handled), why)


def cancelled_phase(records: Sequence[ReplicaRecord], default: str = "Cancelled") -> str:
    """Where a cancel sends documents: the live replicas' ``cancelled_phase`` (the most
    common, should they differ), else ``default``."""
    return _prevailing([r.cancelled_phase for r in records if r.cancelled_phase], default)


def history_length(records: Sequence[ReplicaRecord]) -> int:
    """How many history entries an operator's action keeps: the live replicas' ``history``
    setting (the most common, should they differ), else the default."""
    return _prevailing([r.history for r in records], history.DEFAULT_HISTORY)


def _prevailing(values: Sequence[T], default: T) -> T:
    """The most common of ``values`` (the least, in order, of those tied), or ``default``
    when there are none."""
    counts = Counter(values)
    return max(sorted(counts), key=lambda v: counts[v]) if counts else default


def default_actor() -> str:
    """Who acts from the command line: the operating system's user at this host."""
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = "unknown"
    return f"{user}@{socket.gethostname()}"


def live_lease(doc: Mapping[str, Any], now: datetime, in_house: InHouse = NO_IN_HOUSE) -> bool:
    """Whether a replica holds ``doc`` now: a lease token with a ``lockedUntil`` after
    ``now``, the server's time (as the status counts judge ``leased``), or, while
    migrating, an in-house pod's lease (``InHouse.holds``). An expired lease is no one's:
    its holder died or is stuck, and any replica may claim it."""
    if in_house.holds(doc, now):
        return True
    until = doc.get("lockedUntil")
    return doc.get("lockToken") is not None and isinstance(until, datetime) and as_utc(until) > now


def check_phase_name(target: str) -> None:
    """A retry's target is a phase name: not empty, and no update operator (``$set``)."""
    if not target or target.startswith("$"):
        raise OperatorError(f"{target!r} is not a phase name")


def id_json(doc_id: Any) -> str:
    """``doc_id`` as canonical Extended JSON: exact whatever its type (``42`` is
    ``{"$numberInt": "42"}``, the string ``"42"`` is ``"42"``)."""
    return json_util.dumps(doc_id, json_options=CANONICAL_JSON_OPTIONS)


def id_json_or_text(doc_id: Any) -> str:
    """``id_json``, or the id as text when it has no Extended JSON form."""
    try:
        return id_json(doc_id)
    except (TypeError, ValueError, BSONError):
        return str(doc_id)


def parse_id_json(text: str) -> Any:
    """An id given as Extended JSON (``id_json``'s form; plain JSON too): ``OperatorError``
    when it is not."""
    try:
        return json_util.loads(text, json_options=CANONICAL_JSON_OPTIONS)
    except (ValueError, TypeError, BSONError) as exc:
        raise OperatorError(f"malformed Extended JSON id {text!r}: {exc}") from None


__all__ = [
    "Action",
    "Bulk",
    "Retried",
    "cancelled_phase",
    "check_phase_name",
    "check_target",
    "default_actor",
    "error_phase",
    "history_length",
    "id_json",
    "id_json_or_text",
    "live_lease",
    "parse_id_json",
]
