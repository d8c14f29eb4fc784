"""The README's quickstart runs and does what it says."""

from __future__ import annotations

import pytest

from examples import quickstart


def test_the_quickstart_deletes_every_gateway_with_each_kind_once(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("MONGODB_URI", raising=False)
    assert quickstart.main() == 0
    out = capsys.readouterr().out
    assert "{'Deleted': 30}" in out
    assert "deletion steps in all: 90" in out
