"""The listeners of one replica, without a replica: who may register, that every listener
hears every event, and that one that raises is counted, logged once, and breaks nothing."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator

import pytest

from orchestrator.core.errors import ConfigError
from orchestrator.core.events import (
    ClockMeasuredEvent,
    IdleProbeEvent,
    Listener,
    Listeners,
)

pytestmark = pytest.mark.pure

CLOCK = ClockMeasuredEvent("pod-1", 0.25, 0.01, True)
PROBE = IdleProbeEvent("pod-1", "jobs", ("jobs.Running",), False, 0.02)


class Recording(Listener):
    def __init__(self) -> None:
        self.heard: list[object] = []

    def clock_measured(self, event: ClockMeasuredEvent) -> None:
        self.heard.append(event)

    def idle_probe(self, event: IdleProbeEvent) -> None:
        self.heard.append(event)


class Raising(Listener):
    def clock_measured(self, event: ClockMeasuredEvent) -> None:
        raise RuntimeError("boom")


def test_none_registered_is_inactive_and_emitting_calls_nothing() -> None:
    listeners = Listeners("pod-1")
    assert listeners.active == () and listeners.errors == 0
    listeners.emit(CLOCK)
    assert listeners.errors == 0


def test_listeners_given_at_start_and_added_later_all_hear_each_event_in_order() -> None:
    first, second, third = Recording(), Recording(), Recording()
    listeners = Listeners("pod-1", [first, second])
    assert listeners.active == (first, second)
    listeners.add(third)
    assert listeners.active == (first, second, third)
    listeners.emit(CLOCK)
    listeners.emit(PROBE)
    assert first.heard == second.heard == third.heard == [CLOCK, PROBE]
    assert listeners.errors == 0


def test_adding_replaces_the_tuple_a_worker_may_be_iterating() -> None:
    listeners = Listeners("pod-1", [Recording()])
    before = listeners.active
    listeners.add(Recording())
    assert len(before) == 1 and len(listeners.active) == 2


@pytest.mark.parametrize("thing", [object(), None, Recording])
def test_only_a_listener_instance_registers(thing: object) -> None:
    listeners = Listeners("pod-1")
    with pytest.raises(ConfigError) as raised:
        listeners.add(thing)  # type: ignore[arg-type]
    assert str(raised.value) == (
        f"a listener subclasses orchestrator.Listener, not {type(thing).__name__}"
    )
    assert listeners.active == ()
    with pytest.raises(ConfigError):
        Listeners("pod-1", [thing])  # type: ignore[list-item]


class AsyncHook(Listener):
    async def lease_lost(self, event: object) -> None:  # type: ignore[override]
        """Never awaited: refused."""


class AsyncGeneratorHook(Listener):
    async def idle_probe(self, event: object) -> AsyncIterator[None]:  # type: ignore[override]
        yield None


@pytest.mark.parametrize(
    ("cls", "method"), [(AsyncHook, "lease_lost"), (AsyncGeneratorHook, "idle_probe")]
)
def test_an_async_method_is_refused_as_it_would_never_be_awaited(
    cls: type[Listener], method: str
) -> None:
    listeners = Listeners("pod-1")
    with pytest.raises(ConfigError) as raised:
        listeners.add(cls())
    assert str(raised.value) == (
        f"{cls.__qualname__}.{method} is async: listeners are called on the step's path "
        "and never awaited; make it a plain def (hand slow work to a queue or a task of "
        "your own)"
    )
    assert listeners.active == ()


def test_a_listener_that_raises_is_counted_logged_once_and_the_others_still_hear(
    caplog: pytest.LogCaptureFixture,
) -> None:
    raising, other_raising, after = Raising(), Raising(), Recording()
    listeners = Listeners("pod-7", [raising, other_raising, after])
    with caplog.at_level(logging.ERROR, logger="orchestrator"):
        listeners.emit(CLOCK)
        listeners.emit(CLOCK)
        listeners.emit(PROBE)  # Raising does not override idle_probe: no error
    assert after.heard == [CLOCK, CLOCK, PROBE]
    assert listeners.errors == 4
    logged = [r for r in caplog.records if r.name == "orchestrator"]
    assert len(logged) == 2  # each listener's first error only
    for record in logged:
        assert record.levelno == logging.ERROR
        assert record.getMessage() == (
            "listener Raising.clock_measured raised; the step goes on (further errors of this "
            "listener are counted, not logged)"
        )
        assert record.exc_info is not None and isinstance(record.exc_info[1], RuntimeError)
        assert (record.replica, record.listener, record.event, record.outcome) == (  # type: ignore[attr-defined]
            "pod-7",
            "Raising",
            "clock_measured",
            "listener-error",
        )
