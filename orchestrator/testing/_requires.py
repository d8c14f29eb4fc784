"""Fail at import with what to install when the ``testing`` extra is missing."""

from orchestrator.core.distribution import require

require("testing", ("mongomock",), "orchestrator.testing (the in-memory store)")
