"""The tutorial's app is the file its commands run: what a reader pastes is what is tested."""

from __future__ import annotations

from pathlib import Path

from tests.test_code_blocks import blocks

ROOT = Path(__file__).resolve().parent.parent
TUTORIAL = "docs/tutorial/first-app.md"


def test_the_tutorials_app_is_examples_first_app_verbatim() -> None:
    shown = [b.code for b in blocks((ROOT / TUTORIAL).read_text(), TUTORIAL)]
    assert (ROOT / "examples" / "first_app.py").read_text() in shown
