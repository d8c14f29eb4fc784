"""The committed sync store and engine are what the generator makes of the async ones today."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _synchro() -> ModuleType:
    spec = importlib.util.spec_from_file_location("synchro", ROOT / "scripts" / "synchro.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


synchro = _synchro()


@pytest.mark.parametrize("source", synchro.sources(), ids=lambda p: p.name)
def test_generated_sync_module_is_up_to_date(source: Path) -> None:
    committed = synchro.target(source).read_text(encoding="utf-8")
    assert committed.startswith("# Generated from"), "the generated file lost its header"
    assert committed == synchro.generate(source), (
        f"{synchro.target(source).relative_to(ROOT)} is stale: "
        "run `uv run python scripts/synchro.py` and commit the result"
    )


def test_every_async_source_has_a_generated_twin() -> None:
    sources = {synchro.target(p) for p in synchro.sources()}
    generated = {
        p
        for package in synchro.PACKAGES
        for p in (package / "_sync").glob("*.py")
        if p.name != "__init__.py"
    }
    names = {p.relative_to(ROOT).as_posix() for p in sources}
    assert {"orchestrator/mongo/_sync/store.py", "orchestrator/runners/_sync/engine.py"} <= names
    assert sources == generated, "a generated module without its async source, or the reverse"
