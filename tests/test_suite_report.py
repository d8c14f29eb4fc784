"""The suite's own report: without MONGODB_URI the server tier's skips fold into one line
of ``-ra``, so a failure is never buried under them, and every other skip keeps its line."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

CONFTEST = """
from tests.conftest import NO_SERVER, pytest_runtest_makereport  # the hook under test
"""

TESTS = """
import pytest

from tests.conftest import NO_SERVER


@pytest.mark.mongodb
@pytest.mark.skipif(True, reason=NO_SERVER)
@pytest.mark.parametrize("n", range(3))
def test_server_tier(n):
    pass


@pytest.mark.mongodb
def test_server_tier_skipping_itself():
    pytest.skip(NO_SERVER)


@pytest.mark.skipif(True, reason="another reason")
def test_other_skip():
    pass


def test_a_failure():
    assert False
"""


def test_the_server_tier_s_skips_are_one_line_and_other_skips_keep_theirs(
    tmp_path: Path,
) -> None:
    (tmp_path / "conftest.py").write_text(CONFTEST)
    (tmp_path / "test_tiers.py").write_text(TESTS)
    (tmp_path / "pytest.ini").write_text("[pytest]\nmarkers =\n    mongodb: the server tier\n")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("MONGODB_URI", None)
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-ra", "-p", "no:cacheprovider", "test_tiers.py"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        check=False,  # the session fails on purpose: its report is what is checked
        text=True,
        timeout=120,  # a bound on a hang, not a measured time
    )
    summary = result.stdout.split("short test summary info", 1)[-1].splitlines()
    tier = [line for line in summary if "MONGODB_URI is not set" in line]
    assert len(tier) == 1, result.stdout
    assert tier[0].startswith("SKIPPED [4] ") and "conftest.py:" in tier[0]
    assert any(line.startswith("SKIPPED [1] ") and "another reason" in line for line in summary)
    assert any(line.startswith("FAILED test_tiers.py::test_a_failure") for line in summary)
    assert "1 failed, 5 skipped" in summary[-1], result.stdout
