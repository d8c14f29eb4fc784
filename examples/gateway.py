"""The gateway workflow that ``orchestrator demo`` runs, as an example to run and read.

Its code ships inside the package, in ``orchestrator/demo/workflows/gateway.py`` and
``certificates.py`` (so the demo works wherever the package is installed); this module is
the name examples use: ``orchestrator run examples.gateway:worker`` from a clone (an
``AsyncOrchestrator``, which ``orchestrator run`` runs with ``asyncio.run``), and the API
server example's ``build``. The workflow is async, written once for all of them.
"""

from orchestrator.demo.workflows import Platform, Workflow, build, worker

__all__ = ["Platform", "Workflow", "build", "worker"]
