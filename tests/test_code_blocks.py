"""Every code block in the README and the docs site (``docs/**/*.md``) runs as pasted.

``python`` blocks run alone in a fresh interpreter; ``bash`` blocks run in bash with
``set -e`` (``uv run X`` means X from this environment, which is what it does in a
clone); ``console`` blocks run each ``$ command`` and must print what is shown; ``text``
blocks (a tree, a diagram, a printed table) are not code; ``javascript`` (mongosh) has no runner
here and always carries a skip. A block that cannot run here says why on the line
before it: ``<!-- readme-test: skip: REASON -->``. A MyST directive (```` ```{toctree} ````,
```` ```{autoclass} ````) is the site's markup, not code.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
FENCE = re.compile(r"^```(\S*)\s*$")
SKIP = re.compile(r"^<!-- readme-test: skip: (?P<reason>.+\S) -->$")
LANGUAGES = {"python", "bash", "console", "text", "javascript"}
# No runner here: a mongosh snippet always says why it is skipped.
NO_RUNNER = {"javascript"}
# `uv run X` in a pasted line is X in the environment the tests run in.
UV = 'uv() { if [ "$1" = run ]; then shift; "$@"; else command uv "$@"; fi; }\n'


@dataclass(frozen=True)
class Block:
    path: str
    line: int
    language: str
    code: str
    skip: str | None

    def __str__(self) -> str:
        return f"{self.path}:{self.line}:{self.language}"


def blocks(text: str, path: str = "README.md") -> list[Block]:
    found: list[Block] = []
    lines = text.splitlines()
    index = 0
    while index < len(lines):
        opened = FENCE.match(lines[index])
        if opened is None:
            index += 1
            continue
        before = next((line for line in reversed(lines[:index]) if line.strip()), "")
        marker = SKIP.match(before.strip())
        end = index + 1
        while not lines[end].startswith("```"):
            end += 1
        found.append(
            Block(
                path=path,
                line=index + 1,
                language=opened.group(1),
                code="\n".join(lines[index + 1 : end]) + "\n",
                skip=marker.group("reason") if marker else None,
            )
        )
        index = end + 1
    return found


PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
BLOCKS = [
    block
    for page in PAGES
    if "_build" not in page.parts
    for block in blocks(page.read_text(), str(page.relative_to(ROOT)))
    if not block.language.startswith("{")
]


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "MONGODB_URI"}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env["PYTHONPATH"] = str(ROOT)
    return env


def _run(argv: list[str], stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        argv,
        input=stdin,
        cwd=ROOT,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def test_every_block_is_tagged_and_every_skip_says_why() -> None:
    assert any(b.path == "README.md" for b in BLOCKS), "the README has no code blocks?"
    for block in BLOCKS:
        assert block.language in LANGUAGES, f"{block}: tag it one of {sorted(LANGUAGES)}"
        assert block.skip is None or block.language != "text", f"{block}: text never runs"
        assert block.language not in NO_RUNNER or block.skip, f"{block}: say why it is skipped"
    # The parser itself: a skip marker binds to the block right after it, only that one.
    sample = "<!-- readme-test: skip: needs docker -->\n```bash\ndocker ps\n```\n```text\nx\n```\n"
    assert [(b.language, b.skip) for b in blocks(sample)] == [
        ("bash", "needs docker"),
        ("text", None),
    ]


RUNNABLE = [b for b in BLOCKS if b.language != "text" and b.skip is None]


@pytest.mark.parametrize("block", RUNNABLE, ids=str)
def test_the_block_runs_as_pasted(block: Block) -> None:
    if block.language == "python":
        done = _run([sys.executable, "-"], stdin=block.code)
        assert done.returncode == 0, f"{block}\n{done.stdout}\n{done.stderr}"
    elif block.language == "bash":
        done = _run(["bash", "-e", "-c", UV + block.code])
        assert done.returncode == 0, f"{block}\n{done.stdout}\n{done.stderr}"
    else:
        commands = block.code.split("$ ")[1:]
        assert commands, f"{block}: a console block shows at least one `$ command`"
        for shown in commands:
            command, _, expected = shown.partition("\n")
            done = _run(["bash", "-c", UV + command])
            assert (done.stdout + done.stderr).strip() == expected.strip(), str(block)
