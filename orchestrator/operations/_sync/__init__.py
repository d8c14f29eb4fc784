"""The operator's sync side, generated from ``_async`` by ``scripts/synchro.py``: edit those."""
