"""Moved: the configuration is in results.py (torch-free), re-exported by model.py. This shim keeps old imports."""
from results import *  # noqa: F401,F403
from results import _check_preset  # noqa: F401
