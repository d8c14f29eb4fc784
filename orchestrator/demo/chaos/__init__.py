"""``python -m orchestrator.demo.chaos``: many replicas, many faults, then the invariants.

A seeded, reproducible run on the in-memory store. Replicas take turns ticking while a
FakeClock, advanced by the harness, stands for time; every replica reaches MongoDB through
``orchestrator.testing.faults``. Injected: replicas dying mid-step, mid-unlock and
mid-advance (a fresh replica replaces each), stale workers (a step stalls past its lease
while another replica takes over), steps that never return (cut off by ``step_timeout``),
transient driver errors, lost replies, slow operations, outages and partitions, clocks off
by up to the lock timeout, handler exceptions of every kind (some while recording the
error), non-outcomes, and malformed documents. Then every invariant is checked; the exit
status is 1 when one fails.

The pieces, one concept each: ``workload`` (the config, the Widget and its phases),
``pods`` (the replicas: spawned, ticked, crashed and replaced), what is injected
(``step_faults`` into the steps, ``network`` outages and partitions, ``arrivals`` the
resources and the malformed documents), ``ledger`` (what happened, as it happened),
``invariants`` (checked at the end, and the figures), ``harness`` (``Chaos``: the run and its loop)
and ``command`` (the command line).
"""

from orchestrator.demo.chaos.command import main
from orchestrator.demo.chaos.harness import Chaos
from orchestrator.demo.chaos.invariants import Figures
from orchestrator.demo.chaos.workload import ChaosConfig

__all__ = ["Chaos", "ChaosConfig", "Figures", "main"]
