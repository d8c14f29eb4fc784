"""Who acts, unless an action names someone: the one read of the environment the operator's
tools make (the pure rules are in ``rules``)."""

from __future__ import annotations

import getpass
import socket


def default_actor() -> str:
    """Who acts from the command line: the operating system's user at this host."""
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = "unknown"
    return f"{user}@{socket.gethostname()}"


__all__ = ["default_actor"]
