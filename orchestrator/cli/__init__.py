"""The ``orchestrator`` command (the ``cli`` extra): ``main`` (the entry point, which turns
every failure into one line), ``commands`` (the Click group) of the subcommands in
``running`` (demo, run, web), the operators' ``status``, ``finding`` (find), ``history``,
``acting`` (retry, unlock, cancel), ``pausing`` (pause, resume) and ``auditing`` (audit),
and ``graph`` (the transition graph); what they share (``conventions``, ``connecting``,
``selecting``, ``listing``), and ``loading`` the user's orchestrator for ``run`` and
``graph``. It serves the other layers (the demo, the web page,
``orchestrator.operations``); none of them imports it."""
