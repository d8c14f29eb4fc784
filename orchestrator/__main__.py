"""``python -m orchestrator ...``: the same command as the ``orchestrator`` script."""

import sys

from orchestrator.cli.main import main

sys.exit(main())
