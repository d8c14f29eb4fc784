"""An operator's rules, decided once without I/O for every tool (the command line, the
page, ``AsyncOperations``/``Operations``): which actions there are, where a retry or a
cancel sends a document, which phases may receive it, which are done with, what a cancel
does to the documents a document owns, and who holds it now.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import Any, TypeVar

from orchestrator.core import history, replicas
from orchestrator.core.clock import as_utc
from orchestrator.core.errors import OperatorError, Refusal, UnhandledPhase, UnhandledScope
from orchestrator.core.in_house import IN_HOUSE_HOLDER, NO_IN_HOUSE, InHouse
from orchestrator.core.pauses import Scope
from orchestrator.core.replicas import ReplicaRecord

T = TypeVar("T", str, int)


class Action(StrEnum):
    """What an operator does to documents."""

    RETRY = "retry"
    UNLOCK = "unlock"
    CANCEL = "cancel"


class Children(StrEnum):
    """What a cancel does to the documents the cancelled one owns (its children, theirs,
    and so on): ``CANCEL`` them too, those not done with; ``ABANDON`` them, left as they
    are."""

    CANCEL = "cancel"
    ABANDON = "abandon"


def check_children(policy: Any) -> Children:
    """``policy`` as a ``Children``; ``OperatorError`` for anything else."""
    try:
        return Children(policy)
    except ValueError:
        raise OperatorError(f"children is 'cancel' or 'abandon', not {policy!r}") from None


@dataclass(frozen=True)
class Signed:
    """Who acts (``by``) and why: written in the document's history and the audit trail
    with the action, so a later reader knows who moved it."""

    by: str
    why: str = ""


@dataclass(frozen=True)
class Live:
    """The live replicas (``records``) as an operator's write keeps to them: the history
    length they keep (``keep``, ``history_length``) and the in-house leases they honour
    (``in_house``, ``InHouse.honoured_by``); judged once per action."""

    records: list[ReplicaRecord]
    keep: int
    in_house: InHouse

    @classmethod
    def of(cls, records: list[ReplicaRecord]) -> Live:
        return cls(records, history_length(records), InHouse.honoured_by(records))


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


def check_scope(scope: Scope, records: Sequence[ReplicaRecord]) -> None:
    """Refuse a pause of what no live replica has (``UnhandledScope``, naming what they
    do have): a collection none of their handlers works on, a phase none takes by name,
    a handler none runs there (or not of that phase). Such a pause covers nothing now, and
    is most likely a typo that would look done. With no replica live, nothing can be
    judged: refused too (forcing is the operator's call, as for ``check_target``)."""
    if not records:
        # Nothing to compare against: no "they have" list to offer.
        raise UnhandledScope(scope.describe(), "nothing takes it", None, "no replica is live")
    why = "on any live replica"
    handlers = [h for r in records for h in r.handlers if h.collection == scope.collection]
    if not handlers:
        known = sorted({h.collection for r in records for h in r.handlers})
        unknown = f"no handler works on collection {scope.collection!r}"
        raise UnhandledScope(scope.describe(), unknown, known, why)
    if scope.phase is not None and scope.phase not in {h.phase for h in handlers}:
        known = sorted({h.phase for h in handlers if h.phase is not None})
        unknown = f"no handler takes phase {scope.phase!r} of {scope.collection!r}"
        raise UnhandledScope(scope.describe(), unknown, known, why)
    names = {h.name for h in handlers if scope.phase in (None, h.phase)}
    if scope.handler is not None and scope.handler not in names:
        where = f"phase {scope.phase!r} of " if scope.phase is not None else ""
        unknown = f"no handler {scope.handler!r} runs on {where}{scope.collection!r}"
        raise UnhandledScope(scope.describe(), unknown, sorted(names), why)


def audit_keys(typed: str, declared: Iterable[tuple[str, ...]]) -> list[str]:
    """The business keys (``FIELD=VALUE``, as the audit trail records them) a search of
    it for ``typed`` looks for: as typed when it names its field (``number=INV-1003``);
    else ``typed`` as the value of each one-field key ``declared`` (the unique keys of the
    collections the live replicas work on). ``OperatorError`` when it names no field and
    none is declared."""
    typed = typed.strip()
    if not typed:
        raise OperatorError("a business key is FIELD=VALUE, or a value of the one-field key")
    if "=" in typed:
        field, _, value = typed.partition("=")
        return [f"{field.strip()}={value.strip()}"]
    fields = sorted({keys[0] for keys in declared if len(keys) == 1})
    if not fields:
        raise OperatorError(
            f"no collection the live replicas work on has a one-field business key to read"
            f" {typed!r} as: give FIELD=VALUE",
            refusal=Refusal.NO_UNIQUE_KEY,
        )
    return [f"{field}={typed}" for field in fields]


def done_with(records: Sequence[ReplicaRecord], collection: str, phase: Any) -> bool:
    """Whether a document of ``collection`` in ``phase`` is done with, as the ``records``
    of the live replicas say: no handler of theirs takes that phase, by its name or by a
    filter that may take any (unless it is a phase they leave documents in on purpose: a
    failed or the cancelled phase). With no replica live, every phase is: nothing would
    take it up."""
    if not isinstance(phase, str):
        return True
    handled, open_filter = replicas.handled_phases(records, collection)
    if phase in handled:
        return False
    return not open_filter or phase in replicas.resting_phases(records, collection)


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


def live_lease(doc: Mapping[str, Any], now: datetime, in_house: InHouse = NO_IN_HOUSE) -> bool:
    """Whether a replica holds ``doc`` now: a lease token with a ``lockedUntil`` after
    ``now``, the server's time (as the status counts judge ``leased``), or, while
    migrating, an in-house pod's lease (``InHouse.holds``). An expired lease is no one's:
    its holder died or is stuck, and any replica may claim it."""
    if in_house.holds(doc, now):
        return True
    until = doc.get("lockedUntil")
    return doc.get("lockToken") is not None and isinstance(until, datetime) and as_utc(until) > now


@dataclass(frozen=True)
class Holding:
    """Who holds a document's lease and until when, as every tool names it: a replica by
    its ``lockedBy`` and ``lockedUntil`` as stored (whatever they hold, None when absent),
    or, while migrating, an in-house pod (``IN_HOUSE_HOLDER``) until its ``lockedAt``
    runs out."""

    holder: Any
    until: Any


def holding(doc: Mapping[str, Any], now: datetime, in_house: InHouse = NO_IN_HOUSE) -> Holding:
    """``doc``'s lease as held at ``now``: an in-house pod's while it holds the document
    (``InHouse.holds``), else the fields the last replica to claim it wrote."""
    if in_house.holds(doc, now):
        return Holding(IN_HOUSE_HOLDER, in_house.expiry(doc["lockedAt"]))
    return Holding(doc.get("lockedBy"), doc.get("lockedUntil"))


def holder_name(holder: Any) -> str:
    """Who holds a lease, as a refusal names it: a replica by its id, or an in-house pod."""
    return IN_HOUSE_HOLDER if holder == IN_HOUSE_HOLDER else f"replica {holder!r}"


def check_phase_name(target: str) -> None:
    """A retry's target is a phase name: not empty, and no update operator (``$set``)."""
    if not target or target.startswith("$"):
        raise OperatorError(f"{target!r} is not a phase name")


__all__ = [
    "Action",
    "Children",
    "Holding",
    "Live",
    "Signed",
    "audit_keys",
    "cancelled_phase",
    "check_children",
    "check_phase_name",
    "check_scope",
    "check_target",
    "done_with",
    "error_phase",
    "history_length",
    "holder_name",
    "holding",
    "live_lease",
]
