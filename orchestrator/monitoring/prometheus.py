"""Prometheus metrics from a replica's events, and document counts computed on scrape.

``PrometheusListener`` counts what the replicas of this process report (register the same
listener on each): steps by collection, phase and outcome, step durations and claim
latencies, leases held, lost and extended, failed attempts by error type, idle probes,
the server-clock offset, and schedules' fire times by result with their lag. With
``status=db`` it also registers a ``StatusCollector``, which at scrape time reports how
many documents of each collection and phase are leased, waiting, overdue, retrying (their
latest attempt failed; tried again) and failed (given up on), and
what operators paused, from the ``orchestrator status`` aggregation, at most once every
``status_max_age`` seconds whatever the scrape rate, and never holding a scrape longer
than ``status_timeout`` seconds however slow the database; given the operator page's
status cache, the page and the metrics share one aggregation.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import threading
import time
from collections.abc import Awaitable, Callable, Iterator, Sequence
from concurrent.futures import Future, wait
from functools import partial
from typing import Generic, TypeVar

from orchestrator.core.distribution import install_hint

try:
    from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge, Histogram
    from prometheus_client.core import GaugeMetricFamily
    from prometheus_client.registry import Collector
except ModuleNotFoundError as exc:  # pragma: no cover - the metrics extra is missing
    raise ModuleNotFoundError(
        "orchestrator.monitoring.prometheus needs prometheus-client, which the 'metrics' "
        f"extra installs: {install_hint('metrics')}",
        name="prometheus_client",
    ) from exc

import pymongo
from pymongo.asynchronous.database import AsyncDatabase
from pymongo.database import Database

from orchestrator.core.documents import Document
from orchestrator.core.errors import ConfigError
from orchestrator.core.events import (
    AttemptFailedEvent,
    ClockMeasuredEvent,
    IdleProbeEvent,
    LeaseExtendedEvent,
    LeaseLostEvent,
    Listener,
    ScheduleFiredEvent,
    StepClaimedEvent,
    StepFinishedEvent,
)
from orchestrator.operations import (
    AsyncOperations,
    AsyncStatusCache,
    Operations,
    Status,
    StatusCache,
)

__all__ = [
    "DEFAULT_STATUS_TIMEOUT",
    "DURATION_BUCKETS",
    "PrometheusListener",
    "StatusCollector",
    "StatusSource",
]

logger = logging.getLogger("orchestrator")

DEFAULT_STATUS_TIMEOUT = 5.0
"""Seconds a scrape waits for the document counts: below Prometheus's default scrape
timeout (10 s), so a slow database makes stale counts, not a failed scrape."""

StatusSource = (
    Database[Document]
    | AsyncDatabase[Document]
    | AsyncStatusCache
    | StatusCache
    | Callable[[], Status]
)
"""Where the collector's document counts come from (``StatusCollector``)."""

DURATION_BUCKETS = (0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 10.0, 30.0, 60.0, 300.0, 1800.0)
"""Seconds, from a millisecond step to a step_timeout's worth (steps and relock waits
range that widely)."""


def _phase(phase: str | None) -> str:
    return phase if phase is not None else ""


M = TypeVar("M", Counter, Gauge, Histogram)


class _Children(Generic[M]):
    """A labelled metric's children, each looked up once: ``labels()`` checks its values
    and takes a lock at every call, several microseconds at every step."""

    def __init__(self, metric: M) -> None:
        self._metric: M = metric
        self._children: dict[tuple[str, ...], M] = {}

    def __call__(self, *values: str) -> M:
        child = self._children.get(values)
        if child is None:
            child = self._children.setdefault(values, self._metric.labels(*values))
        return child


class PrometheusListener(Listener):
    """Register it on every replica of the process: ``Orchestrator(db, listeners=[m])``.

    ``registry``: where the metrics go (prometheus_client's default registry unless
    given; two listeners on one registry collide). ``status``: a database to count
    documents in on scrape (or a function returning a ``Status``, or the status cache the
    operator's page uses too), an ``AsyncDatabase`` or ``AsyncStatusCache`` included
    (then build the listener on the loop that owns its client); ``collections`` limits
    the count, ``status_max_age`` bounds how often it is computed, ``status_timeout`` how
    long a scrape waits for it (``StatusCollector``), ``monotonic`` is the clock that ages
    it (tests pass a fake one).
    """

    def __init__(
        self,
        registry: CollectorRegistry | None = None,
        *,
        status: StatusSource | None = None,
        collections: Sequence[str] | None = None,
        status_max_age: float = 15.0,
        status_timeout: float = DEFAULT_STATUS_TIMEOUT,
        monotonic: Callable[[], float] = time.monotonic,
        buckets: Sequence[float] = DURATION_BUCKETS,
    ) -> None:
        registry = REGISTRY if registry is None else registry
        step = ("collection", "phase")
        self.steps = Counter(
            "orchestrator_steps",
            "Steps finished, by collection, phase (the one it was claimed in) and outcome.",
            (*step, "outcome"),
            registry=registry,
        )
        self.claims = Counter(
            "orchestrator_claims", "Documents claimed for a step.", step, registry=registry
        )
        self.step_duration = Histogram(
            "orchestrator_step_duration_seconds",
            "Seconds from a step's claim to its outcome.",
            step,
            registry=registry,
            buckets=buckets,
        )
        self.claim_latency = Histogram(
            "orchestrator_claim_latency_seconds",
            "Seconds a document had been due when it was claimed (where its fields tell).",
            step,
            registry=registry,
            buckets=buckets,
        )
        self.leases_held = Gauge(
            "orchestrator_leases_held",
            "Leases held by this process's replicas now.",
            ("collection",),
            registry=registry,
        )
        self.attempt_failures = Counter(
            "orchestrator_attempt_failures",
            "Failed attempts of steps, by error type.",
            (*step, "error"),
            registry=registry,
        )
        self.leases_lost = Counter(
            "orchestrator_leases_lost",
            "Leases found lost (another replica, or an outside phase change, won).",
            step,
            registry=registry,
        )
        self.leases_extended = Counter(
            "orchestrator_leases_extended",
            "Leases of long steps extended by the heartbeat.",
            step,
            registry=registry,
        )
        self.clock_offset = Gauge(
            "orchestrator_clock_offset_seconds",
            "The server's clock minus this machine's, as last measured.",
            ("replica",),
            registry=registry,
        )
        self.clock_round_trip = Gauge(
            "orchestrator_clock_round_trip_seconds",
            "The round trip of the last measurement of the server's clock.",
            ("replica",),
            registry=registry,
        )
        self.idle_probes = Counter(
            "orchestrator_idle_probes",
            "Reads of an idle replica asking whether a collection has work, by result.",
            ("collection", "result"),
            registry=registry,
        )
        self.schedule_fires = Counter(
            "orchestrator_schedule_fires",
            "Fire times of schedules dealt with, by schedule and result (started, skipped,"
            " buffered, declined, coalesced, missed, failed); a missed range counts each.",
            ("schedule", "result"),
            registry=registry,
        )
        self.schedule_lag = Histogram(
            "orchestrator_schedule_lag_seconds",
            "Seconds from a fire time to the start of its document (started fires only).",
            ("schedule",),
            registry=registry,
            buckets=buckets,
        )
        self._steps, self._claims = _Children(self.steps), _Children(self.claims)
        self._duration, self._latency = _Children(self.step_duration), _Children(self.claim_latency)
        self._held = _Children(self.leases_held)
        self._fires, self._lag = _Children(self.schedule_fires), _Children(self.schedule_lag)
        self.status: StatusCollector | None = None
        if status is not None:
            self.status = StatusCollector(
                status,
                collections=collections,
                max_age=status_max_age,
                timeout=status_timeout,
                monotonic=monotonic,
            )
            registry.register(self.status)

    def step_claimed(self, event: StepClaimedEvent) -> None:
        phase = _phase(event.phase)
        self._claims(event.collection, phase).inc()
        self._held(event.collection).inc()
        if event.latency is not None:
            self._latency(event.collection, phase).observe(event.latency)

    def step_finished(self, event: StepFinishedEvent) -> None:
        phase = _phase(event.phase)
        self._steps(event.collection, phase, event.outcome.value).inc()
        self._duration(event.collection, phase).observe(event.duration)
        self._held(event.collection).dec()

    def attempt_failed(self, event: AttemptFailedEvent) -> None:
        self.attempt_failures.labels(event.collection, _phase(event.phase), event.error_type).inc()

    def lease_lost(self, event: LeaseLostEvent) -> None:
        self.leases_lost.labels(event.collection, _phase(event.phase)).inc()

    def lease_extended(self, event: LeaseExtendedEvent) -> None:
        self.leases_extended.labels(event.collection, _phase(event.phase)).inc()

    def clock_measured(self, event: ClockMeasuredEvent) -> None:
        self.clock_offset.labels(event.replica).set(event.offset)
        self.clock_round_trip.labels(event.replica).set(event.round_trip)

    def idle_probe(self, event: IdleProbeEvent) -> None:
        result = "error" if event.found is None else "found" if event.found else "empty"
        self.idle_probes.labels(event.collection, result).inc()

    def schedule_fired(self, event: ScheduleFiredEvent) -> None:
        self._fires(event.schedule, event.result).inc(event.count)
        if event.lag is not None:
            self._lag(event.schedule).observe(event.lag)


_DOCUMENT_GAUGES = (
    ("orchestrator_documents", "count", "Documents per collection and phase."),
    ("orchestrator_documents_leased", "leased", "Documents held by a live lease."),
    (
        "orchestrator_documents_waiting",
        "waiting",
        "Documents sitting out a relock or retry wait, or a later start.",
    ),
    (
        "orchestrator_documents_overdue",
        "overdue",
        "Documents whose lease ran out while held (its replica died or is stuck).",
    ),
    (
        "orchestrator_documents_retrying",
        "retrying",
        "Documents whose latest attempt failed, to be tried again (no handler gave up).",
    ),
    (
        "orchestrator_documents_failed",
        "failed",
        "Documents a handler gave up on (in its failed phase until an operator retries them).",
    ),
)


def _on_its_loop(
    report: Callable[[], Awaitable[Status]], bound: float | None
) -> tuple[Callable[[], Future[Status]], Callable[[], bool]]:
    """Scrapes arrive on the metrics server's thread; an async client belongs to one loop,
    so the count runs there (under ``bound``), and a scrape waits for it from its own
    thread. The second function says whether the caller is on that loop's thread, where
    waiting would block the very loop that must run the count."""
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        raise ConfigError(
            "status=<an AsyncDatabase or AsyncStatusCache>: build the listener on the event"
            " loop that owns its client (e.g. in the application's lifespan)"
        ) from None
    loop_thread = threading.get_ident()

    async def count() -> Status:
        with pymongo.timeout(bound):
            return await report()

    def start() -> Future[Status]:
        if loop.is_closed():
            raise RuntimeError("the event loop of the database's client is closed")
        return asyncio.run_coroutine_threadsafe(count(), loop)

    return start, lambda: threading.get_ident() == loop_thread


def _in_thread(work: Callable[[], Status]) -> Future[Status]:
    """``work`` on a daemon thread of its own: a count that hangs never holds up the
    scrape, nor the interpreter's exit."""
    future: Future[Status] = Future()

    def run() -> None:
        future.set_running_or_notify_cancel()
        try:
            result = work()
        except BaseException as exc:  # handed to the scrape that reads it
            future.set_exception(exc)
        else:
            future.set_result(result)

    threading.Thread(target=run, name="orchestrator-status-count", daemon=True).start()
    return future


class StatusCollector(Collector):
    """Document counts per collection and phase, and the pauses in force
    (``orchestrator_paused``), computed when Prometheus scrapes, from ``orchestrator
    status``'s aggregation (one round trip per collection), at most once every
    ``max_age`` seconds: scrapes in between get the counts already computed, so a scrape
    storm costs the database nothing. ``source`` is a ``Database``, an ``AsyncDatabase``
    (counted on the event loop its client belongs to: the one running when the collector
    is built), a function returning a ``Status``, or a status cache
    (``orchestrator.operations.AsyncStatusCache``, on its client's loop likewise, or
    ``StatusCache``).

    A cache is how an application that mounts the operator's page too computes one
    aggregation per period for both: give the page and the collector the same one
    (``operator_app(db, status=cache)``). Its ``max_age`` and collections then decide
    what is computed and how often (``collections`` must not be given here); this
    collector's ``max_age`` only spaces out its own asks (0: at every scrape).

    A slow database never holds a scrape past ``timeout`` seconds (5, below Prometheus's
    default scrape timeout of 10): the count runs apart from the scrape (on a thread of
    its own, or on the client's loop), with its database work bounded by ``timeout`` too
    (``pymongo.timeout``; a function source is not bounded), and at most one count is in
    flight: a scrape that finds one running waits for it up to ``timeout``, then serves the
    last counts with ``orchestrator_status_stale`` 1 and their age in
    ``orchestrator_status_age_seconds``. A failed count reports
    ``orchestrator_status_up`` 0 and no counts, and is not retried before ``max_age``.
    """

    def __init__(
        self,
        source: StatusSource,
        *,
        collections: Sequence[str] | None = None,
        max_age: float = 15.0,
        timeout: float = DEFAULT_STATUS_TIMEOUT,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        if isinstance(max_age, bool) or not isinstance(max_age, int | float) or not max_age >= 0:
            raise ConfigError(f"status_max_age must be a number of seconds >= 0, not {max_age!r}")
        if (
            isinstance(timeout, bool)
            or not isinstance(timeout, int | float)
            or not 0 <= timeout <= 3600
        ):
            raise ConfigError(f"status_timeout must be between 0 and 3600 seconds, not {timeout!r}")
        names = list(collections) if collections else None
        bound = timeout or None  # 0: the scrape never waits; the count is not cut short
        self._start: Callable[[], Future[Status]]
        self._on_loop: Callable[[], bool] = lambda: False
        lister = getattr(source, "list_collection_names", None)
        if isinstance(source, AsyncStatusCache | StatusCache) and names:
            raise ConfigError("status=<a status cache>: give the collections to the cache")
        if isinstance(source, AsyncStatusCache):
            self._start, self._on_loop = _on_its_loop(source.status, bound)
        elif isinstance(source, StatusCache):
            cache = source

            def ask() -> Status:
                with pymongo.timeout(bound):
                    return cache.status()

            self._start = partial(_in_thread, ask)
        elif inspect.iscoroutinefunction(lister):
            adb: AsyncDatabase[Document] = source  # type: ignore[assignment]
            self._start, self._on_loop = _on_its_loop(
                partial(AsyncOperations(adb).status, names, errors=0), bound
            )
        elif callable(lister):
            db: Database[Document] = source  # type: ignore[assignment]  # or a look-alike

            def count() -> Status:
                with pymongo.timeout(bound):
                    return Operations(db).status(names, errors=0)

            self._start = partial(_in_thread, count)
        elif callable(source):
            self._start = partial(_in_thread, source)
        else:
            raise ConfigError(
                "status: a Database, an AsyncDatabase, a status cache or a function returning"
                f" a Status, not {type(source).__name__}"
            )
        self.timeout = float(timeout)
        """Seconds a scrape waits for a count in flight before it serves the last counts."""
        self._max_age = max_age
        self._monotonic = monotonic
        self._lock = threading.Lock()
        self._running: Future[Status] | None = None
        self._started_at: float | None = None  # of the latest count, finished or not
        self._status: Status | None = None  # the latest finished count's, None if it failed
        self._status_at = 0.0  # when the count that gave ``_status`` started
        self._late_logged = False
        self.computations = 0
        """How many counts were started (each a query per collection)."""

    def describe(self) -> Iterator[GaugeMetricFamily]:
        """The metrics' names, without a query: the registry asks at registration."""
        yield from self._families(None, 0.0, stale=False)

    def collect(self) -> Iterator[GaugeMetricFamily]:
        with self._lock:
            self._settle()
            now = self._monotonic()
            due = self._started_at is None or now - self._started_at >= self._max_age
            if self._running is None and due:
                self._begin(now)
            running = self._running
        if running is not None:
            wait([running], timeout=0 if self._on_loop() else self.timeout)
        with self._lock:
            self._settle()
            stale = self._running is not None
            if stale and not self._late_logged:
                self._late_logged = True
                logger.warning(
                    "metrics: counting documents is still running when the scrape stops"
                    " waiting; serving the last counts (marked stale) until it ends",
                    extra={"outcome": "status-late"},
                )
            status, age = self._status, self._monotonic() - self._status_at
        yield from self._families(status, age, stale=stale)

    def _begin(self, now: float) -> None:
        """Start a count (under the lock)."""
        self._started_at = now
        self.computations += 1
        self._late_logged = False
        try:
            self._running = self._start()
        except Exception as exc:  # e.g. the client's loop is closed
            self._failed(exc)

    def _settle(self) -> None:
        """Take in the count in flight if it has ended (under the lock)."""
        running = self._running
        if running is None or not running.done():
            return
        self._running = None
        try:
            status = running.result()
        except Exception as exc:
            self._failed(exc)
        else:
            self._status, self._status_at = status, self._started_at or 0.0

    def _failed(self, exc: Exception) -> None:
        self._status = None
        logger.warning(
            f"metrics: counting documents failed: {exc}", extra={"outcome": "status-failed"}
        )

    def _families(
        self, status: Status | None, age: float, *, stale: bool
    ) -> Iterator[GaugeMetricFamily]:
        up = GaugeMetricFamily(
            "orchestrator_status_up",
            "1 when the last count of documents succeeded, else 0.",
        )
        stale_family = GaugeMetricFamily(
            "orchestrator_status_stale",
            "1 when a count is still running past the scrape's wait: the counts are the last ones.",
        )
        age_family = GaugeMetricFamily(
            "orchestrator_status_age_seconds",
            "Seconds since the count of the documents reported started.",
        )
        families = [
            (GaugeMetricFamily(name, doc, labels=("collection", "phase")), field)
            for name, field, doc in _DOCUMENT_GAUGES
        ]
        paused = GaugeMetricFamily(
            "orchestrator_paused",
            "1 for each pause in force: a collection (phase and handler empty), a phase of it,"
            " or a handler (by its module:function name).",
            labels=("collection", "phase", "handler"),
        )
        stale_family.add_metric((), 1.0 if stale else 0.0)
        if status is not None:
            up.add_metric((), 1.0)
            age_family.add_metric((), max(age, 0.0))
            for row in status.phases:
                for family, field in families:
                    family.add_metric((row.collection, row.phase), float(getattr(row, field)))
            for pause in status.pauses:
                scope = pause.scope
                paused.add_metric((scope.collection, scope.phase or "", scope.handler or ""), 1.0)
        else:
            up.add_metric((), 0.0)
        yield up
        yield stale_family
        yield age_family
        for family, _ in families:
            yield family
        yield paused
