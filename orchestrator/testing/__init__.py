"""Test substrate: a fake clock and a thread-safe in-memory MongoDB, sync and async.

Tests of the library, and users' tests of their own handlers, run several replicas in
threads (or tasks) against one database without a server and without sleeping.
"""

from orchestrator.testing import _requires  # noqa: F401  (first: names the missing extra)
from orchestrator.testing.async_memory import async_memory_database, async_view
from orchestrator.testing.clock import FakeClock
from orchestrator.testing.memory import memory_database

__all__ = ["FakeClock", "async_memory_database", "async_view", "memory_database"]
