"""A document's place in a tree, as operators read it, without I/O: its parent, its
children (each with its phase and whether it ended), what it waits for (with the
children's counts), and its inbox of signals.

Every stored field may hold anything (a hand edit, an old version): the parent reads as
unreadable rather than absent when the field is set but is no owner, a wait that is no
wait reads as an unreadable wait (with why), an inbox entry that is no signal is skipped
and a count that is no number is unknown. Nothing here raises on a stored value.

A child has ended when no live replica handles its phase (as the engine judges it, with
its own handlers: ``steps.could_take``): the operator's tools know the handlers the live
replicas publish, so where none publishes a handler for the child's collection whether it
ended is not known (``None``), never guessed.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from bson import json_util
from bson.errors import BSONError
from bson.json_util import RELAXED_JSON_OPTIONS

from orchestrator.core.documents import id_json_or_text
from orchestrator.core.errors import ConfigError
from orchestrator.core.redact import redact
from orchestrator.core.replicas import ReplicaRecord, handled_phases, resting_phases
from orchestrator.core.trees import (
    OWNER_FIELD,
    PROGRESS_FIELD,
    SENT_FIELD,
    WAIT_FIELD,
    Need,
    Owner,
    Wait,
    WaitKind,
    signals_of,
    taken_of,
)

__all__ = [
    "CHILDREN_SHOWN",
    "OWNS_READ",
    "PAYLOAD_SHOWN",
    "ChildRow",
    "Counted",
    "Inbox",
    "Judge",
    "ParentRef",
    "SignalRow",
    "Tree",
    "Waiting",
    "parent_of",
    "wait_line",
]

CHILDREN_SHOWN = 50
"""Children listed per owned collection (the counts cover them all)."""
OWNS_READ = 10
"""Owned collections looked in at most (a parent owning more says so)."""
PAYLOAD_SHOWN = 120
"""Characters of a signal's payload shown (as relaxed Extended JSON, redacted)."""


def _iso(value: datetime | None) -> str | None:
    return None if value is None else value.isoformat()


def _time(value: datetime) -> str:
    at = value if value.tzinfo else value.replace(tzinfo=UTC)
    return f"{at.astimezone(UTC):%Y-%m-%d %H:%M:%S} UTC"


def _text(value: Any) -> str:
    return value if isinstance(value, str) else str(value)


@dataclass(frozen=True)
class ParentRef:
    """The document that owns this one: its collection, id (as text, and as Extended JSON
    for a link: ``ref``), and the name its step gave this child."""

    collection: str
    id: str
    ref: str
    name: str

    def to_dict(self) -> dict[str, Any]:
        return {"collection": self.collection, "id": self.id, "ref": self.ref, "name": self.name}


def parent_of(doc: Mapping[str, Any]) -> tuple[ParentRef | None, bool]:
    """``doc``'s parent, and whether its owner field is set but unreadable."""
    raw = doc.get(OWNER_FIELD)
    owner = Owner.read(raw)
    if owner is None:
        return None, raw is not None
    ref = id_json_or_text(owner.id)
    return ParentRef(owner.collection, _text(owner.id), ref, owner.name), False


class Judge:
    """Whether a child's phase ended, by the handlers the live replicas publish."""

    def __init__(self, live: Sequence[ReplicaRecord]) -> None:
        self._live = list(live)
        self._handled: dict[str, tuple[set[str], bool, bool]] = {}

    def ended(self, collection: str, phase: Any) -> bool | None:
        """True: no live replica handles ``phase`` (or it is no phase); None: no live
        replica handles ``collection`` at all (so it cannot be told)."""
        handled, any_phase, known = self._of(collection)
        if not isinstance(phase, str):
            return True
        if not known:
            return None
        return not any_phase and phase not in handled

    def failed(self, collection: str, phase: Any) -> bool:
        """``phase`` is a handler's failed phase or the cancelled phase."""
        return isinstance(phase, str) and phase in resting_phases(self._live, collection)

    def _of(self, collection: str) -> tuple[set[str], bool, bool]:
        if collection not in self._handled:
            handled, any_phase = handled_phases(self._live, collection)
            self._handled[collection] = (handled, any_phase, bool(handled) or any_phase)
        return self._handled[collection]


@dataclass(frozen=True)
class ChildRow:
    """A child as the parent's page lists it: ``ended`` None when no live replica handles
    its collection (it cannot be told)."""

    collection: str
    id: str
    ref: str
    name: str | None
    phase: str | None
    ended: bool | None
    failed: bool

    @classmethod
    def read(cls, collection: str, doc: Mapping[str, Any], judge: Judge) -> ChildRow:
        owner = Owner.read(doc.get(OWNER_FIELD))
        phase = doc.get("phase")
        return cls(
            collection=collection,
            id=_text(doc.get("_id")),
            ref=id_json_or_text(doc.get("_id")),
            name=owner.name if owner is not None else None,
            phase=None if phase is None else _text(phase),
            ended=judge.ended(collection, phase),
            failed=judge.failed(collection, phase),
        )

    def to_dict(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in self.__dataclass_fields__}


@dataclass(frozen=True)
class Counted:
    """A parent's children over the collections looked in: how many, how many ended and
    failed (None: not known, some collection has no live handler); ``cut``: collections
    it owns that were not looked in (past ``OWNS_READ``)."""

    total: int
    ended: int | None
    failed: int | None
    cut: tuple[str, ...] = ()

    @classmethod
    def of(
        cls, phases: Iterable[tuple[str, Any, int]], judge: Judge, cut: Sequence[str] = ()
    ) -> Counted:
        """From (collection, phase, count) rows."""
        total = ended = failed = 0
        known = True
        for collection, phase, count in phases:
            total += count
            over = judge.ended(collection, phase)
            if over is None:
                known = False
            elif over:
                ended += count
                failed += count if judge.failed(collection, phase) else 0
        return cls(total, ended if known else None, failed if known else None, tuple(cut))

    def words(self) -> str:
        if self.ended is None:
            said = f"{self.total} children, which ended not known (no live replica handles them)"
        else:
            said = f"{self.ended} of {self.total} ended"
            if self.failed:
                said += f", {self.failed} failed"
        if self.cut:
            said += f"; not counted in {', '.join(self.cut)}"
        return said

    def to_dict(self) -> dict[str, Any]:
        return {
            "total": self.total,
            "ended": self.ended,
            "failed": self.failed,
            "not_counted_in": list(self.cut),
        }


@dataclass(frozen=True)
class Waiting:
    """What a document waits for: its ``wait`` (None with ``unreadable``: why it is no
    wait), and, for children, their ``counted`` numbers (None in a list: not read)."""

    wait: Wait | None
    unreadable: str | None = None
    counted: Counted | None = None

    @classmethod
    def of(cls, doc: Mapping[str, Any], counted: Counted | None = None) -> Waiting | None:
        """``doc``'s wait; None when it waits for nothing."""
        try:
            wait = Wait.read(doc.get(WAIT_FIELD))
        except ConfigError as exc:
            return cls(None, unreadable=str(exc))
        return None if wait is None else cls(wait, counted=counted)

    def words(self) -> str:
        """``waiting for signal 'dns-verified' since ..., until ... then → Validating``."""
        wait = self.wait
        if wait is None:
            return f"unreadable wait: {self.unreadable}"
        if wait.kind is WaitKind.SIGNAL:
            what = f"signal {wait.name!r}"
        else:
            need = wait.need.value if isinstance(wait.need, Need) else f"{wait.need}"
            what = f"children ({need}" + (
                f"; {self.counted.words()})" if self.counted is not None else ")"
            )
        said = f"waiting for {what} since {_time(wait.since)}"
        if wait.deadline is not None:
            said += f", until {_time(wait.deadline)}"
        said += f" then → {wait.then}"
        if wait.deadline is not None:
            said += f" (timed out → {wait.on_timeout or 'the failed phase'})"
        if wait.on_failure is not None:
            said += f" (a failed child → {wait.on_failure}"
            said += ", the others cancelled)" if wait.cancel_siblings else ")"
        return said

    def to_dict(self) -> dict[str, Any]:
        wait = self.wait
        data: dict[str, Any] = {"words": self.words(), "unreadable": self.unreadable}
        if wait is not None:
            data |= {
                "kind": wait.kind.value,
                "name": wait.name,
                "then": wait.then,
                "since": _iso(wait.since),
                "deadline": _iso(wait.deadline),
                "on_timeout": wait.on_timeout,
                "need": wait.need.value if isinstance(wait.need, Need) else wait.need,
                "on_failure": wait.on_failure,
                "cancel_siblings": wait.cancel_siblings,
            }
        data["children"] = None if self.counted is None else self.counted.to_dict()
        return data


def progress_line(doc: Mapping[str, Any]) -> str | None:
    """A step's progress as it stored it (``lease.progress``), in a line: its fraction,
    note, and the phase it was written in (one since left reads as such); None: none, or
    nothing readable."""
    stored = doc.get(PROGRESS_FIELD)
    if not isinstance(stored, Mapping):
        return None
    fraction = stored.get("fraction")
    if isinstance(fraction, bool) or not isinstance(fraction, int | float):
        return None
    if not 0 <= fraction <= 1:  # also NaN
        return None
    line = f"progress {fraction:.0%}"
    note = stored.get("note")
    if isinstance(note, str) and note:
        line += f": {redact(note)[:120]}"
    phase = stored.get("phase")
    if isinstance(phase, str) and phase != doc.get("phase"):
        line += f" (in {phase}, since left)"
    return line


def wait_line(doc: Mapping[str, Any]) -> str | None:
    """What ``doc`` waits for, in a line of a list (no children counted); None: nothing."""
    waiting = Waiting.of(doc)
    return None if waiting is None else waiting.words()


@dataclass(frozen=True)
class SignalRow:
    """A signal of the inbox: its payload as shortened, redacted text; ``taken``: a wait
    ended on it."""

    id: str
    name: str
    at: datetime | None
    payload: str
    taken: bool

    def to_dict(self) -> dict[str, Any]:
        return {**{n: getattr(self, n) for n in self.__dataclass_fields__}, "at": _iso(self.at)}


@dataclass(frozen=True)
class Inbox:
    """A document's latest signals, newest first; ``sent``: how many were ever sent (None:
    the count is unreadable), ``dropped``: those no longer in the inbox; ``taken``: the
    ids a wait ended on."""

    signals: list[SignalRow]
    sent: int | None
    taken: list[str]

    @classmethod
    def of(cls, doc: Mapping[str, Any]) -> Inbox:
        taken = taken_of(doc)
        rows = [
            SignalRow(s.id, s.name, s.at, shown_payload(s.payload), s.id in taken)
            for s in signals_of(doc)
        ]
        raw = doc.get(SENT_FIELD)
        sent = raw if isinstance(raw, int) and not isinstance(raw, bool) else None
        if raw is None and not rows:
            sent = 0
        return cls(list(reversed(rows)), sent, taken)

    @property
    def dropped(self) -> int | None:
        return None if self.sent is None else max(self.sent - len(self.signals), 0)

    def words(self) -> str:
        sent = "an unreadable count of" if self.sent is None else str(self.sent)
        said = f"{sent} signals sent, {len(self.signals)} kept"
        if self.dropped:
            said += f", {self.dropped} dropped (the inbox keeps the latest)"
        return said

    def to_dict(self) -> dict[str, Any]:
        return {
            "signals": [s.to_dict() for s in self.signals],
            "sent": self.sent,
            "dropped": self.dropped,
            "taken": self.taken,
            "words": self.words(),
        }


def shown_payload(payload: Any) -> str:
    """A payload as a line shows it: relaxed Extended JSON, credentials redacted, cut to
    ``PAYLOAD_SHOWN`` characters."""
    if payload is None:
        return ""
    try:
        text = json_util.dumps(payload, ensure_ascii=False, json_options=RELAXED_JSON_OPTIONS)
    except (TypeError, ValueError, BSONError):
        text = repr(payload)
    text = redact(text)
    if len(text) > PAYLOAD_SHOWN:
        text = text[: PAYLOAD_SHOWN - 1] + "…"
    return text


@dataclass(frozen=True)
class Tree:
    """A document's place in its tree: ``parent`` (``parent_unreadable``: its owner field
    holds something that is no owner), ``owns`` (the collections its children are in),
    ``children`` (up to ``CHILDREN_SHOWN`` per collection; ``cut``: those collections that
    hold more), ``counted`` (all of them), ``waiting`` and ``inbox``."""

    parent: ParentRef | None
    parent_unreadable: bool
    owns: list[str]
    children: list[ChildRow]
    counted: Counted
    waiting: Waiting | None
    inbox: Inbox
    cut: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {
            "parent": None if self.parent is None else self.parent.to_dict(),
            "parent_unreadable": self.parent_unreadable,
            "owns": self.owns,
            "children": [child.to_dict() for child in self.children],
            "children_counted": self.counted.to_dict(),
            "children_cut_in": self.cut,
            "waiting": None if self.waiting is None else self.waiting.to_dict(),
            "inbox": self.inbox.to_dict(),
        }
