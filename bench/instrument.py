"""Counting database operations and the time spent inside them.

The wrapper sits between the library's ``Store`` (or ``AsyncStore``) and the database
(in-memory or real, sync or async), so it sees exactly the operations the library sends:
the benchmarks count idle operations with it and split a step's time into "in the
database" and "everything else". An async operation is timed from its call until its
awaited result, round trip to the event loop included, as a server's reply would be.
"""

from __future__ import annotations

import inspect
import threading
import time
from collections import Counter
from typing import Any

# Collection methods that send one operation to the server.
_OPERATIONS = frozenset(
    {
        "find_one_and_update",
        "find_one_and_replace",
        "find_one",
        "find",
        "update_one",
        "update_many",
        "insert_one",
        "insert_many",
        "delete_one",
        "delete_many",
        "count_documents",
        "aggregate",
        "create_index",
        "list_indexes",
    }
)


class Meter:
    """Operations by name and seconds spent in them, summed over every thread."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.ops: Counter[str] = Counter()
        self.seconds = 0.0

    def record(self, name: str, seconds: float) -> None:
        with self._lock:
            self.ops[name] += 1
            self.seconds += seconds

    def reset(self) -> None:
        with self._lock:
            self.ops.clear()
            self.seconds = 0.0

    def total(self) -> int:
        with self._lock:
            return sum(self.ops.values())

    def snapshot(self) -> tuple[dict[str, int], float]:
        with self._lock:
            return dict(self.ops), self.seconds


def _timed(meter: Meter, name: str, method: Any) -> Any:
    if inspect.iscoroutinefunction(method):

        async def operation(*args: Any, **kwargs: Any) -> Any:
            started = time.perf_counter()
            try:
                return await method(*args, **kwargs)
            finally:
                meter.record(name, time.perf_counter() - started)

        return operation

    def call(*args: Any, **kwargs: Any) -> Any:
        started = time.perf_counter()
        try:
            return method(*args, **kwargs)
        finally:
            meter.record(name, time.perf_counter() - started)

    return call


class CountingCollection:
    """A collection whose operations are counted and timed by ``meter``."""

    def __init__(self, collection: Any, meter: Meter) -> None:
        self._collection = collection
        self._meter = meter
        self._timed: dict[str, Any] = {}  # made once: the wrapper's own cost is per step

    def with_options(self, *args: Any, **kwargs: Any) -> CountingCollection:
        return CountingCollection(self._collection.with_options(*args, **kwargs), self._meter)

    def __getattr__(self, name: str) -> Any:
        if name in _OPERATIONS:
            timed = self._timed.get(name)
            if timed is None:
                timed = self._timed[name] = _timed(
                    self._meter, name, getattr(self._collection, name)
                )
            return timed
        return getattr(self._collection, name)


class CountingDatabase:
    """A database whose collections and commands are counted (pass it to Orchestrator, or,
    wrapping an async database, to AsyncOrchestrator)."""

    def __init__(self, db: Any, meter: Meter) -> None:
        self._db = db
        self.meter = meter

    @property
    def name(self) -> str:
        return str(self._db.name)

    def get_collection(self, name: str, *args: Any, **kwargs: Any) -> CountingCollection:
        return CountingCollection(self._db.get_collection(name, *args, **kwargs), self.meter)

    def __getitem__(self, name: str) -> CountingCollection:
        return self.get_collection(name)

    def __getattr__(self, name: str) -> Any:
        if name == "command":
            # A coroutine function on an async database, as there: the engines tell the
            # two drivers' databases apart by it.
            command = self._db.command
            timed: dict[str, Any] = {}

            def counted(command_name: Any) -> Any:
                name = command_name if isinstance(command_name, str) else next(iter(command_name))
                if name not in timed:
                    timed[name] = _timed(self.meter, f"command:{name}", command)
                return timed[name]

            if inspect.iscoroutinefunction(command):

                async def run_async(spec: Any, *args: Any, **kwargs: Any) -> Any:
                    return await counted(spec)(spec, *args, **kwargs)

                return run_async

            def run(spec: Any, *args: Any, **kwargs: Any) -> Any:
                return counted(spec)(spec, *args, **kwargs)

            return run
        return getattr(self._db, name)
