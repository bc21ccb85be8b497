"""Moved into mem_profile.py (accounting, saved for backward, the checkpointing prediction); importable until
integration."""
from mem_profile import *  # noqa: F401,F403
from mem_profile import FP32_BYTES  # noqa: F401
