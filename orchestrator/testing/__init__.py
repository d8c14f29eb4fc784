"""Test substrate: a fake clock and a thread-safe in-memory MongoDB.

Tests of the library, and users' tests of their own handlers, run several replicas in
threads against one database without a server and without sleeping.
"""

from orchestrator.testing.clock import FakeClock
from orchestrator.testing.memory import memory_database

__all__ = ["FakeClock", "memory_database"]
