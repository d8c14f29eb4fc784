"""The sync engine, generated from ``_async`` by ``scripts/synchro.py``."""
