"""``orchestrator demo`` (the ``demo`` extra): the gateway workflow run by several replicas
and audited (``run``; ``processes`` for replicas as OS processes), and the chaos run
(``python -m orchestrator.demo.chaos``). Both run on the in-memory store of
``orchestrator.testing``, which only this package of the library imports.

``orchestrator.demo.workflows`` is public: the gateway workflow the demo runs, which
``examples/`` runs too (``examples/gateway.py``, the API server example).
"""
