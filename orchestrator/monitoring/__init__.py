"""Listeners that ship with the library, each on its own extra: Prometheus metrics
(``orchestrator.monitoring.prometheus``, the ``metrics`` extra) and OpenTelemetry spans
(``orchestrator.monitoring.tracing``, the ``tracing`` extra). Importing one without its
extra raises ``ModuleNotFoundError`` naming the extra to install.
"""
