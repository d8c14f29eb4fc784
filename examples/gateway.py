"""The gateway workflow that ``orchestrator demo`` runs, as an example to run and read.

Its code ships inside the package, in ``orchestrator/demo/workflows/gateway.py`` and
``certificates.py`` (so the demo works wherever the package is installed); this module is
the name a clone uses for it: ``orchestrator run examples.gateway:worker`` there is
``orchestrator run orchestrator.demo.workflows:worker`` wherever the package is installed
(an ``AsyncOrchestrator``, which ``orchestrator run`` runs with ``asyncio.run``). The
workflow is async, written once for all of them.
"""

from orchestrator.demo.workflows import Platform, Workflow, build, worker

__all__ = ["Platform", "Workflow", "build", "worker"]
