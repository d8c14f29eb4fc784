"""The demo's workflow (API gateways and their certificates), shipped in the package so that
``orchestrator demo`` runs wherever the package is installed. Public: ``worker`` is one
replica for ``orchestrator run orchestrator.demo.workflows:worker``, and the example API
server (``orchestrator.demo.api_server``) and ``examples/`` run this very workflow, not a
copy of it."""

from orchestrator.demo.workflows.gateway import Platform, Workflow, build, worker

__all__ = ["Platform", "Workflow", "build", "worker"]
