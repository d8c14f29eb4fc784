"""Benchmarks of the orchestrator against the pattern it replaces.

Run ``uv run python -m bench`` (``--size tiny|small|full``, ``--out docs/benchmarks.md``).
Every figure is a ratio or a per-step cost measured side by side in one run, on the same
store, so the store's own speed cancels out of the ratios; nothing here is asserted.
"""
