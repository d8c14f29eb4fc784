"""Credentials never reach a log line or a terminal."""

from __future__ import annotations

import re

_USERINFO = re.compile(r"(?P<scheme>mongodb(?:\+srv)?://)(?P<user>[^:@/\s]+):(?P<pw>[^@/\s]*)@")
_SECRET_PARAMS = re.compile(
    r"(?P<key>(?:password|pwd|secret|token|tlsCertificateKeyFilePassword)=)[^&\s]+",
    re.IGNORECASE,
)


def redact(text: str) -> str:
    """Mask the password of every MongoDB URI in ``text`` and secret query parameters."""
    text = _USERINFO.sub(r"\g<scheme>\g<user>:***@", text)
    return _SECRET_PARAMS.sub(r"\g<key>***", text)
