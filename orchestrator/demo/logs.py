"""The demo's replicas' logs: kept off the live display (in a file, or nowhere), with the
certificate step's relock waits read from them for the report. The replicas run here
(``run``) and those run as processes of their own (``processes``) share this."""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

__all__ = ["RelockWaits", "quiet_logs"]


class RelockWaits:
    """Relock waits of the certificate step, read from its log records (on the replicas'
    threads: kept under a lock)."""

    def __init__(self) -> None:
        self._values: list[float] = []
        self._lock = threading.Lock()

    def add(self, wait: float) -> None:
        with self._lock:
            self._values.append(wait)

    def snapshot(self) -> list[float]:
        """The waits so far, in the order they were logged."""
        with self._lock:
            return list(self._values)


class _WaitCollector(logging.Handler):
    def __init__(self, waits: RelockWaits) -> None:
        super().__init__(logging.INFO)
        self.waits = waits

    def emit(self, record: logging.LogRecord) -> None:
        wait = getattr(record, "wait", None)
        if isinstance(wait, int | float) and getattr(record, "outcome", None) == "relocked":
            self.waits.add(float(wait))


@contextmanager
def quiet_logs(log_file: Path | None, waits: RelockWaits) -> Iterator[None]:
    """Keep log lines off the live display: to ``log_file`` if given, else nowhere."""
    names = ("orchestrator", "apscheduler")
    saved = [(logging.getLogger(n), logging.getLogger(n).propagate) for n in names]
    saved_levels = [lg.level for lg, _ in saved]
    handlers: list[logging.Handler] = [_WaitCollector(waits)]
    if log_file is not None:
        to_file = logging.FileHandler(log_file, encoding="utf-8")
        to_file.setFormatter(
            logging.Formatter("%(asctime)s %(levelname)s %(name)s [%(threadName)s] %(message)s")
        )
        handlers.append(to_file)
    for lg, _ in saved:
        lg.propagate = False
        lg.setLevel(logging.WARNING if lg.name == "apscheduler" else logging.INFO)
        for handler in handlers:
            lg.addHandler(handler)
    try:
        yield
    finally:
        for (lg, propagate), level in zip(saved, saved_levels, strict=True):
            lg.propagate = propagate
            lg.setLevel(level)
            for handler in handlers:
                lg.removeHandler(handler)
        for handler in handlers:
            handler.close()
