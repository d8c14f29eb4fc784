"""``orchestrator demo`` (the ``demo`` extra): the gateway workflow run by several replicas
and audited (``run``; ``processes`` for replicas as OS processes), and the chaos run
(``python -m orchestrator.demo.chaos``). Both run on the in-memory store of
``orchestrator.testing``, which only this package of the library imports.

``orchestrator.demo.workflows`` is public: the gateway workflow the demo runs, which
``orchestrator run orchestrator.demo.workflows:worker`` runs as one replica, as does the
example API server that embeds it (``api_server``, the ``api`` extra). ``examples/`` names
both in a clone (``examples/gateway.py``, ``examples/api_server.py``).
"""
