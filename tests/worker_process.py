"""A worker in its own OS process (``orchestrator run``, or a program of the test's own),
for the tests of signals and exits."""

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
    with python_process(
        tmp_path, module, source, "-m", "orchestrator", "run", f"{module}:orch", *args
    ) as proc:
        yield proc


@contextmanager
def python_process(
    tmp_path: Path, module: str, source: str, *args: str
) -> Iterator[subprocess.Popen[str]]:
    """``python ARGS`` in ``tmp_path`` with ``source`` saved as MODULE (with no ARGS: run
    as the program itself); killed on the way out if the test left it running."""
    (tmp_path / f"{module}.py").write_text(textwrap.dedent(source))
    proc = subprocess.Popen(
        [sys.executable, *(args or (f"{module}.py",))],
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
    hang, it measures nothing.

    Reads the pipe's file descriptor directly: a line read through ``proc.stdout`` could
    leave the next one in Python's buffer, where ``select`` never sees it. What follows
    the matching line in the same read is returned too; ``communicate`` gets the rest."""
    assert proc.stdout is not None
    fd = proc.stdout.fileno()
    selector = selectors.DefaultSelector()
    selector.register(fd, selectors.EVENT_READ)
    received = b""
    while text.encode() not in received:
        assert selector.select(timeout=timeout), f"never printed {text!r}: {received!r}"
        chunk = os.read(fd, 65536)
        assert chunk, f"the worker closed its output before printing {text!r}: {received!r}"
        received += chunk
    return received.decode().splitlines(keepends=True)
