"""The demo's workflows (API gateways and their certificates), shipped in the package so that
``orchestrator demo`` runs wherever the package is installed; ``examples/`` imports them."""
