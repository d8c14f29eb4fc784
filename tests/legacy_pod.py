"""The in-house pattern this library replaces, as the old pods of a rolling deploy run it.

A port to Python of the optimistic-lock cron pattern the migration guide starts from
(imprun.dev's ``ApiGatewayTaskService`` and ``RuntimeDomainTaskService``, in TypeScript),
its queries and their meaning unchanged:

- every pod runs its handlers every second (``@Cron(EVERY_SECOND)``, not awaited: a
  handler still waiting on an outside call from an earlier second runs beside new ones);
- a handler claims with one ``findOneAndUpdate({phase, lockedAt: {$lt: now - 30 s}},
  {$set: {lockedAt: now}})`` and does one step;
- then it unlocks (``lockedAt`` back to the epoch, ``TASK_LOCK_INIT_TIME``: the next second
  carries on), relocks (``lockedAt = now - lockTimeout + wait``, the wait a tenth of the
  time spent in the phase, 30 s once that passes two minutes) or moves the document on;
- no token, no ``lockedUntil``: a lease is ``lockTimeout`` seconds from ``lockedAt``.

The TypeScript awaits outside services; here a handler is a generator that yields the
seconds each outside call takes, and its pod resumes it once they have passed on the
clock it reads (``LegacyPod.resume``): the interleavings of the original, with neither
threads nor sleeps. ``Platform`` is the outside both kinds of pod call, and its ledger
counts every step carried out, by whom.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable, Generator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from pymongo import ReturnDocument
from pymongo.database import Database

TASK_LOCK_INIT_TIME = datetime(1970, 1, 1)
"""``new Date('1970-01-01')``: an unlocked document's ``lockedAt``."""

KINDS = ("triggers", "functions", "stages")
"""What deleting a gateway removes, one kind per step, in this order."""

Handler = Generator[float, None, None]
"""A handler run: yields the seconds each outside call it waits on takes."""

Step = tuple[str, str, str]
"""(gatewayId, phase, step)."""


def js_now(now: datetime) -> datetime:
    """``new Date()``: JavaScript dates hold milliseconds."""
    return now.replace(microsecond=now.microsecond // 1000 * 1000)


def progressive_wait(waiting_ms: float, lock_timeout: float) -> float:
    """The article's ``relock`` backoff, in milliseconds: a tenth of the time spent in the
    phase while that is two minutes at most, else the lock timeout."""
    if waiting_ms <= 2 * 60 * 1000:
        waiting_ms = math.ceil(waiting_ms / 10)
    if waiting_ms > 2 * 60 * 1000:
        waiting_ms = lock_timeout * 1000
    return waiting_ms


@dataclass
class Gateway:
    """What the outside holds for one gateway: the resources deleting it removes, and its
    certificate (Ready ``cert_delay`` seconds after it was asked for) and ingress."""

    triggers: int
    functions: int
    stages: int
    cert_delay: float
    cert_asked: datetime | None = None
    ingress: bool = False


@dataclass
class Platform:
    """The services the workflow calls (cert-manager, the ingress, the gateway's resources),
    shared by old pods and replicas, and the ledger of every step they carried out:
    ``steps[(gatewayId, phase, step)]`` lists who did it, each time."""

    now: Callable[[], datetime]
    gateways: dict[str, Gateway] = field(default_factory=dict)
    steps: dict[Step, list[str]] = field(default_factory=dict)
    polls: int = 0
    """Certificate checks that found it not Ready yet (a relock each, not a step)."""
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def provision(self, gid: str, gateway: Gateway) -> None:
        with self._lock:
            self.gateways[gid] = gateway

    def expected(self, gid: str, custom_domain: bool) -> list[Step]:
        """The steps ``gid``'s workflow takes, each exactly once."""
        gateway = self.gateways[gid]
        steps = [(gid, "Creating", "certificate")] if custom_domain else []
        steps += [(gid, "Creating", "ingress"), (gid, "Creating", "created")]
        steps += [(gid, "Deleting", kind) for kind in KINDS if getattr(gateway, kind) > 0]
        return [*steps, (gid, "Deleting", "deleted")]

    def record(self, gid: str, phase: str, step: str, by: str) -> None:
        with self._lock:
            self.steps.setdefault((gid, phase, step), []).append(by)

    def certificate(self, gid: str) -> str | None:
        """None (never asked for), ``pending`` or ``Ready``; a pending one counts a poll."""
        with self._lock:
            gateway = self.gateways[gid]
            if gateway.cert_asked is None:
                return None
            ready = self.now() >= gateway.cert_asked + timedelta(seconds=gateway.cert_delay)
            if not ready:
                self.polls += 1
            return "Ready" if ready else "pending"

    def create_certificate(self, gid: str, by: str) -> None:
        with self._lock:
            self.gateways[gid].cert_asked = self.now()
        self.record(gid, "Creating", "certificate", by)

    def has_ingress(self, gid: str) -> bool:
        with self._lock:
            return self.gateways[gid].ingress

    def create_ingress(self, gid: str, by: str) -> None:
        with self._lock:
            self.gateways[gid].ingress = True
        self.record(gid, "Creating", "ingress", by)

    def count(self, kind: str, gid: str) -> int:
        with self._lock:
            return int(getattr(self.gateways[gid], kind))

    def remove_all(self, kind: str, gid: str, by: str) -> None:
        with self._lock:
            setattr(self.gateways[gid], kind, 0)
        self.record(gid, "Deleting", kind, by)


class LegacyPod:
    """One old pod: both task services of the article on the ``gateways`` collection.
    ``now``: the clock it reads (``Date.now()``); ``latency``: the seconds the next
    outside call takes."""

    lock_timeout = 30  # readonly lockTimeout = 30

    def __init__(
        self,
        name: str,
        db: Database[Any],
        now: Callable[[], datetime],
        platform: Platform,
        latency: Callable[[], float] = lambda: 1.0,
    ) -> None:
        self.name = name
        self.db = db
        self._now = now
        self.platform = platform
        self._latency = latency
        self._running: list[tuple[datetime, Handler]] = []
        self.stopped = False

    # -- the pod's life -----------------------------------------------------------------

    def tick(self) -> None:
        """``@Cron(CronExpression.EVERY_SECOND) tick()``: each handler started, not awaited."""
        if self.stopped:
            return
        self._start(self.handle_creating_phase())
        self._start(self.handle_deleting_phase())

    def resume(self) -> None:
        """Carry on the handlers whose outside call has returned by now."""
        now = self._now()
        due = [run for run in self._running if run[0] <= now]
        self._running = [run for run in self._running if run[0] > now]
        for _, handler in due:
            self._start(handler)

    def stop(self) -> None:
        """A graceful shutdown: no new second starts; what runs finishes (``resume``)."""
        self.stopped = True

    @property
    def busy(self) -> bool:
        return bool(self._running)

    def _start(self, handler: Handler) -> None:
        try:
            seconds = next(handler)
        except StopIteration:
            return
        self._running.append((self._now() + timedelta(seconds=seconds), handler))

    def _date(self) -> datetime:
        return js_now(self._now())

    def _call(self, service: Callable[..., None], *args: Any) -> Handler:
        """``await service(...)``: the call takes its time, then acts."""
        yield self._latency()
        service(*args, by=self.name)

    # -- RuntimeDomainTaskService.handleCreatingPhase -------------------------------------

    def handle_creating_phase(self) -> Handler:
        doc = self.db.gateways.find_one_and_update(
            {
                "phase": "Creating",
                "lockedAt": {"$lt": self._date() - timedelta(seconds=self.lock_timeout)},
            },
            {"$set": {"lockedAt": self._date()}},
            return_document=ReturnDocument.AFTER,
        )
        if doc is None:
            return
        gid = doc["gatewayId"]
        if doc.get("customDomain"):
            waiting_time = _ms(self._date() - _utc(doc["updatedAt"]))
            cert = self.platform.certificate(gid)
            if cert is None:
                yield from self._call(self.platform.create_certificate, gid)
                self.relock(gid, waiting_time)
                return
            if cert != "Ready":
                self.relock(gid, waiting_time)
                return
        if not self.platform.has_ingress(gid):
            yield from self._call(self.platform.create_ingress, gid)
        done = self.db.gateways.update_one(
            {"_id": doc["_id"], "phase": "Creating"},
            {
                "$set": {
                    "phase": "Created",
                    "lockedAt": TASK_LOCK_INIT_TIME,
                    "updatedAt": self._date(),
                }
            },
        )
        if done.matched_count:
            self.platform.record(gid, "Creating", "created", self.name)

    def relock(self, gid: str, waiting_time: float = 0) -> None:
        waiting_time = progressive_wait(waiting_time, self.lock_timeout)
        locked_at = (
            self._date()
            - timedelta(seconds=self.lock_timeout)
            + timedelta(milliseconds=waiting_time)
        )
        self.db.gateways.update_one({"gatewayId": gid}, {"$set": {"lockedAt": locked_at}})

    # -- ApiGatewayTaskService.handleDeletingPhase ----------------------------------------

    def handle_deleting_phase(self) -> Handler:
        gateway = self.db.gateways.find_one_and_update(
            {
                "phase": "Deleting",
                "lockedAt": {"$lt": self._date() - timedelta(seconds=self.lock_timeout)},
            },
            {"$set": {"lockedAt": self._date()}},
            sort=[("lockedAt", 1), ("updatedAt", 1)],
            return_document=ReturnDocument.AFTER,
        )
        if gateway is None:
            return
        gid = gateway["gatewayId"]
        for kind in KINDS:  # triggers, functions, stages: one kind per step
            if self.platform.count(kind, gid) > 0:
                yield from self._call(self.platform.remove_all, kind, gid)
                self.unlock(gid)
                return
        self.db.gateways.update_one({"_id": gateway["_id"]}, {"$set": {"phase": "Deleted"}})
        self.platform.record(gid, "Deleting", "deleted", self.name)

    def unlock(self, gid: str) -> None:
        self.db.gateways.update_one({"gatewayId": gid}, {"$set": {"lockedAt": TASK_LOCK_INIT_TIME}})


def _utc(value: datetime) -> datetime:
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value


def _ms(delta: timedelta) -> float:
    return delta / timedelta(milliseconds=1)
