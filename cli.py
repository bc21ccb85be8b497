"""Moved into results.py; this shim keeps old imports."""
from results import *  # noqa: F401,F403
from results import _bounded  # noqa: F401
