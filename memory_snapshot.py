"""Moved into mem_profile.py (its snapshot reader); this name stays importable until integration."""
from mem_profile import *  # noqa: F401,F403
from mem_profile import BEFORE_RECORDING, PROJECT_ROOT  # noqa: F401
