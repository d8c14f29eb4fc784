"""An ``orchestrator run`` worker in its own OS process, for the tests of signals and exits."""

from __future__ import annotations

import os
import selectors
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


@contextmanager
def worker_process(
    tmp_path: Path, module: str, source: str, *args: str
) -> Iterator[subprocess.Popen[str]]:
    """``python -m orchestrator run MODULE:orch ARGS`` with ``source`` as MODULE; killed
    on the way out if the test left it running."""
    (tmp_path / f"{module}.py").write_text(textwrap.dedent(source))
    proc = subprocess.Popen(
        [sys.executable, "-m", "orchestrator", "run", f"{module}:orch", *args],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()


def read_until(proc: subprocess.Popen[str], text: str, timeout: float = 30) -> list[str]:
    """Lines of the worker's stdout up to the one containing ``text``; the timeout bounds a
    hang, it measures nothing."""
    assert proc.stdout is not None
    selector = selectors.DefaultSelector()
    selector.register(proc.stdout, selectors.EVENT_READ)
    lines: list[str] = []
    while not any(text in line for line in lines):
        assert selector.select(timeout=timeout), f"never printed {text!r}: {lines}"
        lines.append(proc.stdout.readline())
    return lines
