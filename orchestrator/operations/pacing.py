"""A pause between two tries of an operator's write, on either form of the service: the
async one awaits it, the sync one (generated) sleeps (``scripts/synchro.py`` maps one name
onto the other)."""

from __future__ import annotations

import asyncio
import time

__all__ = ["pause_between", "pause_between_async"]


async def pause_between_async(seconds: float) -> None:
    await asyncio.sleep(seconds)


def pause_between(seconds: float) -> None:
    time.sleep(seconds)
