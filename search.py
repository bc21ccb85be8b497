"""Shim until integration: the longest-context search (probes, bisection, answer) is in e2e_tables.py, torch-free,
where the sweep and report.py both read it."""
from e2e_tables import PROBE_BUDGET, RESOLUTION, SEARCH_START, Bisection, doubling_sizes  # noqa: F401
from e2e_tables import search_answer as answer  # noqa: F401
