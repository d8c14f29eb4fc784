"""Faults between a replica and MongoDB, injected on purpose and reproducibly.

``Faults.wrap(db)`` returns a database (in-memory or a real pymongo one, sync or async)
whose operations may raise the driver's transient errors, run slowly, fail for an outage
window, or apply and then lose their reply, as a dropped connection does. Every random
choice comes from one seeded generator, so a single-threaded run injects the same faults
every time; slow operations call an injectable ``delay`` (a test passes
``FakeClock.advance``: no sleeping; with an async database ``delay`` runs on the event
loop's thread, so it must not block).
"""

from __future__ import annotations

import inspect
import math
import random
import threading
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, TypeGuard, TypeVar, cast, overload

from pymongo.errors import (
    AutoReconnect,
    NetworkTimeout,
    NotPrimaryError,
    PyMongoError,
    ServerSelectionTimeoutError,
)

from orchestrator.core.clock import Clock, SystemClock
from orchestrator.testing.memory import DOCUMENT_WRITES, INDEX_WRITES

if TYPE_CHECKING:
    from pymongo.asynchronous.database import AsyncDatabase
    from pymongo.database import Database

__all__ = ["WRITES", "Faults", "ReplicaCrashed"]

T = TypeVar("T")

READS = frozenset(
    {
        "find",
        "find_one",
        "count_documents",
        "estimated_document_count",
        "distinct",
        "aggregate",
        "list_indexes",
        "index_information",
        "list_collection_names",
        "command",
    }
)
WRITES = DOCUMENT_WRITES | INDEX_WRITES | frozenset({"drop", "drop_collection"})
"""Operations the server may apply before the reply is lost."""

OPERATIONS = READS | WRITES

TRANSIENT: tuple[type[AutoReconnect], ...] = (AutoReconnect, NetworkTimeout, NotPrimaryError)


class ReplicaCrashed(BaseException):
    """The replica's process died at this point: nothing after it runs, no lease is
    released. A ``BaseException``, so no ``except Exception`` in the library stops it."""


@dataclass(frozen=True)
class _Outage:
    start: datetime
    end: datetime


@dataclass
class _Scripted:
    operation: str
    error: BaseException
    applied: bool
    crash: bool


class Faults:
    """What goes wrong, and the count of what went wrong (``injected``, by kind).

    ``rate``: chance that an operation fails before reaching the server with one of
    ``TRANSIENT`` (``rates`` overrides it per operation name, e.g. ``{"command": 0}``);
    ``lost_reply``: chance that a write is applied and its reply then lost
    (``AutoReconnect``); ``slow``: chance that an operation first waits up to
    ``slow_seconds`` through ``delay``. ``clock`` judges outage windows.
    """

    def __init__(  # noqa: PLR0913  the public fault injector's knobs, keyword-only with defaults
        self,
        *,
        seed: int = 0,
        rate: float = 0.0,
        rates: Mapping[str, float] | None = None,
        lost_reply: float = 0.0,
        slow: float = 0.0,
        slow_seconds: float = 1.0,
        delay: Callable[[float], None] = time.sleep,
        clock: Clock | None = None,
    ) -> None:
        if not isinstance(seed, int) or isinstance(seed, bool):
            raise TypeError(f"seed must be an int, not {type(seed).__name__}")
        for name, value in (("rate", rate), ("lost_reply", lost_reply), ("slow", slow)):
            _check_probability(name, value)
        if rates is not None and not isinstance(rates, Mapping):
            raise TypeError(f"rates must map operation names to rates, not {type(rates).__name__}")
        for name, value in (rates or {}).items():
            _check_operation(name)
            _check_probability(f"rates[{name!r}]", value)
        if not _is_number(slow_seconds) or not math.isfinite(slow_seconds) or slow_seconds < 0:
            raise ValueError(f"slow_seconds must be a finite number >= 0, not {slow_seconds!r}")
        if not callable(delay):
            raise TypeError(f"delay must be callable (seconds -> None), not {type(delay).__name__}")
        if clock is not None and not callable(getattr(clock, "now", None)):
            raise TypeError(f"clock must be a Clock (now()), not {type(clock).__name__}")
        self.rate = rate
        self.rates = dict(rates or {})
        self.lost_reply = lost_reply
        self.slow = slow
        self.slow_seconds = slow_seconds
        self._delay = delay
        self._clock = clock if clock is not None else SystemClock()
        self._rng = random.Random(seed)
        self._lock = threading.Lock()
        self._outages: list[_Outage] = []
        self._scripted: list[_Scripted] = []
        self._delayed: list[tuple[str, float]] = []
        self._dead = False
        self._quiet = 0
        self.injected: Counter[str] = Counter()
        """Faults injected, by kind: the error's class name, lost_reply, slow, outage..."""
        self.operations: Counter[str] = Counter()
        """Every operation seen, by name, faulty or not."""

    # -- wrapping -------------------------------------------------------------------------

    @overload
    def wrap(self, db: Database[Any]) -> Database[Any]: ...

    @overload
    def wrap(self, db: AsyncDatabase[Any]) -> AsyncDatabase[Any]: ...

    def wrap(self, db: Database[Any] | AsyncDatabase[Any]) -> Database[Any] | AsyncDatabase[Any]:
        """``db`` with these faults on every operation, typed as what it wraps: a sync
        database's operations fail when called, an async one's when awaited."""
        return cast("Database[Any]", FaultyDatabase(db, self))

    # -- scripted faults ------------------------------------------------------------------

    def cut_off(self, seconds: float, start: datetime | None = None) -> None:
        """No operation reaches the database for ``seconds`` from ``start`` (default: now,
        by ``clock``): each fails with ``ServerSelectionTimeoutError``."""
        _check_seconds(seconds)
        begin = start if start is not None else self._clock.now()
        with self._lock:
            self._outages.append(_Outage(begin, begin + timedelta(seconds=seconds)))

    def fail_next(
        self, operation: str, error: PyMongoError | None = None, *, applied: bool = False
    ) -> None:
        """The next ``operation`` raises ``error`` (default ``AutoReconnect``), after being
        applied when ``applied`` (a lost reply)."""
        _check_operation(operation)
        raised = error if error is not None else AutoReconnect("injected: connection reset")
        with self._lock:
            self._scripted.append(_Scripted(operation, raised, applied, crash=False))

    def delay_next(self, operation: str, seconds: float) -> None:
        """The next ``operation`` is applied, then its reply takes ``seconds`` (through
        ``delay``) to arrive: a slow network on the way back."""
        _check_operation(operation)
        _check_seconds(seconds)
        with self._lock:
            self._delayed.append((operation, seconds))

    def crash_next(self, operation: str, *, applied: bool) -> None:
        """The replica dies during the next ``operation``: before the server got it, or
        after it applied it (``applied``). Every later operation raises too."""
        _check_operation(operation)
        with self._lock:
            self._scripted.append(
                _Scripted(operation, ReplicaCrashed(f"crashed in {operation}"), applied, True)
            )

    def kill(self) -> None:
        """The replica is dead: every operation from now on raises ``ReplicaCrashed``."""
        with self._lock:
            self._dead = True

    @property
    def dead(self) -> bool:
        with self._lock:
            return self._dead

    @contextmanager
    def quiet(self) -> Iterator[None]:
        """No random faults inside (outages and scripted faults still apply)."""
        with self._lock:
            self._quiet += 1
        try:
            yield
        finally:
            with self._lock:
                self._quiet -= 1

    def silence(self) -> None:
        """No random faults from now on, and no pending outage: a network that healed."""
        with self._lock:
            self._quiet += 1
            self._outages.clear()

    # -- running an operation -------------------------------------------------------------

    def run(self, operation: str, call: Callable[[], T]) -> T:
        """Run ``call`` (the real ``operation``) with whatever fault is due."""
        after = self._before(operation)
        result = call()
        self._after(operation, after)
        return result

    async def run_async(self, operation: str, call: Callable[[], Awaitable[T]]) -> T:
        """Await ``call()`` (the real ``operation``) with whatever fault is due."""
        after = self._before(operation)
        result = await call()
        self._after(operation, after)
        return result

    def _before(self, operation: str) -> BaseException | None:
        """Fail or slow ``operation`` before it reaches the server; return the fault due
        after it applied, if any."""
        before, after, wait = self._decide(operation)
        if before is not None:
            raise before
        if wait > 0:
            self._delay(wait)
        return after

    def _after(self, operation: str, after: BaseException | None) -> None:
        """Delay or lose the reply of ``operation``, which has applied."""
        reply_delay = self._reply_delay(operation)
        if reply_delay:
            self._delay(reply_delay)
        if after is not None:
            raise after

    def _reply_delay(self, operation: str) -> float:
        with self._lock:
            for index, (name, seconds) in enumerate(self._delayed):
                if name == operation:
                    del self._delayed[index]
                    self.injected["slow_reply"] += 1
                    return seconds
        return 0.0

    def _decide(self, operation: str) -> tuple[BaseException | None, BaseException | None, float]:  # noqa: PLR0911  one return per fault, in the order they are drawn
        now = self._clock.now()
        with self._lock:
            self.operations[operation] += 1
            if self._dead:
                return ReplicaCrashed(f"dead replica: {operation}"), None, 0.0
            for index, scripted in enumerate(self._scripted):
                if scripted.operation == operation:
                    del self._scripted[index]
                    self.injected["crash" if scripted.crash else "scripted"] += 1
                    if scripted.crash:
                        self._dead = True
                    if scripted.applied:
                        return None, scripted.error, 0.0
                    return scripted.error, None, 0.0
            if any(o.start <= now < o.end for o in self._outages):
                self.injected["outage"] += 1
                return ServerSelectionTimeoutError("injected outage: no server reachable"), None, 0
            # Always four draws, so one rate's change does not reshuffle the others' faults.
            fail, lose, slow, pick = (self._rng.random() for _ in range(4))
            if self._quiet:
                return None, None, 0.0
            if fail < self.rates.get(operation, self.rate):
                error = TRANSIENT[int(pick * len(TRANSIENT))]
                self.injected[error.__name__] += 1
                return error(f"injected: {error.__name__} in {operation}"), None, 0.0
            if operation in WRITES and lose < self.lost_reply:
                self.injected["lost_reply"] += 1
                return None, AutoReconnect(f"injected: reply to {operation} lost"), 0.0
            if slow < self.slow:
                self.injected["slow"] += 1
                return None, None, pick * self.slow_seconds
            return None, None, 0.0


def _is_number(value: object) -> TypeGuard[float]:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _check_seconds(seconds: object) -> None:
    if not _is_number(seconds) or not math.isfinite(seconds) or seconds < 0:
        raise ValueError(f"seconds must be a finite number >= 0, not {seconds!r}")


def _check_probability(name: str, value: float) -> None:
    if not _is_number(value) or not 0.0 <= value <= 1.0:
        raise ValueError(f"{name} must be a probability in [0, 1], not {value!r}")


def _check_operation(operation: str) -> None:
    if operation not in OPERATIONS:
        raise ValueError(f"unknown operation {operation!r}; one of {sorted(OPERATIONS)}")


def _is_collection(value: Any) -> bool:
    return hasattr(value, "find_one_and_update") and hasattr(value, "full_name")


class FaultyDatabase:
    """A database proxy whose commands, and whose collections' operations, go through
    ``Faults.run``."""

    def __init__(self, db: Any, faults: Faults) -> None:
        self._db = db
        self._faults = faults

    @property
    def name(self) -> str:
        return cast(str, self._db.name)

    @property
    def client(self) -> Any:
        return self._db.client

    def get_collection(self, name: str, *args: Any, **kwargs: Any) -> FaultyCollection:
        return FaultyCollection(self._db.get_collection(name, *args, **kwargs), self._faults)

    def __getitem__(self, name: str) -> FaultyCollection:
        return self.get_collection(name)

    def with_options(self, *args: Any, **kwargs: Any) -> FaultyDatabase:
        return FaultyDatabase(self._db.with_options(*args, **kwargs), self._faults)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        value = getattr(self._db, name)
        if _is_collection(value):
            return FaultyCollection(value, self._faults)
        if name in OPERATIONS and callable(value):
            return _operation(self._faults, name, value)
        return value

    def __repr__(self) -> str:
        return f"<faulty {self._db!r}>"


class FaultyCollection:
    """A collection proxy whose operations go through ``Faults.run``."""

    def __init__(self, collection: Any, faults: Faults) -> None:
        self._collection = collection
        self._faults = faults

    @property
    def name(self) -> str:
        return cast(str, self._collection.name)

    @property
    def full_name(self) -> str:
        return cast(str, self._collection.full_name)

    def with_options(self, *args: Any, **kwargs: Any) -> FaultyCollection:
        return FaultyCollection(self._collection.with_options(*args, **kwargs), self._faults)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        value = getattr(self._collection, name)
        if name in OPERATIONS and callable(value):
            return _operation(self._faults, name, value)
        if _is_collection(value):
            return FaultyCollection(value, self._faults)
        return value

    def __repr__(self) -> str:
        return f"<faulty {self._collection!r}>"


def _operation(faults: Faults, name: str, method: Callable[..., Any]) -> Callable[..., Any]:
    if inspect.iscoroutinefunction(method):

        async def operation(*args: Any, **kwargs: Any) -> Any:
            return await faults.run_async(name, lambda: method(*args, **kwargs))

        operation.__name__ = name
        return operation

    def call(*args: Any, **kwargs: Any) -> Any:
        return faults.run(name, lambda: method(*args, **kwargs))

    call.__name__ = name
    return call
