"""Shim: moved into kernel_tables.py (bench_e2e.py, e2e_tables.py and test_gpu.py import this name)."""
from kernel_tables import *  # noqa: F401,F403
