"""The ``orchestrator`` command (the ``cli`` extra): ``main`` (the entry point, which turns
every failure into one line), the Click ``commands``, ``loading`` the user's orchestrator
for ``run`` and ``graph``, and the transition ``graph``. It serves the other layers (the
demo, the web page, ``orchestrator.operations``); none of them imports it."""
