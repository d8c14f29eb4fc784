"""The operator's web page (the ``web`` extra): mount ``operator_app(database)`` in your
FastAPI or Starlette application, or run ``orchestrator web``."""

from orchestrator.tools.web import _requires  # noqa: F401  (first: names the missing extra)
from orchestrator.tools.web.app import operator_app

__all__ = ["operator_app"]
