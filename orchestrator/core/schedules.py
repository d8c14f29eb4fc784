"""Schedules: what one is (its spec), what its document holds, and what a fire does.

A schedule is a document of the schedules collection, ``_id`` its name, leased like any
other: its ``lockedUntil`` is its next fire (plus its jitter), so the tick's one probe
finds it due and one replica claims it, fenced. That step starts each due fire's document
with an ``_id`` made of the schedule's name and the fire time (``run_id``): a replica that
dies between the submit and its write leaves the next holder to submit the same ``_id``,
which finds the document there. So a fire time starts at most one document, whatever the
replicas, their crashes and their clocks (the server's decides).

Everything here is pure: the engine's schedule step (``runners``) reads, asks and writes.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from enum import StrEnum
from typing import Any

from pydantic import BaseModel

from orchestrator.core.errors import ConfigError
from orchestrator.core.fire_times import FireTimes, fire_times_of, fires_between

__all__ = [
    "SCHEDULED_FIELD",
    "SCHEDULE_PHASE",
    "Decision",
    "DuePlan",
    "FireResult",
    "Overlap",
    "Request",
    "ScheduleSpec",
    "ScheduleState",
    "Source",
    "Takeover",
    "decide",
    "due_plan",
    "jitter_of",
    "run_id",
]

SCHEDULE_PHASE = "Scheduled"
"""The phase of every schedule's document (its handler's; a failed one leaves it)."""
SCHEDULED_FIELD = "scheduled"
"""On each document a schedule started: ``{name, fire}``, what the overlap policy reads."""
MAX_FIRES_PER_STEP = 50
"""Fires one step starts at most; more due (a catch-up) go on in the next step, at once."""
MAX_MISSED_COUNTED = 100_000
"""Missed fires counted one by one at most (a long outage of a 1 s schedule)."""
MAX_BACKFILL = 1000
"""Fire times one backfill request may name."""
MAX_NAME = 200


class Overlap(StrEnum):
    """What a fire does while the schedule's previous runs are still in non-terminal
    phases (Temporal's policies): skip it, buffer one to start when they end, start it
    anyway, or cancel them and start it."""

    SKIP = "skip"
    BUFFER_ONE = "buffer_one"
    ALLOW_ALL = "allow_all"
    CANCEL_PREVIOUS = "cancel_previous"


class FireResult(StrEnum):
    """What became of one fire time."""

    STARTED = "started"
    REQUESTED = "requested"  # started at an operator's request (a trigger, a backfill)
    SKIPPED = "skipped"  # its overlap policy, a previous run still going
    BUFFERED = "buffered"  # waits for the previous run (buffer_one)
    DECLINED = "declined"  # the schedule's function returned None
    COALESCED = "coalesced"  # a later missed fire started in its place
    MISSED = "missed"  # outside the catch-up window
    FAILED = "failed"  # the function raised or returned what cannot be submitted


class Source(StrEnum):
    """Why a fire is before a step: its time came, it waited buffered, or an operator
    asked for it (a trigger, a backfill)."""

    DUE = "due"
    BUFFERED = "buffered"
    REQUESTED = "requested"


class Decision(StrEnum):
    START = "start"
    SKIP = "skip"
    BUFFER = "buffer"
    CANCEL_AND_START = "cancel_and_start"


@dataclass(frozen=True)
class ScheduleSpec:
    """A schedule as declared (``@orch.schedule``) and as stored: the collection its
    documents go to, its fire times, and its policies."""

    name: str
    collection: str
    times: FireTimes
    overlap: Overlap = Overlap.SKIP
    catch_up: float = 3600.0
    """Seconds: a missed fire younger than this starts late; an older one is recorded
    missed."""
    coalesce: bool = False
    """Missed fires inside the catch-up window start one document (the latest), not one
    each."""
    jitter: float = 0.0
    """Seconds: each fire starts up to this much late, by an offset every replica computes
    alike from the name and the fire time (a fleet of schedules on one minute spreads)."""

    def __post_init__(self) -> None:
        check_name(self.name)
        if not isinstance(self.overlap, Overlap):
            raise ConfigError(f"schedule {self.name!r}: unknown overlap {self.overlap!r}")
        for what, value in (("catch_up", self.catch_up), ("jitter", self.jitter)):
            if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
                raise ConfigError(f"schedule {self.name!r}: {what} must be seconds >= 0")
        if self.times.after(datetime.now(UTC)) is None:
            raise ConfigError(f"schedule {self.name!r}: {self.times.describe()} never fires")

    def stored(self) -> dict[str, Any]:
        return {
            **self.times.stored(),
            "collection": self.collection,
            "overlap": self.overlap.value,
            "catchUp": float(self.catch_up),
            "coalesce": self.coalesce,
            "jitter": float(self.jitter),
        }

    def describe(self) -> str:
        return self.times.describe()

    def same(self, stored: Any) -> bool:
        """Whether ``stored`` (a schedule document's spec) is this spec."""
        try:
            return spec_of(self.name, stored) == self
        except ConfigError:
            return False


def spec_of(name: str, stored: Any) -> ScheduleSpec:
    """The spec a schedule document stores; ``ConfigError`` for anything else."""
    if not isinstance(stored, Mapping):
        raise ConfigError(f"schedule {name!r}: its stored spec is not a document")
    collection = stored.get("collection")
    if not isinstance(collection, str) or not collection:
        raise ConfigError(f"schedule {name!r}: its stored spec names no collection")
    try:
        overlap = Overlap(stored.get("overlap", Overlap.SKIP.value))
    except ValueError:
        raise ConfigError(f"schedule {name!r}: unknown overlap {stored.get('overlap')!r}") from None
    coalesce = stored.get("coalesce", False)
    return ScheduleSpec(
        name=name,
        collection=collection,
        times=fire_times_of(stored),
        overlap=overlap,
        catch_up=_number(stored.get("catchUp", 3600.0), name, "catchUp"),
        coalesce=coalesce if isinstance(coalesce, bool) else False,
        jitter=_number(stored.get("jitter", 0.0), name, "jitter"),
    )


def check_name(name: Any) -> str:
    if (
        not isinstance(name, str)
        or not name
        or len(name) > MAX_NAME
        or name.startswith("$")
        or not name.isprintable()
    ):
        raise ConfigError(
            f"a schedule's name is printable text of 1 to {MAX_NAME} characters not starting"
            f" with '$', not {name!r}"
        )
    return name


def _number(value: Any, name: str, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
        raise ConfigError(f"schedule {name!r}: stored {what} {value!r} is not seconds >= 0")
    return float(value)


def run_id(name: str, fire: datetime) -> str:
    """The ``_id`` of the document ``name`` starts for ``fire``: the same on every replica
    and every retry, so one fire time makes one document."""
    at = fire.astimezone(UTC)
    millis = f".{at.microsecond // 1000:03d}" if at.microsecond else ""
    return f"{name}@{at:%Y-%m-%dT%H:%M:%S}{millis}Z"


def run_document(name: str, fire: datetime, value: object) -> dict[str, Any]:
    """The document a schedule's function returned for ``fire``, as it is submitted: its
    ``_id`` and ``scheduled`` fields are the schedule's. ``ConfigError`` for a value that is
    no document (a dict or a pydantic model) or sets either field otherwise."""
    if isinstance(value, BaseModel):
        value = value.model_dump(by_alias=True, exclude_unset=True)
    if not isinstance(value, Mapping):
        raise ConfigError(f"returned a {type(value).__name__}, not a document")
    rid = run_id(name, fire)
    if value.get("_id", rid) != rid or SCHEDULED_FIELD in value:
        raise ConfigError(
            f"its document sets _id or {SCHEDULED_FIELD!r}: both are the schedule's"
            f" ({rid!r}, {{name, fire}})"
        )
    return {**value, "_id": rid, SCHEDULED_FIELD: {"name": name, "fire": fire}}


def jitter_of(name: str, fire: datetime, jitter: float) -> timedelta:
    """How late ``fire`` starts: a fraction of ``jitter`` drawn from the name and the fire
    time, so every replica (and every retry) waits the same."""
    if jitter <= 0:
        return timedelta(0)
    digest = hashlib.sha256(f"{name}\x00{run_id(name, fire)}".encode()).digest()
    fraction = int.from_bytes(digest[:8], "big") / 2**64
    return timedelta(milliseconds=int(fraction * jitter * 1000))


@dataclass(frozen=True)
class Request:
    """An operator's request on a schedule: start one now (``trigger``: ``start`` is its
    fire time) or every fire time in [``start``, ``end``] (``backfill``)."""

    id: str
    kind: str
    start: datetime
    end: datetime

    @staticmethod
    def read(value: Any) -> Request | None:
        """The request ``value`` stores, or None for anything else (garbage is dropped)."""
        if not isinstance(value, Mapping):
            return None
        rid, kind = value.get("id"), value.get("kind")
        start, end = value.get("start"), value.get("end", value.get("start"))
        if (
            not isinstance(rid, str)
            or kind not in ("trigger", "backfill")
            or not isinstance(start, datetime)
            or not isinstance(end, datetime)
        ):
            return None
        return Request(rid, kind, _aware(start), _aware(end))

    def fires(self, times: FireTimes) -> list[datetime]:
        """The fire times it asks for: its own for a trigger; the schedule's in its range
        for a backfill (at most ``MAX_BACKFILL``)."""
        if self.kind == "trigger":
            return [self.start]
        found, _ = fires_between(
            times, self.start - timedelta(microseconds=1), self.end, MAX_BACKFILL
        )
        return found


@dataclass
class ScheduleState:
    """What a schedule's document says besides its spec, read leniently: a field that
    holds garbage reads as absent (and is rewritten by the next step)."""

    next: datetime | None = None
    buffered: datetime | None = None
    counts: dict[str, int] = field(default_factory=dict)
    requests: list[Request] = field(default_factory=list)
    dropped: list[Any] = field(default_factory=list)
    """Stored requests that are not requests: the step removes them."""

    @staticmethod
    def read(doc: Mapping[str, Any]) -> ScheduleState:
        counts = doc.get("counts")
        raw = doc.get("requests")
        requests, dropped = [], []
        for value in raw if isinstance(raw, list) else []:
            request = Request.read(value)
            if request is None:
                dropped.append(value)
            else:
                requests.append(request)
        return ScheduleState(
            next=_date(doc.get("next")),
            buffered=_date(doc.get("buffered")),
            counts={
                k: v
                for k, v in (counts.items() if isinstance(counts, Mapping) else ())
                if k in FireResult.__members__.values() and isinstance(v, int)
            },
            requests=requests,
            dropped=dropped,
        )


@dataclass(frozen=True)
class DuePlan:
    """What is due at ``now`` from a schedule's next fire on: the fires to start, in order;
    those coalesced into the last of them; the missed ones (before the catch-up window);
    and where the schedule goes on (``next``: None, no more fire times; ``more``: fires
    still due past this step's share, for the next step at once)."""

    start: list[datetime]
    coalesced: list[datetime]
    missed: int
    window: datetime
    """Where the catch-up window starts: fires before it are missed, unless a step that
    died after its submits left their documents (those were started)."""
    missed_first: datetime | None
    missed_last: datetime | None
    next: datetime | None
    more: bool


def due_plan(spec: ScheduleSpec, first: datetime | None, now: datetime) -> DuePlan:
    """The fires due at ``now`` from ``first`` (the stored next fire; None: there is
    none) on; a fire is due once its jitter has passed too."""
    window = now - timedelta(seconds=spec.catch_up)
    missed: list[datetime] = []
    count = 0
    fire: datetime | None = first
    while fire is not None and fire < window and count < MAX_MISSED_COUNTED:
        count += 1
        if len(missed) < 2:
            missed.append(fire)
        else:
            missed[1] = fire
        fire = spec.times.after(fire)
    if fire is not None and fire < window:  # past what is counted: jump to the window
        last = _last_before(spec.times, window)
        missed[1:] = [last] if last is not None else []
        fire = spec.times.after(last) if last is not None else None
    due: list[datetime] = []
    while (
        fire is not None
        and fire + jitter_of(spec.name, fire, spec.jitter) <= now
        and len(due) <= MAX_FIRES_PER_STEP
    ):
        due.append(fire)
        fire = spec.times.after(fire)
    more = len(due) > MAX_FIRES_PER_STEP
    if more:
        fire = due.pop()
    coalesced: list[datetime] = []
    if spec.coalesce and len(due) > 1 and not more:
        coalesced, due = due[:-1], due[-1:]
    return DuePlan(
        start=due,
        coalesced=coalesced,
        missed=count,
        window=window,
        missed_first=missed[0] if missed else None,
        missed_last=missed[-1] if missed else None,
        next=fire,
        more=more,
    )


@dataclass(frozen=True)
class Takeover:
    """Where a schedule's new spec goes on from when it replaces the stored one, and what
    of the old one's fires the replacement accounts for (``started``, ``missed``): those a
    step started past the stored next fire before its write was lost."""

    first: datetime | None
    started: int = 0
    missed: int = 0

    def counted(self, counts: Mapping[str, int]) -> dict[str, int]:
        """``counts`` with the old spec's fires this takeover accounts for."""
        total = dict(counts)
        for result, count in ((FireResult.STARTED, self.started), (FireResult.MISSED, self.missed)):
            if count:
                total[result.value] = total.get(result.value, 0) + count
        return total


def takeover(
    old: ScheduleSpec | None,
    new: ScheduleSpec,
    known: datetime | None,
    runs: list[datetime],
    now: datetime,
) -> Takeover:
    """The new spec goes on from where the old one had got to: its stored next fire
    (``known``), or past the latest of its runs at or after that (``runs``: a step
    submitted them, then lost its write). The old fires up to there were passed: those
    with a run are counted started, the others missed (the step that passed them kept no
    record). With no stored next fire (or garbage), from ``now``."""
    if known is None:
        return Takeover(new.times.after(now))
    reached: datetime | None = known
    started = passed = 0
    found = [] if old is None else [f for f in on_grid(old.times, runs) if f >= known]
    if old is not None and found:
        last = max(found)
        fires, _ = fires_between(
            old.times, known - timedelta(microseconds=1), last, MAX_MISSED_COUNTED
        )
        started = len(set(found))
        passed = max(len(fires), started)
        reached = old.times.after(last)
    first = new.times.after(reached - timedelta(microseconds=1)) if reached else None
    return Takeover(first or new.times.after(now), started, passed - started)


def on_grid(times: FireTimes, fires: list[datetime]) -> list[datetime]:
    """Those of ``fires`` that are fire times of ``times`` (not a trigger's own instant)."""
    return [f for f in fires if times.after(f - timedelta(microseconds=1)) == f]


def _last_before(times: FireTimes, moment: datetime) -> datetime | None:
    """The last fire time before ``moment``, searched back a day at a time (a year at most)."""
    for days in (1, 7, 31, 366):
        found, _ = fires_between(times, moment - timedelta(days=days), moment, 10**6)
        earlier = [f for f in found if f < moment]
        if earlier:
            return earlier[-1]
    return None


def decide(overlap: Overlap, active: bool, buffered: bool, source: Source = Source.DUE) -> Decision:
    """A fire from ``source``, the schedule's previous runs ``active`` or not, one fire
    ``buffered`` already or not. What an operator asked for starts whatever the policy
    (they asked for that run); the buffered fire starts once the runs have ended."""
    if source is Source.REQUESTED:
        return Decision.START
    if source is Source.BUFFERED:
        return Decision.BUFFER if active else Decision.START
    if not active or overlap is Overlap.ALLOW_ALL:
        return Decision.START
    if overlap is Overlap.CANCEL_PREVIOUS:
        return Decision.CANCEL_AND_START
    if overlap is Overlap.BUFFER_ONE and not buffered:
        return Decision.BUFFER
    return Decision.SKIP


def _date(value: Any) -> datetime | None:
    return _aware(value) if isinstance(value, datetime) else None


def _aware(value: datetime) -> datetime:
    """BSON dates come back naive (UTC) unless the client is tz-aware."""
    return value if value.tzinfo is not None else value.replace(tzinfo=UTC)
