"""The engine: ``_async/`` is written by hand, ``_sync/`` generated from it
(``scripts/synchro.py``); the hand-written primitives the two differ by are in pairs
(``workers``, ``calls``); ``books``, ``reporter``, ``registration`` and ``step`` are shared."""
