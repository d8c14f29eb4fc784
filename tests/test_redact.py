"""Credentials masked in log records (message, arguments, traceback, stack), and values
from the database made harmless for a terminal."""

from __future__ import annotations

import logging
import sys

import pytest

from orchestrator.core.redact import RedactingFilter, redact, visible

pytestmark = pytest.mark.pure

URI = "mongodb://app:s3cret@db:27017/"
MASKED = "mongodb://app:***@db:27017/"


def record(
    msg: object,
    args: tuple[object, ...] | None = None,
    exc_info: object = None,
    sinfo: str | None = None,
) -> logging.LogRecord:
    return logging.LogRecord(
        "orchestrator",
        logging.ERROR,
        __file__,
        1,
        msg,
        args,
        exc_info,
        sinfo=sinfo,  # type: ignore[arg-type]
    )


def test_the_message_is_formatted_then_masked_and_its_arguments_dropped() -> None:
    rec = record("connecting to %s as %r", (URI, "app"))
    assert RedactingFilter().filter(rec) is True
    assert (rec.msg, rec.args) == (f"connecting to {MASKED} as 'app'", None)
    assert rec.getMessage() == f"connecting to {MASKED} as 'app'"


def test_a_message_whose_arguments_do_not_fit_is_kept_as_its_text_masked() -> None:
    rec = record("to %s and %s " + URI, ("one",))
    assert RedactingFilter().filter(rec) is True
    assert (rec.msg, rec.args) == ("to %s and %s " + MASKED, None)
    odd = record(ValueError(URI))  # a message that is no string at all
    RedactingFilter().filter(odd)
    assert odd.msg == MASKED


def test_a_traceback_and_a_stack_are_masked_before_any_handler_formats_them() -> None:
    try:
        raise RuntimeError(f"cannot reach {URI}")
    except RuntimeError:
        exc_info = sys.exc_info()
    rec = record("failed", exc_info=exc_info, sinfo=f"Stack (most recent call last):\n {URI}")
    RedactingFilter().filter(rec)
    assert rec.exc_text is not None
    assert rec.exc_text.startswith("Traceback (most recent call last):")
    assert f"RuntimeError: cannot reach {MASKED}" in rec.exc_text and "s3cret" not in rec.exc_text
    assert rec.stack_info == f"Stack (most recent call last):\n {MASKED}"
    formatted = logging.Formatter().format(rec)
    assert "s3cret" not in formatted and MASKED in formatted


def test_a_traceback_already_formatted_is_masked_as_it_is() -> None:
    try:
        raise RuntimeError("other")
    except RuntimeError:
        exc_info = sys.exc_info()
    rec = record("failed", exc_info=exc_info)
    rec.exc_text = f"already: {URI}"
    RedactingFilter().filter(rec)
    assert rec.exc_text == f"already: {MASKED}"


def test_a_plain_record_keeps_no_traceback_or_stack() -> None:
    rec = record("plain")
    RedactingFilter().filter(rec)
    assert (rec.msg, rec.args, rec.exc_text, rec.stack_info) == ("plain", None, None, None)


def test_uris_and_secret_parameters_are_masked() -> None:
    assert redact(f"a {URI} b mongodb+srv://u:p@h/?password=x&w=1") == (
        f"a {MASKED} b mongodb+srv://u:***@h/?password=***&w=1"
    )
    assert redact("authMechanismProperties=AWS_SESSION_TOKEN:abc,x") == (
        "authMechanismProperties=AWS_SESSION_TOKEN:***,x"
    )


@pytest.mark.parametrize(
    ("text", "shown"),
    [
        ("plain text, ünïcode", "plain text, ünïcode"),
        ("", ""),
        ("\x1b[31mred", "\\x1b[31mred"),
        ("a\nb\tc\r", "a\\nb\\tc\\r"),
        ("bell\x07", "bell\\x07"),
        ("\u200bzero width", "\\u200bzero width"),
        ("é\x00", "é\\x00"),
    ],
)
def test_what_a_terminal_would_act_on_is_written_out(text: str, shown: str) -> None:
    assert visible(text) == shown
