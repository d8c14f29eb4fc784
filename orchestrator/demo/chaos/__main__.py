"""``python -m orchestrator.demo.chaos``."""

import sys

from orchestrator.demo.chaos.command import main

if __name__ == "__main__":
    sys.exit(main())
