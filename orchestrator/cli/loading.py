"""Loading the user's orchestrator for ``orchestrator run`` and ``orchestrator graph``."""

from __future__ import annotations

import importlib
import os
import sys
from typing import Any

from pydantic import BaseModel, ValidationError

from orchestrator import AsyncOrchestrator, Orchestrator, Resource
from orchestrator.cli.conventions import CommandError
from orchestrator.core.errors import OrchestratorError
from orchestrator.core.validation import explain

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
    if isinstance(value, type) and not issubclass(value, Engine):
        # A class is not a factory of orchestrators: called, a model would say only that
        # its fields are missing (a page of pydantic's errors).
        raise CommandError(f"{target} is {_a_class(value)}, not {_EXPECTED}")
    if not isinstance(value, Engine) and callable(value):
        value = _called(target, value)
    if not isinstance(value, Engine):
        raise CommandError(f"{target} is a {type(value).__name__}, not {_EXPECTED}")
    return value


def _called(target: str, factory: Any) -> Any:
    """What the function ``target`` returns; what it raises, said in one line."""
    try:
        return factory()
    except OrchestratorError:
        raise
    except ValidationError as exc:  # pydantic's many lines, said in one
        raise CommandError(f"{target}() failed: {explain(exc, exc.title)}") from exc
    except Exception as exc:
        said = " ".join(str(exc).split())
        raise CommandError(f"{target}() failed: {type(exc).__name__}: {said}") from exc


_EXPECTED = (
    "an Orchestrator or AsyncOrchestrator (or a function of no arguments returning one),"
    " e.g. myapp.workers:orch"
)


def _a_class(cls: type) -> str:
    """What a target that is a class is, in the words of the error."""
    if issubclass(cls, Resource):
        return f"the Resource model {cls.__name__} (a document type)"
    if issubclass(cls, BaseModel):
        return f"the pydantic model {cls.__name__}"
    return f"the class {cls.__name__}"


__all__ = ["Engine", "load_orchestrator"]
