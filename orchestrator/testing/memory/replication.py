"""Write concerns, waited for as on a replica set that may lose its majority.

mongomock acknowledges every write at once; a server makes a write whose concern asks for
a majority wait for one. Tests of the library's behaviour when the replica set cannot
acknowledge (code 64, or a write that blocks) take the majority away here.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from pymongo.errors import WTimeoutError
from pymongo.write_concern import WriteConcern

__all__ = ["Replication"]


class Replication:
    """Whether a majority of the replica set acknowledges writes (by default it does).

    While it does not (``lose_majority()``), a write whose write concern asks for more than
    the primary (``w="majority"``, ``w>1``, or no ``w``: the 5.0+ implicit default is
    majority) is applied, then waits, as on a server: with a ``wtimeout`` it fails with
    ``WTimeoutError`` (code 64, ``errInfo.wtimeout``) at once, the wait elided; without one
    it blocks until ``restore_majority()``. ``stalled`` counts writes blocked now and
    ``timed_out`` those failed so far; ``wait_until`` lets a test wait for either.
    """

    def __init__(self) -> None:
        self._changed = threading.Condition()
        self._majority = True
        self.stalled = 0
        self.timed_out = 0

    def lose_majority(self) -> None:
        with self._changed:
            self._majority = False
            self._changed.notify_all()

    def restore_majority(self) -> None:
        with self._changed:
            self._majority = True
            self._changed.notify_all()

    def wait_until(self, ready: Callable[[], bool]) -> None:
        """Block until ``ready()``, re-checked whenever a write stalls, times out or resumes."""
        with self._changed:
            self._changed.wait_for(ready)

    def acknowledge(self, concern: WriteConcern) -> None:
        """Called after a write applied: return when its write concern is satisfied."""
        document = concern.document
        w = document.get("w", "majority")
        if w in (0, 1):
            return
        with self._changed:
            if self._majority:
                return
            wtimeout = document.get("wtimeout")
            if not wtimeout:
                self.stalled += 1
                self._changed.notify_all()
                try:
                    self._changed.wait_for(lambda: self._majority)
                finally:
                    self.stalled -= 1
                    self._changed.notify_all()
                return
            self.timed_out += 1
            self._changed.notify_all()
        message = "waiting for replication timed out"
        error = {
            "code": 64,
            "codeName": "WriteConcernFailed",
            "errmsg": message,
            "errInfo": {
                "wtimeout": True,
                "writeConcern": {"w": w, "wtimeout": wtimeout, "provenance": "clientSupplied"},
            },
        }
        raise WTimeoutError(message, 64, error)
