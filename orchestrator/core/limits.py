"""Cluster-wide limits of a handler: how many of its steps run at once across every replica
(``global_limit=N``), and how many start per second, minute or hour (``rate_limit="10/minute"``).

Both are kept by slots: ``N`` small documents per limit in ``Settings.slots_collection``
(``orchestrator.slots``), ``{_id: "<handler key>/<kind>/<n>", handler, kind, n, until,
token, by}``. A replica takes one with a single find-and-modify before it claims a
document for the handler (``limit_slots.take_slot_filter``: a slot whose ``until`` has passed,
judged by the server's clock as leases are), so the claim of a step needs a free slot:

- ``global``: the slot lasts as long as the step's lease (``until`` is the lease's expiry,
  renewed with it by the heartbeat, the slot first) and is freed when the step ends, when
  its claim finds nothing, or when the lease is lost or taken back by ``step_timeout``. A
  dead replica's slot comes back when its lease would have expired; every write of a slot
  is fenced on the token of the lease that took it, so a stale holder never frees or
  renews a slot another step holds now.
- ``rate``: the slot lasts one period from the start (``until = now + period``): a sliding
  log of the last ``N`` starts, so at most ``N`` steps start in any window of one period
  (a burst of ``N`` at once). A slot whose claim then found no document is given back (its
  ``until`` as it was before).

Everything here is pure; the store reads and writes the slots, the runners decide when.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from enum import StrEnum
from typing import Any

from orchestrator.core.clock import as_utc
from orchestrator.core.resource import EPOCH

MAX_SLOTS = 10_000
"""The most a limit may count: each unit is a slot document, made when a replica starts."""

SLOTS_RECHECK = 10.0
"""Seconds between two counts of a limit's slots by a replica whose takes find none free:
slots an operator removed (or their whole collection) are made again within this, at
the cost of one read per limit per 10 s while its work waits for a slot. A replica
waiting for a rate limit's next slot takes again within this too (``RateWait``)."""

PERIODS = {"second": 1.0, "minute": 60.0, "hour": 3600.0}
"""A rate limit's periods, in seconds, by the name it is written with."""

_UNITS = {
    "second": "second",
    "s": "second",
    "minute": "minute",
    "min": "minute",
    "hour": "hour",
    "h": "hour",
}
"""The period names ``rate_limit`` accepts: the three words, and ``s``, ``min``, ``h``
(not ``m``, which reads as a month as well as a minute)."""

_RATE = re.compile(r"\s*(\d+)\s*/\s*([a-z]+)\s*")

RATE_FORMS = "N/second, N/minute or N/hour (or N/s, N/min, N/h), N from 1 to 10000"
"""What ``rate_limit`` accepts, as its refusal says it."""


class LimitKind(StrEnum):
    """What a limit counts: steps running at once, or steps started per period."""

    GLOBAL = "global"
    RATE = "rate"


@dataclass(frozen=True)
class Limit:
    """One limit of a handler: ``count`` steps at once (``global``), or ``count`` starts per
    ``period`` (``rate``, its period's name in ``unit``)."""

    kind: LimitKind
    count: int
    unit: str = ""

    @property
    def period(self) -> float:
        """Seconds a rate slot stays taken after a start (0 for a global limit)."""
        return PERIODS.get(self.unit, 0.0)

    @property
    def follows_lease(self) -> bool:
        """Whether the slot lasts as long as the step's lease (a global limit's)."""
        return self.kind is LimitKind.GLOBAL

    def describe(self) -> str:
        """As the replicas publish it: ``2`` for a global limit, ``10/minute`` for a rate."""
        return str(self.count) if self.kind is LimitKind.GLOBAL else f"{self.count}/{self.unit}"


def parse_rate(text: Any) -> Limit:
    """``"10/minute"`` (or ``10/min``, ``10 / Minute``...: see ``_UNITS``) as a rate ``Limit``;
    ``ValueError`` saying what is accepted otherwise."""
    if not isinstance(text, str):
        raise ValueError(f"must be a string: {RATE_FORMS}")
    found = _RATE.fullmatch(text.lower())
    unit = _UNITS.get(found.group(2)) if found else None
    if found is None or unit is None:
        raise ValueError(f"must be {RATE_FORMS}")
    count = int(found.group(1))
    if not 1 <= count <= MAX_SLOTS:
        raise ValueError(f"must be {RATE_FORMS}")
    return Limit(LimitKind.RATE, count, unit)


def limits_of(global_limit: int | None, rate_limit: str | None) -> tuple[Limit, ...]:
    """A handler's limits from its options (checked by ``HandlerOptions``): the rate first,
    so a step refused by the rate holds no slot of the global limit meanwhile."""
    found: list[Limit] = []
    if rate_limit is not None:
        found.append(parse_rate(rate_limit))
    if global_limit is not None:
        found.append(Limit(LimitKind.GLOBAL, global_limit))
    return tuple(found)


@dataclass
class Slot:
    """A slot this replica took for a step: which one, under which token (the lease's),
    until when, and what it said before (a rate slot given back is restored to it)."""

    key: str
    limit: Limit
    id: str
    token: str
    until: datetime
    before_until: Any = None
    before_token: Any = None
    freed: bool = field(default=False)

    @property
    def recovered(self) -> bool:
        """Whether it was a global slot its last holder never freed (the holder died, or
        stalled past its lease): taken back once its ``until`` passed."""
        return (
            self.limit.follows_lease
            and isinstance(self.before_until, datetime)
            and as_utc(self.before_until) > as_utc(EPOCH)
            and isinstance(self.before_token, str)
        )


@dataclass(frozen=True)
class RateWait:
    """A rate limit a replica found full: when its next slot comes free by its time, as
    read (``free_at``), and when the replica next asks the server (``ask_at``): then, or
    ``SLOTS_RECHECK`` after it found none if that is sooner. Another replica's give-back
    (its claim found nothing) frees a slot at once, before its time, and no read of this
    replica's but a take would see it: without the bound it sat out a whole period (an
    hour, for N/hour) with that slot free."""

    free_at: datetime
    ask_at: datetime

    @staticmethod
    def of(free_at: datetime, judged: datetime) -> RateWait:
        """The wait for a slot that comes free at ``free_at``, found full at ``judged``."""
        return RateWait(free_at, min(free_at, judged + timedelta(seconds=SLOTS_RECHECK)))


def published(found: tuple[Limit, ...]) -> tuple[int | None, str | None]:
    """A handler's limits as its replica's record publishes them: its ``global_limit`` and
    its ``rate_limit`` (``10/minute``), None for each it has not."""
    count = next((limit.count for limit in found if limit.kind is LimitKind.GLOBAL), None)
    rate = next((limit.describe() for limit in found if limit.kind is LimitKind.RATE), None)
    return count, rate
