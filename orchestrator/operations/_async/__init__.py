"""The operator's async side, written by hand: what ``scripts/synchro.py`` turns into
``_sync``."""
