"""Settings and registration fail at construction and decoration time, clearly."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from orchestrator import (
    AsyncOrchestrator,
    ConfigError,
    Lease,
    Listener,
    Orchestrator,
    Resource,
    Settings,
    StepFinishedEvent,
)
from orchestrator.testing import FakeClock, async_memory_database, memory_database


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"lock_timeout": -1}, "lock_timeout"),
        ({"lock_timeout": 0}, "lock_timeout"),
        ({"tick": 0}, "tick"),
        ({"tick": 60, "lock_timeout": 30}, "must not exceed lock_timeout"),
        ({"max_concurrency": 0}, "max_concurrency"),
        ({"max_concurrency": True}, "max_concurrency"),
        ({"max_attempts": 0}, "max_attempts"),
        ({"write_concern": "most"}, "write_concern"),
        ({"write_concern": 0}, "write_concern"),
        ({"step_timeout": 5, "lock_timeout": 30}, "step_timeout"),
        ({"replica_id": ""}, "replica_id"),
        ({"lock_timout": 30}, "lock_timout"),
        ({"relock_policy": "fast"}, "relock_policy"),
    ],
)
def test_invalid_settings_raise_a_clear_error_at_construction(
    options: dict[str, Any], message: str
) -> None:
    with pytest.raises(ConfigError, match=message):
        Orchestrator(memory_database(), **options)


@pytest.mark.pure
@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"lock_timeout": -1}, "invalid orchestrator settings: lock_timeout=-1: must be > 0"),
        (
            {"tick": "soon"},
            "invalid orchestrator settings: tick='soon': must be a valid number",
        ),
        (
            {"max_concurrency": 0, "max_wait": 10**9},
            "invalid orchestrator settings: max_concurrency=0: must be >= 1;"
            " max_wait=1000000000: must be <= 2592000",
        ),
        (
            {"lock_timout": 30},
            "invalid orchestrator settings: lock_timout: no such field"
            " (did you mean 'lock_timeout'?)",
        ),
        (
            {"tick": 60, "lock_timeout": 30},
            "invalid orchestrator settings: tick (60.0s) must not exceed lock_timeout (30.0s)",
        ),
        (
            {"step_timeout": 5, "lock_timeout": 30},
            "invalid orchestrator settings: step_timeout (5s) must be at least lock_timeout"
            " (30s): a step is given its whole lease to run in, and step_timeout stops one"
            " the heartbeat keeps extending past it",
        ),
    ],
)
def test_a_configuration_error_names_the_field_the_value_and_what_is_allowed(
    options: dict[str, Any], message: str
) -> None:
    with pytest.raises(ConfigError) as caught:
        Settings.build(**options)
    text = str(caught.value)
    assert text.startswith(message)
    # One line, none of pydantic's dump: no error codes, no documentation link.
    assert "\n" not in text and "pydantic.dev" not in text and "type=" not in text


def test_handler_options_and_submitted_documents_are_explained_the_same_way() -> None:
    orch = Orchestrator(memory_database())
    with pytest.raises(ConfigError) as caught:

        @orch.phase(Gateway, "Creating", max_atempts=3)
        def create(lease: Lease[Gateway]) -> None: ...

    assert str(caught.value) == (
        'invalid handler options of gateways {"phase": "Creating"}: max_atempts: no such field'
        " (did you mean 'max_attempts'?)"
    )
    with pytest.raises(ConfigError) as caught:
        orch.submit(Gateway, {"name": 3, "phase": "Creating"})
    assert str(caught.value) == "invalid Gateway to submit: name=3: must be a valid string"


@pytest.mark.pure
def test_the_step_timeout_rule_is_in_the_settings_reference() -> None:
    """The API reference is generated from the fields' descriptions: the rule and its
    reason are there, not only in the error a wrong value meets."""
    said = Settings.model_fields["step_timeout"].description or ""
    assert "At least lock_timeout" in said and "whole lease" in said


@pytest.mark.pure
def test_a_replica_id_of_none_is_the_documented_default() -> None:
    """``replica_id=None`` (an application passing on an unset option) means the default,
    host-pid-random, as the settings say; it was refused as not a string."""
    host, pid = socket.gethostname(), os.getpid()
    for settings in (Settings(replica_id=None), Settings.build(replica_id=None), Settings()):
        assert settings.replica_id.startswith(f"{host}-{pid}-")
    assert Settings(replica_id=None).replica_id != Settings(replica_id=None).replica_id
    assert "host-pid-random" in (Settings.model_fields["replica_id"].description or "")


@pytest.mark.parametrize("engine", [Orchestrator, AsyncOrchestrator])
def test_either_engine_takes_replica_id_none_as_the_default(engine: Any) -> None:
    db = memory_database() if engine is Orchestrator else async_memory_database()
    orch = engine(db, replica_id=None)
    assert orch.replica_id.startswith(f"{socket.gethostname()}-{os.getpid()}-")


def test_settings_object_or_keywords_not_both() -> None:
    with pytest.raises(ConfigError, match="not both"):
        Orchestrator(memory_database(), Settings(), tick=2)
    orch = Orchestrator(memory_database(), Settings(lock_timeout=60, tick=2))
    assert orch.settings.lock_timeout == 60
    assert orch.settings.relock_floor == 2


class Gateway(Resource):
    collection = "gateways"
    name: str


class Nameless(Resource):
    pass


def test_a_second_handler_for_the_same_phase_raises_at_decoration_time() -> None:
    orch = Orchestrator(memory_database())

    @orch.phase(Gateway, "Deleting")
    def first(lease: Lease[Any]) -> None: ...

    with pytest.raises(ConfigError, match="already handles"):

        @orch.phase("gateways", "Deleting")
        def second(lease: Lease[Any]) -> None: ...

    other = Orchestrator(memory_database())
    other.phase(Gateway, "Deleting")(first)  # the registry is per orchestrator


def test_the_decorator_returns_the_function_unchanged_and_checks_options() -> None:
    orch = Orchestrator(memory_database())

    def handler(lease: Lease[Any]) -> None: ...

    assert orch.phase(Gateway, "Creating")(handler) is handler
    assert orch.when(Gateway, {"state": "Deleted", "phase": "Created"})(handler) is handler
    with pytest.raises(ConfigError, match="max_atempts"):
        orch.phase(Gateway, "Other", max_atempts=3)
    with pytest.raises(ConfigError, match="max_attempts"):
        orch.phase(Gateway, "Other", max_attempts=0)


@pytest.mark.parametrize(
    ("target", "phase"),
    [(Nameless, "Creating"), ("", "Creating"), ("gateways", ""), ("gateways", "$x"), (42, "A")],
)
def test_bad_targets_and_phases_are_refused(target: Any, phase: str) -> None:
    with pytest.raises(ConfigError):
        Orchestrator(memory_database()).phase(target, phase)


def test_when_filters_cannot_select_on_the_lease() -> None:
    orch = Orchestrator(memory_database())
    with pytest.raises(ConfigError, match="lockedAt"):
        orch.when("gateways", {"lockedAt": {"$exists": True}})(lambda lease: None)
    with pytest.raises(ConfigError):
        orch.when("gateways", {})(lambda lease: None)


def test_a_when_handler_moves_desired_state_into_a_phase() -> None:
    clock = FakeClock()
    db = memory_database(clock=clock)
    orch = Orchestrator(db, clock=clock)

    @orch.when(Gateway, {"state": "Deleted", "phase": {"$in": ["Created", "Stopped"]}})
    def begin_deletion(lease: Lease[Gateway]) -> Any:
        return lease.advance("Deleting")

    orch.submit(Gateway, {"name": "a", "phase": "Created", "state": "Running"})
    orch.submit(Gateway, {"name": "b", "phase": "Created", "state": "Deleted"})
    orch.submit(Gateway, {"name": "c", "phase": "Creating", "state": "Deleted"})
    orch.run_once()
    phases = {d["name"]: d["phase"] for d in db.gateways.find({})}
    assert phases == {"a": "Created", "b": "Deleting", "c": "Creating"}


def test_lease_field_names_follow_the_model_and_refuse_managed_fields() -> None:
    class Domain(Resource):
        collection = "domains"
        custom_domain: str | None = None

    clock = FakeClock()
    db = memory_database(clock=clock)
    orch = Orchestrator(db, clock=clock)
    refused: list[str] = []

    @orch.phase(Domain, "Creating")
    def create(lease: Lease[Domain]) -> Any:
        try:
            lease.unlock(locked_at=None)
        except ConfigError as exc:
            refused.append(str(exc))
        return lease.advance("Created", custom_domain="shop.example.com")

    orch.submit(Domain, {"phase": "Creating"})
    orch.run_once()
    stored = db.domains.find_one({})
    assert stored is not None
    assert stored["customDomain"] == "shop.example.com"
    assert refused and "lockedAt" in refused[0]


# -- refused at construction, not at the first step -----------------------------------------


@pytest.mark.parametrize(
    ("engine", "make_db", "said"),
    [
        (
            "threaded",
            async_memory_database,
            "not an AsyncDatabase: use AsyncOrchestrator",
        ),
        ("async", memory_database, "not a sync Database: use Orchestrator"),
        ("threaded", lambda: {"not": "a database"}, "not dict"),
        ("async", lambda: "mongodb://localhost", "not str"),
    ],
)
def test_an_engine_refuses_a_database_of_the_other_driver_at_construction(
    engine: str, make_db: Any, said: str
) -> None:
    """Before the fix the wrong database was accepted and the first claim failed with a
    TypeError (``orchestrator run``: a traceback)."""
    runner = Orchestrator if engine == "threaded" else AsyncOrchestrator
    with pytest.raises(ConfigError, match=said) as refused:
        runner(make_db())
    assert "\n" not in str(refused.value)


def test_orchestrator_run_says_which_database_in_one_line(tmp_path: Path) -> None:
    (tmp_path / "wrongworker.py").write_text(
        "from orchestrator import Orchestrator\n"
        "from orchestrator.testing import async_memory_database\n"
        "worker = Orchestrator(async_memory_database())\n"
    )
    result = subprocess.run(
        [sys.executable, "-m", "orchestrator", "run", "wrongworker:worker"],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent)},
        capture_output=True,
        text=True,
        timeout=60,  # a bound against hanging, not a timing claim
        check=False,
    )
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    assert "not an AsyncDatabase: use AsyncOrchestrator" in result.stderr


class _AsyncMethods(Listener):
    async def step_finished(self, event: StepFinishedEvent) -> None:  # type: ignore[override]
        raise AssertionError("never awaited")


def test_a_listener_with_an_async_method_is_refused_where_it_is_added() -> None:
    """Before the fix it was accepted, and the coroutine it returned was never awaited:
    the listener silently got nothing."""
    with pytest.raises(ConfigError, match=r"_AsyncMethods.step_finished is async"):
        Orchestrator(memory_database(), listeners=[_AsyncMethods()])
    orch = AsyncOrchestrator(async_memory_database())
    with pytest.raises(ConfigError, match="never awaited"):
        orch.add_listener(_AsyncMethods())


@pytest.mark.parametrize(
    ("history", "chars", "ok"),
    [
        (20, 4000, True),
        (1000, 1600, True),
        (1000, 100_000, False),
        (600, 10_000, False),
        (0, 100_000, True),
    ],
)
def test_a_history_cannot_grow_a_document_past_a_quarter_of_its_limit(
    history: int, chars: int, ok: bool
) -> None:
    """At their limits, history x traceback_chars could keep ~100 MiB on a document: a
    write refused as too large would leave a step's outcome unwritten. Refused at once."""
    if ok:
        Settings.build(history=history, traceback_chars=chars)
    else:
        with pytest.raises(ConfigError, match=r"may keep .* MiB on a document"):
            Settings.build(history=history, traceback_chars=chars)
