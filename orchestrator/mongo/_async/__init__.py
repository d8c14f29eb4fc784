"""The async stores: the source of truth that ``scripts/synchro.py`` turns into ``_sync``."""
