"""Trees and events: documents that own children and wait for them, and signals that wake a
waiting document. What is stored, and what a wait decides, with no I/O.

A child carries its owner (``OWNER_FIELD``: the parent's collection, ``_id`` and the name
its step gave it), so a retried step finds the child it made rather than making another
(its ``_id`` derives from the parent and that name unless the document gives one). A
waiting document is relocked with its condition stored (``WAIT_FIELD``); the write that
could end the wait (a child's last step, a signal) makes it due at once when no step
holds it, and every wait is judged again when it is claimed, after it is written, and at
least every ``Settings.lock_timeout`` (a replica that died between a child's write and the
parent's wake loses nothing). A signal is stored in the document's bounded inbox
(``SIGNALS_FIELD``, oldest dropped, counted by ``SENT_FIELD``) whether or not anything
waits for it: a signal sent before the wait is found by it.
"""

from __future__ import annotations

import math
import secrets
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from enum import StrEnum
from typing import Any

from orchestrator.core.clock import bson_time
from orchestrator.core.errors import ConfigError

__all__ = [
    "MAX_SIGNALS",
    "OWNER_FIELD",
    "OWNS_FIELD",
    "PROGRESS_FIELD",
    "SENT_FIELD",
    "SIGNALS_FIELD",
    "TAKEN_FIELD",
    "WAIT_FIELD",
    "Delivered",
    "Need",
    "Owner",
    "Signal",
    "Tally",
    "Verdict",
    "Wait",
    "WaitKind",
    "changed_from_outside",
    "check_signal_name",
    "child_id",
    "judge",
    "new_wait",
    "owns_of",
    "signals_of",
]

OWNER_FIELD = "orchestratorOwner"
"""On a child: ``{collection, id, name}`` of the document that owns it."""
OWNS_FIELD = "orchestratorOwns"
"""On a parent: the collections its children are in (where a wait counts them)."""
WAIT_FIELD = "orchestratorWait"
"""On a waiting document: what it waits for (``Wait.stored``); absent or null: nothing."""
SIGNALS_FIELD = "orchestratorSignals"
"""A document's inbox: the latest ``MAX_SIGNALS`` signals sent to it, oldest first."""
SENT_FIELD = "orchestratorSignalsSent"
"""How many signals were ever sent to it (those past the inbox's bound were dropped)."""
TAKEN_FIELD = "orchestratorSignalsTaken"
"""The ids of the inbox's signals a wait ended on: a later wait for the same name waits
for a new one."""
PROGRESS_FIELD = "orchestratorProgress"
"""A running step's progress (``lease.progress``): ``{fraction, note, phase, at}``."""
MAX_NOTE = 500
MAX_SIGNALS = 20
MAX_NAME = 200


class WaitKind(StrEnum):
    SIGNAL = "signal"
    CHILDREN = "children"


class Need(StrEnum):
    """How many children must end for a wait on them to end: all, or any one (an int
    stored instead: that many)."""

    ALL = "all"
    ANY = "any"


class Verdict(StrEnum):
    """What a wait judged now comes to."""

    WAITING = "waiting"
    MET = "met"
    """Its condition holds: on to its ``then`` phase."""
    FAILED = "failed"
    """A child failed and the wait says where that goes (``on_failure``)."""
    TIMED_OUT = "timed_out"


@dataclass(frozen=True)
class Owner:
    collection: str
    id: Any
    name: str

    def stored(self) -> dict[str, Any]:
        return {"collection": self.collection, "id": self.id, "name": self.name}

    @staticmethod
    def read(value: Any) -> Owner | None:
        """The owner a child stores, or None for anything else."""
        if not isinstance(value, Mapping):
            return None
        collection, name = value.get("collection"), value.get("name")
        if not isinstance(collection, str) or not isinstance(name, str) or "id" not in value:
            return None
        return Owner(collection, value["id"], name)


@dataclass(frozen=True)
class Wait:
    """A stored wait: for a signal ``name``, or for children (``need``: all, any, or a
    number; ``on_failure``: the phase a child's failure sends the parent to, None: a
    failed child counts as ended; ``cancel_siblings``: the other children are cancelled
    then). ``then``: the phase once it is met; ``deadline`` and ``on_timeout``: when it
    gives up, and where to (None: the handler's failed phase)."""

    kind: WaitKind
    then: str
    since: datetime
    name: str | None = None
    need: Need | int = Need.ALL
    on_failure: str | None = None
    cancel_siblings: bool = False
    deadline: datetime | None = None
    on_timeout: str | None = None

    def stored(self) -> dict[str, Any]:
        need = self.need.value if isinstance(self.need, Need) else self.need
        return {
            "kind": self.kind.value,
            "then": self.then,
            "since": bson_time(self.since),
            "name": self.name,
            "need": need,
            "onFailure": self.on_failure,
            "cancelSiblings": self.cancel_siblings,
            "deadline": None if self.deadline is None else bson_time(self.deadline),
            "onTimeout": self.on_timeout,
        }

    @staticmethod
    def read(value: Any) -> Wait | None:
        """The wait a document stores; None when it stores none. Garbage raises
        ``ConfigError`` (the step records it as a failure: an operator wrote it)."""
        if value is None:
            return None
        if not isinstance(value, Mapping):
            raise ConfigError(f"{WAIT_FIELD} holds {type(value).__name__}, not a wait")
        try:
            kind = WaitKind(str(value.get("kind")))
        except ValueError:
            raise ConfigError(f"{WAIT_FIELD}.kind is {value.get('kind')!r}") from None
        then, since = value.get("then"), value.get("since")
        if not isinstance(then, str) or not then or not isinstance(since, datetime):
            raise ConfigError(f"{WAIT_FIELD} has no phase to go on to, or no start")
        name = value.get("name")
        if kind is WaitKind.SIGNAL and not isinstance(name, str):
            raise ConfigError(f"{WAIT_FIELD} waits for a signal with no name")
        deadline = value.get("deadline")
        return Wait(
            kind=kind,
            then=then,
            since=_aware(since),
            name=name if isinstance(name, str) else None,
            need=_need(value.get("need")),
            on_failure=_phase_or_none(value.get("onFailure")),
            cancel_siblings=value.get("cancelSiblings") is True,
            deadline=_aware(deadline) if isinstance(deadline, datetime) else None,
            on_timeout=_phase_or_none(value.get("onTimeout")),
        )


@dataclass(frozen=True)
class Signal:
    id: str
    name: str
    payload: Any
    at: datetime | None

    @staticmethod
    def new(name: str, payload: Any, at: datetime) -> Signal:
        return Signal(secrets.token_hex(8), name, payload, at)

    def stored(self) -> dict[str, Any]:
        at = None if self.at is None else bson_time(self.at)
        return {"id": self.id, "name": self.name, "payload": self.payload, "at": at}


@dataclass(frozen=True)
class Delivered:
    """A signal sent: its id, and whether it woke the document (it waited for it)."""

    id: str
    woke: bool


@dataclass(frozen=True)
class Tally:
    """A parent's children as a wait counts them: how many, how many ended (in a phase no
    handler claims, or deleted), of those how many failed; ``ended_keys`` and
    ``failed_keys`` name them (``child_key``)."""

    total: int
    ended: int
    failed: int
    ended_keys: tuple[str, ...] = ()
    failed_keys: tuple[str, ...] = ()


ENDED_KEY = "ended"
"""In a stored children wait: the keys of the children known to have ended (each child's
end adds its own, the judgement after the wait is written adds those it counted)."""
FAILED_KEY = "failed"
TOTAL_KEY = "total"
"""In a stored children wait: how many children the judgement after its write counted."""


def child_key(collection: str, child_id: Any) -> str:
    """A child as a parent's wait names it."""
    return f"{collection}/{child_id}"


def may_end(stored: Any) -> bool:
    """Whether a stored children wait, with the ends added to it so far, may be over:
    worth waking its document to judge it (a judgement that finds it is not wakes none).
    Until the judgement after its write has counted the children (``TOTAL_KEY``), the
    judgement decides, not the children's ends."""
    if not isinstance(stored, Mapping):
        return False
    try:
        wait = Wait.read(stored)
    except ConfigError:
        return True  # garbage: the judgement records it
    if wait is None or wait.kind is not WaitKind.CHILDREN:
        return False
    ended, failed, total = stored.get(ENDED_KEY), stored.get(FAILED_KEY), stored.get(TOTAL_KEY)
    if failed and wait.on_failure is not None:
        return True
    if not isinstance(total, int) or isinstance(total, bool):
        return False
    count = len(ended) if isinstance(ended, list) else 0
    return _enough(wait.need, Tally(total, min(count, total), 0))


def signals_of(doc: Mapping[str, Any]) -> list[Signal]:
    """The inbox a document stores, read leniently (entries that are no signal skipped)."""
    raw = doc.get(SIGNALS_FIELD)
    found = []
    for entry in raw if isinstance(raw, list) else []:
        if isinstance(entry, Mapping) and isinstance(entry.get("name"), str):
            at = entry.get("at")
            found.append(
                Signal(
                    str(entry.get("id")),
                    entry["name"],
                    entry.get("payload"),
                    _aware(at) if isinstance(at, datetime) else None,
                )
            )
    return found


def taken_of(doc: Mapping[str, Any]) -> list[str]:
    raw = doc.get(TAKEN_FIELD)
    return [t for t in raw if isinstance(t, str)] if isinstance(raw, list) else []


def judge(
    wait: Wait,
    now: datetime,
    *,
    signals: Sequence[Signal] = (),
    taken: Sequence[str] = (),
    tally: Tally | None = None,
) -> tuple[Verdict, Signal | None]:
    """What ``wait`` comes to at ``now``: for a signal wait, the first signal of its name
    not taken by an earlier wait; for children, ``tally``. A condition met wins over a
    deadline passed at the same look."""
    if wait.kind is WaitKind.SIGNAL:
        for signal in signals:
            if signal.name == wait.name and signal.id not in taken:
                return Verdict.MET, signal
    elif tally is not None:
        if tally.failed and wait.on_failure is not None:
            return Verdict.FAILED, None
        if _enough(wait.need, tally):
            return Verdict.MET, None
    if wait.deadline is not None and now >= wait.deadline:
        return Verdict.TIMED_OUT, None
    return Verdict.WAITING, None


def _enough(need: Need | int, tally: Tally) -> bool:
    if need is Need.ALL:
        return tally.ended >= tally.total
    if need is Need.ANY:
        return tally.ended >= 1 or tally.total == 0
    return tally.ended >= min(need, tally.total)


def child_id(parent_collection: str, parent_id: Any, name: str) -> str:
    """The ``_id`` of a parent's child named ``name`` (when its document gives none): the
    same on every retry of the step, on every replica."""
    return f"{parent_collection}/{parent_id}/{name}"


def check_signal_name(name: Any) -> str:
    return _named(name, "a signal's")


def check_child_name(name: Any) -> str:
    return _named(name, "a child's")


def _named(name: Any, whose: str) -> str:
    if not isinstance(name, str) or not name or len(name) > MAX_NAME:
        raise ConfigError(f"{whose} name is a non-empty string of at most {MAX_NAME} characters")
    return name


def owns_of(doc: Mapping[str, Any], made: Sequence[str] = ()) -> list[str]:
    """The collections a document's children are in: those it stores (anything else
    there skipped), then ``made`` (those its running step made children in), once each."""
    stored = doc.get(OWNS_FIELD)
    owns = [c for c in stored if isinstance(c, str) and c] if isinstance(stored, list) else []
    return list(dict.fromkeys([*owns, *made]))


def check_need(need: Any) -> Need | int:
    if isinstance(need, bool):
        raise ConfigError(f"need is 'all', 'any' or a number of children, not {need!r}")
    if isinstance(need, int) and need >= 1:
        return need
    try:
        return Need(need)
    except ValueError:
        raise ConfigError(f"need is 'all', 'any' or a number of children, not {need!r}") from None


def progress_record(fraction: Any, note: Any, phase: str | None, at: datetime) -> dict[str, Any]:
    """What ``lease.progress`` stores, checked: a fraction in [0, 1], a note of at most
    ``MAX_NOTE`` characters or None."""
    if isinstance(fraction, bool) or not isinstance(fraction, int | float):
        raise ConfigError(f"progress is a fraction from 0 to 1, not {fraction!r}")
    if not math.isfinite(fraction) or not 0 <= fraction <= 1:
        raise ConfigError(f"progress is a fraction from 0 to 1, not {fraction!r}")
    if note is not None and (not isinstance(note, str) or len(note) > MAX_NOTE):
        raise ConfigError(f"a progress note is a string of at most {MAX_NOTE} characters")
    return {"fraction": float(fraction), "note": note, "phase": phase, "at": bson_time(at)}


def changed_from_outside(doc: Mapping[str, Any] | None) -> bool:
    """Whether a running step's document, as read now, was moved or deleted by someone
    other than a replica (an operator's cancel, retry or unlock takes the lease and leaves
    none; another replica's claim after the lease expired leaves its own)."""
    return doc is None or "lockToken" not in doc


def new_wait(  # noqa: PLR0913  the keywords of the lease's two waits
    kind: WaitKind,
    now: datetime,
    *,
    then: str,
    name: str | None,
    need: Any,
    on_failure: str | None,
    cancel_siblings: Any,
    timeout: Any,
    on_timeout: str | None,
) -> Wait:
    """A wait asked for at ``now``, its values checked (its phases are the lease's to
    check: what its handler may advance to)."""
    if not isinstance(cancel_siblings, bool):
        raise ConfigError(f"cancel_siblings is True or False, not {cancel_siblings!r}")
    seconds = check_timeout(timeout)
    return Wait(
        kind=kind,
        then=then,
        since=now,
        name=None if name is None else check_signal_name(name),
        need=check_need(need),
        on_failure=on_failure,
        cancel_siblings=cancel_siblings,
        deadline=None if seconds is None else now + timedelta(seconds=seconds),
        on_timeout=on_timeout,
    )


def check_timeout(timeout: Any) -> float | None:
    if timeout is None:
        return None
    if isinstance(timeout, timedelta):
        timeout = timeout.total_seconds()
    if isinstance(timeout, bool) or not isinstance(timeout, int | float):
        raise ConfigError(f"timeout is seconds or a timedelta, not {timeout!r}")
    if not math.isfinite(timeout) or timeout <= 0:
        raise ConfigError(f"timeout is a positive number of seconds, not {timeout!r}")
    return float(timeout)


def _need(value: Any) -> Need | int:
    try:
        return check_need(value)
    except ConfigError:
        return Need.ALL


def _phase_or_none(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None


def _aware(value: datetime) -> datetime:
    return value if value.tzinfo is not None else value.replace(tzinfo=UTC)
