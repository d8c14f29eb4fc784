"""Sphinx configuration of the docs site: ``uv run sphinx-build -W --keep-going docs docs/_build``.

Pages are Markdown (MyST), so tests/test_code_blocks.py runs their code blocks as it runs the
README's; the API reference is generated from the docstrings of the names
``orchestrator/__init__.py`` exports, the CLI reference from the click commands.
"""

from __future__ import annotations

import sys
from importlib.metadata import version as _version
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent / "_ext"))

project = "mongo-orchestrator"
author = "the mongo-orchestrator authors"
release = _version("mongo-orchestrator")
version = release

extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
    "sphinx_click",
    "reference",  # docs/_ext/reference.py: settings, events and metrics from the code
]
source_suffix = {".md": "markdown"}
exclude_patterns = ["_build", "**/*.json"]
myst_heading_anchors = 3
myst_enable_extensions = ["colon_fence", "deflist"]

autodoc_member_order = "bysource"
autodoc_typehints = "description"
autodoc_default_options = {"members": True, "undoc-members": False}

html_theme = "furo"
html_title = f"mongo-orchestrator {release}"
