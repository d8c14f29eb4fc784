"""Measuring the server's clock: the one round trip ``ServerClock`` leaves to its caller.

``ServerClock`` does no I/O; the runners call ``measure`` when it says a measurement is
``due`` (the async runner awaits it on its event loop; the sync ``measure`` is generated).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from orchestrator.core.clock import ServerClock
    from orchestrator.mongo._async.contract import AsyncLeaseStore

__all__ = ["measure"]


async def measure(clock: ServerClock, store: AsyncLeaseStore) -> None:
    """Probe the server with ``hello`` and record the answer in ``clock``.

    A failed probe keeps the last estimate; with none yet, it raises, since leases cannot
    be judged safely by an unmeasured clock.
    """
    started = clock.local.monotonic()
    try:
        server = await store.server_time()
    except Exception:
        clock.failed(started)
        if not clock.measured:
            raise
        return
    clock.record(server, started, clock.local.monotonic(), clock.local.now())
