"""When a schedule fires: a cron expression in a named timezone, or a fixed interval.

Fire times are instants (aware datetimes in UTC), computed the same on every replica from
the schedule's stored spec alone, so replicas agree on them without talking. Cron comes
from APScheduler 3's ``CronTrigger`` (already a dependency; its ``zoneinfo`` arithmetic
handles DST), with crontab's meaning kept where APScheduler 3 departs from it: weekday
numbers (crontab's 0 is Sunday, APScheduler 3's is Monday), and day-of-month OR
day-of-week when both are restricted. Wall-clock times are honoured as cron users expect:
a time the spring-forward skips fires once, at the instant it maps to; a time the
fall-back repeats fires once, at its first occurrence, unless the hour field is ``*``
(hourly and finer crons keep their cadence in real time).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from apscheduler.triggers.cron import CronTrigger

from orchestrator.core.errors import ConfigError

__all__ = ["Cron", "Every", "FireTimes", "fire_times_of", "fires_between"]

MIN_INTERVAL = 1.0
"""The shortest interval (seconds) and cron period a schedule may have."""
MAX_INTERVAL = 366 * 86_400.0
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_STEP = timedelta(microseconds=1)
_SEARCH = 8
"""How many candidates a DST fold may make ``Cron.after`` skip before it gives up."""


class FireTimes(ABC):
    """A schedule's fire times: a strictly increasing sequence of UTC instants."""

    @abstractmethod
    def after(self, moment: datetime) -> datetime | None:
        """The first fire time strictly after ``moment`` (aware), or None: no more."""

    @abstractmethod
    def stored(self) -> dict[str, Any]:
        """The spec as stored on the schedule's document (``fire_times_of`` reads it)."""

    @abstractmethod
    def describe(self) -> str:
        """One line for operators: ``cron 0 2 * * * (Europe/Berlin)``, ``every 5s``."""


@dataclass(frozen=True)
class Every(FireTimes):
    """Every ``seconds`` (at least 1), at the instants ``anchor + k * seconds``: every
    replica counts from the same anchor (the Unix epoch unless given), so they agree."""

    seconds: float
    anchor: datetime = _EPOCH

    def __post_init__(self) -> None:
        if not MIN_INTERVAL <= self.seconds <= MAX_INTERVAL:
            raise ConfigError(
                f"every must be between {MIN_INTERVAL:g}s and {MAX_INTERVAL:g}s,"
                f" not {self.seconds!r}"
            )
        if self.anchor.tzinfo is None:
            raise ConfigError("a schedule's anchor must be an aware datetime")

    def after(self, moment: datetime) -> datetime | None:
        step = round(self.seconds * 1000)
        elapsed = _millis(moment - self.anchor)
        return self.anchor + timedelta(milliseconds=(elapsed // step + 1) * step)

    def stored(self) -> dict[str, Any]:
        return {"every": self.seconds, "anchor": self.anchor.astimezone(UTC)}

    def describe(self) -> str:
        return f"every {_seconds(self.seconds)}"


@dataclass(frozen=True)
class Cron(FireTimes):
    """A crontab expression (five fields, or six with seconds first) in ``timezone``."""

    expression: str
    timezone: str = "UTC"

    def __post_init__(self) -> None:
        # Built (and refused) here, at declaration, not at the first fire.
        object.__setattr__(self, "_built", self._build())

    def _triggers(self) -> tuple[CronTrigger, ...]:
        built: tuple[CronTrigger, ...] = self.__dict__["_built"]
        return built

    def _build(self) -> tuple[CronTrigger, ...]:
        fields = self.expression.split() if isinstance(self.expression, str) else []
        if len(fields) not in (5, 6):
            raise ConfigError(
                f"cron {self.expression!r}: five fields (minute hour day month weekday),"
                " or six with seconds first"
            )
        second, rest = (fields[0], fields[1:]) if len(fields) == 6 else ("0", fields)
        minute, hour, day, month, weekday = rest
        zone = _zone(self.timezone)
        shared = {"second": second, "minute": minute, "hour": hour, "month": month}
        days = _weekdays(weekday, self.expression)
        try:
            if day not in ("*", "?") and weekday not in ("*", "?"):
                # crontab: either field matching is enough (APScheduler 3 asks for both)
                return (
                    CronTrigger(**shared, day=day, timezone=zone),
                    CronTrigger(**shared, day_of_week=days, timezone=zone),
                )
            day = "*" if day == "?" else day
            return (CronTrigger(**shared, day=day, day_of_week=days, timezone=zone),)
        except (ValueError, TypeError) as exc:
            raise ConfigError(f"cron {self.expression!r}: {exc}") from exc

    def after(self, moment: datetime) -> datetime | None:
        found = [f for t in self._triggers() if (f := self._next(t, moment)) is not None]
        return min(found) if found else None

    def _next(self, trigger: CronTrigger, moment: datetime) -> datetime | None:
        hourly = self.expression.split()[-4] == "*"
        cursor = moment.astimezone(UTC)
        for _ in range(_SEARCH):
            # Stepped in UTC: a step on a wall time would lose the fold (fall-back's 2nd pass).
            fire: datetime | None = trigger.get_next_fire_time(
                None, (cursor + _STEP).astimezone(trigger.timezone)
            )
            if fire is None:
                return None
            instant = fire.astimezone(UTC)
            if instant > moment and (hourly or not _repeated(fire)):
                return instant
            cursor = max(instant, cursor)
        return None

    def stored(self) -> dict[str, Any]:
        return {"cron": self.expression, "timezone": self.timezone}

    def describe(self) -> str:
        return f"cron {self.expression} ({self.timezone})"


def fire_times_of(stored: Any) -> FireTimes:
    """The fire times a stored spec describes (``FireTimes.stored``); ``ConfigError`` for
    anything else: a schedule's document may hold anything."""
    if not isinstance(stored, Mapping):
        raise ConfigError(f"a schedule's timing is a document, not {type(stored).__name__}")
    cron, every = stored.get("cron"), stored.get("every")
    if (cron is None) == (every is None):
        raise ConfigError("a schedule has either cron or every")
    if cron is not None:
        zone = stored.get("timezone", "UTC")
        if not isinstance(cron, str) or not isinstance(zone, str):
            raise ConfigError("a schedule's cron and timezone are strings")
        return Cron(cron, zone)
    if isinstance(every, bool) or not isinstance(every, int | float):
        raise ConfigError(f"every is a number of seconds, not {every!r}")
    anchor = stored.get("anchor", _EPOCH)
    if not isinstance(anchor, datetime):
        raise ConfigError(f"a schedule's anchor is a date, not {anchor!r}")
    return Every(float(every), anchor if anchor.tzinfo else anchor.replace(tzinfo=UTC))


def fires_between(
    times: FireTimes, after: datetime, until: datetime, most: int
) -> tuple[list[datetime], datetime | None]:
    """At most ``most`` fire times in (``after``, ``until``], and the first one past them
    (None when the schedule has no more): where the next look starts."""
    found: list[datetime] = []
    fire = times.after(after)
    while fire is not None and fire <= until and len(found) < most:
        found.append(fire)
        fire = times.after(fire)
    return found, fire


def _repeated(fire: datetime) -> bool:
    """Whether ``fire``'s wall time is the second of two (the hour a fall-back repeats)."""
    first = fire.replace(fold=0)
    return fire.utcoffset() != first.utcoffset() and first.astimezone(UTC) < fire.astimezone(UTC)


def _zone(name: str) -> ZoneInfo:
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError, TypeError) as exc:
        raise ConfigError(f"unknown timezone {name!r} (an IANA name: 'Europe/Berlin')") from exc


_DAY_NAMES = ("sun", "mon", "tue", "wed", "thu", "fri", "sat")


def _weekdays(field: str, expression: str) -> str:
    """crontab's weekday field (0 or 7 is Sunday; names; ranges, lists, steps) as
    APScheduler 3's names, which it reads without its own numbering (0 is Monday)."""
    if field in ("*", "?"):
        return "*"
    days: set[int] = set()
    for part in field.lower().split(","):
        span, _, step_text = part.partition("/")
        try:
            step = int(step_text) if step_text else 1
            if span == "*":
                low, high = 0, 6
            else:
                first, dash, last = span.partition("-")
                if dash and not last:
                    raise ValueError(span)
                low = _day_number(first)
                high = _day_number(last) if last else (6 if step_text else low)
        except ValueError:
            raise ConfigError(f"cron {expression!r}: weekday {part!r} is not understood") from None
        if step < 1 or low > high:
            raise ConfigError(f"cron {expression!r}: weekday {part!r} is not understood")
        days.update(d % 7 for d in range(low, high + 1, step))
    return ",".join(_DAY_NAMES[d] for d in sorted(days))


def _day_number(text: str) -> int:
    if text in _DAY_NAMES:
        return _DAY_NAMES.index(text)
    number = int(text)
    if not 0 <= number <= 7:
        raise ValueError(text)
    return number


def _millis(delta: timedelta) -> int:
    return (delta.days * 86_400 + delta.seconds) * 1000 + delta.microseconds // 1000


def _seconds(value: float) -> str:
    for unit, size in (("d", 86_400), ("h", 3600), ("m", 60)):
        if value >= size and value % size == 0:
            return f"{int(value // size)}{unit}"
    return f"{value:g}s"
