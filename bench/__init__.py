"""Benchmarks of the orchestrator against the pattern it replaces.

Run ``uv run python -m bench`` (``--size tiny|small|full``, ``--out docs/benchmarks.md``).
Every figure is a ratio or a per-step cost measured side by side in one run, on the same
store, so the store's own speed cancels out of the ratios; nothing here is asserted.
"""

from __future__ import annotations

import os
import sys


def server_uri(command: str) -> str | None:
    """``MONGODB_URI``, or None after saying in one line that ``command`` needs it."""
    uri = os.environ.get("MONGODB_URI")
    if not uri:
        print(f"bench {command}: set MONGODB_URI to the server to measure", file=sys.stderr)
    return uri or None
