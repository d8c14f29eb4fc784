"""The ``orchestrator`` command (the ``cli`` extra): ``main`` (the entry point, which turns
every failure into one line), ``commands`` (the Click group) of the subcommands in
``running`` (demo, run, web), ``operators`` (status, unlock, retry) and ``graph`` (the
transition graph), what they share (``conventions``, ``connecting``), and ``loading`` the
user's orchestrator for ``run`` and ``graph``. It serves the other layers (the demo, the
web page, ``orchestrator.operations``); none of them imports it."""
