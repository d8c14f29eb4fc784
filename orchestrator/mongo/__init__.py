"""The only package that talks to pymongo.

- ``_async/store.py``: ``AsyncStore`` and ``connect_async``, written by hand;
- ``_sync/store.py``: ``Store`` and ``connect``, generated from it (``scripts/synchro.py``);
- ``common.py``: what both share that does no I/O (error mapping, options, index plans).
"""

from orchestrator.mongo._async.store import AsyncStore, connect_async
from orchestrator.mongo._sync.store import Store, connect

__all__ = ["AsyncStore", "Store", "connect", "connect_async"]
