"""Credentials never reach a log line or a terminal."""

from __future__ import annotations

import logging
import re

_USERINFO = re.compile(
    r"(?P<scheme>mongodb(?:\+srv)?://)(?P<user>[^:@/\s]+):(?P<pw>[^@\s]*)@", re.IGNORECASE
)
_SECRET_PARAMS = re.compile(
    r"(?P<key>(?:password|pwd|secret|token|tlsCertificateKeyFilePassword)=)[^&\s]+",
    re.IGNORECASE,
)
_AWS_TOKEN = re.compile(r"(?P<key>AWS_SESSION_TOKEN:)[^,&\s]+", re.IGNORECASE)


def redact(text: str) -> str:
    """Mask the password of every MongoDB URI in ``text`` and secret query parameters."""
    text = _USERINFO.sub(r"\g<scheme>\g<user>:***@", text)
    text = _AWS_TOKEN.sub(r"\g<key>***", text)
    return _SECRET_PARAMS.sub(r"\g<key>***", text)


class RedactingFilter(logging.Filter):
    """Redacts a record's message and traceback before any handler formats it: a driver
    error chained under a StoreError would otherwise print its raw text in the traceback."""

    _formatter = logging.Formatter()

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
        except (TypeError, ValueError):
            message = str(record.msg)
        record.msg, record.args = redact(message), None
        if record.exc_info and not record.exc_text:
            record.exc_text = self._formatter.formatException(record.exc_info)
        if record.exc_text:
            record.exc_text = redact(record.exc_text)
        if record.stack_info:
            record.stack_info = redact(record.stack_info)
        return True


def visible(text: str) -> str:
    """``text`` with what a terminal would act on (ESC sequences, other control characters)
    written out as escapes: a value read from the database can neither restyle nor rewrite
    an operator's screen."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode() for c in text)
