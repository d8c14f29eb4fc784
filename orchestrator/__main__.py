"""``python -m orchestrator ...``: the same command as the ``orchestrator`` script."""

import sys

from orchestrator.tools.cli import main

sys.exit(main())
