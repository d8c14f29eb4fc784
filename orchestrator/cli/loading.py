"""Loading the user's orchestrator for ``orchestrator run`` and ``orchestrator graph``."""

from __future__ import annotations

import importlib
import os
import sys
from typing import Any

from orchestrator import AsyncOrchestrator, Orchestrator
from orchestrator.cli.conventions import CommandError
from orchestrator.core.errors import OrchestratorError

Engine = Orchestrator | AsyncOrchestrator
"""What ``orchestrator run`` runs: either engine (the async one with ``asyncio.run``)."""


def load_orchestrator(target: str) -> Engine:
    """``module:attribute``: an Orchestrator or AsyncOrchestrator, or a function of no
    arguments returning one.

    The current directory is importable, as with ``python -m``.
    """
    module_name, sep, attribute = target.partition(":")
    if not sep or not module_name or not attribute:
        raise CommandError(f"expected module:attribute (e.g. myapp.workers:orch), not {target!r}")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name and module_name.startswith(exc.name):
            raise CommandError(
                f"cannot import {module_name!r}: no module named {exc.name!r}"
            ) from None
        raise CommandError(f"importing {module_name!r} failed: {exc}") from exc
    except Exception as exc:
        raise CommandError(
            f"importing {module_name!r} failed: {type(exc).__name__}: {exc}"
        ) from exc
    value: Any = module
    for part in attribute.split("."):
        if not hasattr(value, part):
            raise CommandError(f"module {module_name!r} has no attribute {attribute!r}")
        value = getattr(value, part)
    if not isinstance(value, Engine) and callable(value):
        try:
            value = value()
        except OrchestratorError:
            raise
        except Exception as exc:
            raise CommandError(f"{target}() failed: {type(exc).__name__}: {exc}") from exc
    if not isinstance(value, Engine):
        raise CommandError(
            f"{target} is a {type(value).__name__}, not an Orchestrator or AsyncOrchestrator"
        )
    return value


__all__ = ["Engine", "load_orchestrator"]
