"""The demo's replicas' logs: kept off the live display (in a file, or nowhere). The
replicas run here (``run``) and those run as processes of their own (``processes``) share
this."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

__all__ = ["quiet_logs"]


@contextmanager
def quiet_logs(log_file: Path | None) -> Iterator[None]:
    """Keep log lines off the live display: to ``log_file`` if given, else nowhere."""
    names = ("orchestrator", "apscheduler")
    saved = [(logging.getLogger(n), logging.getLogger(n).propagate) for n in names]
    saved_levels = [lg.level for lg, _ in saved]
    # A handler even with no file: a logger with none prints its warnings to stderr.
    handlers: list[logging.Handler] = [logging.NullHandler()]
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
