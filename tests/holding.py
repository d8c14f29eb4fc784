"""A step that holds its lease until the test says go: the way tests stage stalls and
takeovers without sleeping."""

from __future__ import annotations

import threading
from typing import Any

from orchestrator import Lease, LeaseLost


def hold_step(
    orch: Any, action: str = "advance", collection: str = "jobs", phase: str = "Running"
) -> dict[str, Any]:
    """Register a handler that signals ``claimed``, waits for ``go``, then tries ``action``
    (``advance`` goes to "Done"); a ``LeaseLost`` is kept as ``lost``, and ``returned``
    is set once the handler is over."""
    box: dict[str, Any] = {
        "claimed": threading.Event(),
        "go": threading.Event(),
        "returned": threading.Event(),
    }

    @orch.phase(collection, phase)
    def hold(lease: Lease[Any]) -> Any:
        box["lease"] = lease
        box["claimed"].set()
        box["go"].wait(10)
        try:
            return lease.advance("Done") if action == "advance" else getattr(lease, action)()
        except LeaseLost as exc:
            box["lost"] = exc
            raise
        finally:
            box["returned"].set()

    return box
