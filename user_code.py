"""The student's own code, named on the command line as MODULE:CALLABLE and imported from their environment (the
current directory, then PYTHONPATH and the installed packages), so the scripts can measure their model, optimizer or
attention kernel beside ours:

    python bench_attention.py --grid flash --impl flash_triton:FlashAttention2
    python bench_e2e.py --model cs336_basics.model:BasicsTransformerLM --optimizer cs336_basics.optimizer:AdamW

spec_type() checks the form when the command line is parsed (a malformed spec is a usage error, exit 2); load()
imports it where it runs (in the child process of a configuration), and every failure to find or import it is a
LoadError whose message is one line, so that the row of the configuration can carry it. torch-free.
Nothing here does work at import time or changes global state on import.
"""
from __future__ import annotations

import argparse
import importlib
import os
import re
import sys
from typing import Any

# dotted Python names on both sides: cs336_basics.model:BasicsTransformerLM, flash:Outer.Inner
_DOTTED = r"[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*"
SPEC = re.compile(rf"^({_DOTTED}):({_DOTTED})$")


class LoadError(Exception):
    """The code a spec names cannot be found or imported; the message is one line and says which and why."""


def is_spec(text: str) -> bool:
    return SPEC.match(text) is not None


def spec_type(text: str) -> str:
    """argparse type of a MODULE:CALLABLE argument: the spec unchanged, or a one-line usage error."""
    if not is_spec(text):
        raise argparse.ArgumentTypeError(f"must be MODULE:CALLABLE (e.g. cs336_basics.model:BasicsTransformerLM), "
                                         f"got {text!r}")
    return text


def load(spec: str) -> Any:
    """The object a MODULE:CALLABLE spec names. The current directory is searched first, as `python -c` would:
    the scripts run from this repository, so without it a module beside the student's shell would be missed."""
    match = SPEC.match(spec)
    if match is None:
        raise LoadError(f"{spec!r} is not MODULE:CALLABLE")
    module_name, attribute = match.groups()
    cwd = os.getcwd()
    if cwd not in sys.path:
        sys.path.insert(0, cwd)
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name is not None and module_name.startswith(exc.name) and (
                len(exc.name) == len(module_name) or module_name[len(exc.name)] == "."):
            raise LoadError(f"cannot import {module_name} (for {spec}): no module named {exc.name!r} in the current "
                            f"directory ({cwd}), PYTHONPATH or the installed packages") from None
        raise LoadError(f"importing {module_name} (for {spec}) failed: {one_line(exc)}") from None
    except Exception as exc:  # noqa: BLE001 - any error in the student's module is theirs to see, in one line
        raise LoadError(f"importing {module_name} (for {spec}) failed: {one_line(exc)}") from None
    found: Any = module
    for part in attribute.split("."):
        try:
            found = getattr(found, part)
        except AttributeError:
            raise LoadError(f"{module_name} ({getattr(module, '__file__', None) or 'a namespace package'}) has no "
                            f"{attribute!r} (for {spec})") from None
    return found


def one_line(exc: BaseException) -> str:
    """`Type: first line of the message`, with the file and line of a SyntaxError."""
    first = (str(exc).strip().splitlines() or [""])[0]
    if isinstance(exc, SyntaxError) and exc.filename:
        first = f"{exc.msg} ({exc.filename}, line {exc.lineno})"
    return f"{type(exc).__name__}: {first}"
