"""The gateway workflow that ``orchestrator demo`` runs, as an example to run and read.

Its code ships inside the package, in ``orchestrator/tools/workflows/gateway.py`` and
``certificates.py`` (so the demo works wherever the package is installed); this module is
the name examples use: ``orchestrator run examples.gateway:worker`` from a clone, and the
API server example's ``build``.
"""

from orchestrator.tools.workflows.gateway import Platform, Workflow, build, worker

__all__ = ["Platform", "Workflow", "build", "worker"]
