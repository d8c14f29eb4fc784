"""The demo's workflow (API gateways and their certificates), shipped in the package so that
``orchestrator demo`` runs wherever the package is installed. Public: ``examples/`` runs
this very workflow (``examples/gateway.py``, the API server example), not a copy of it."""

from orchestrator.demo.workflows.gateway import Platform, Workflow, build, worker

__all__ = ["Platform", "Workflow", "build", "worker"]
