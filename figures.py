"""Moved into report.py; this shim keeps old imports."""
from report import *  # noqa: F401,F403
from report import Drawn, draw as write_figures  # noqa: F401
