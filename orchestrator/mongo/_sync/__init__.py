"""The sync stores, generated from ``_async`` by ``scripts/synchro.py``: edit those."""
