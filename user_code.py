"""The student's own code, named on the command line as MODULE:CALLABLE and imported from their environment (the
current directory, then PYTHONPATH and the installed packages), so the scripts can measure their model, optimizer or
attention kernel beside ours:

    python3 bench_attention.py --grid flash --impl flash_triton:FlashAttention2
    python3 bench_e2e.py --model cs336_basics.model:BasicsTransformerLM --optimizer cs336_basics.optimizer:AdamW

named_or_spec() checks the form when the command line is parsed (a malformed spec is a usage error, exit 2); load()
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
from typing import Any, Callable, Iterable

# dotted Python names on both sides: cs336_basics.model:BasicsTransformerLM, flash:Outer.Inner
_DOTTED = r"[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*"
SPEC = re.compile(rf"^({_DOTTED}):({_DOTTED})$")


class LoadError(Exception):
    """The code a spec names cannot be found or imported; the message is one line and says which and why."""


def is_spec(text: str) -> bool:
    return SPEC.match(text) is not None


def named_or_spec(names: Iterable[str]) -> Callable[[str], str]:
    """argparse type of a flag that takes one of `names` (ours) or a MODULE:CALLABLE (yours)."""
    names = tuple(names)

    def parse(text: str) -> str:
        if text in names or is_spec(text):
            return text
        raise argparse.ArgumentTypeError(f"invalid choice: {text!r} (choose from {', '.join(names)}, or "
                                         "MODULE:CALLABLE for your own)")
    return parse


# ---- --model, --optimizer and --flops: bench_e2e and mem_profile (runner.build_model and build_optimizer) ----

OURS = "ours"


def add_model_args(parser: argparse.ArgumentParser, optimizer_help: str, flops: bool) -> None:
    """--model and --optimizer (and, for bench_e2e, --flops): our model and AdamW, or yours."""
    parser.add_argument("--model", nargs="+", type=named_or_spec([OURS]), default=[OURS], metavar="MODEL",
                        help="ours = model.TransformerLM (the staff architecture); or yours as MODULE:CALLABLE, any "
                             "factory of an nn.Module taking the staff constructor's keywords (vocab_size, "
                             "context_length, d_model, num_layers, num_heads, d_ff, rope_theta) whose forward maps "
                             "token ids (batch, seq) to logits (batch, seq, vocab), e.g. "
                             "cs336_basics.model:BasicsTransformerLM; imported from the current directory or "
                             "PYTHONPATH; several to compare them (see docs/your_code.md)")
    parser.add_argument("--optimizer", nargs="+", type=named_or_spec([OURS, "torch"]), default=[OURS],
                        metavar="OPTIMIZER", help=optimizer_help + "; or yours as MODULE:CLASS, built as "
                        "CLASS(params, lr=1e-3) (CLASS(params) when it takes no lr)")
    if flops:
        parser.add_argument("--flops", choices=["formula", "counted", "none"], default=None,
                            help="the FLOPs behind TFLOP/s and MFU: formula = model_config's for our architecture "
                                 "(the default for our model; for yours only if you confirm it is the same "
                                 "architecture, as the staff model is); counted = torch.utils.flop_counter's count "
                                 "of one more, untimed step; none (the default for yours): no TFLOP/s, no MFU")


def models_or_exit(parser: argparse.ArgumentParser, args: argparse.Namespace, ours_only: dict[str, bool]) -> None:
    """--model as a list without repeats; a flag that only changes our model (`ours_only`: flag -> whether it was
    given) is a usage error when only your models run."""
    args.model = list(dict.fromkeys(args.model))
    if OURS not in args.model:
        for flag, given in ours_only.items():
            if given:
                parser.error(f"{flag} changes our model only, and --model runs only yours "
                             f"({', '.join(args.model)}): drop it, or add ours (--model ours ...)")


def model_factory(name: str) -> str | None:
    """RunConfig.model_factory of a --model value: None for ours, the spec for yours."""
    return None if name == OURS else name


def flops_source(name: str, given: str | None) -> str:
    """--flops as given, else formula for our model and none for yours (the formula is our architecture's)."""
    return given or ("formula" if name == OURS else "none")


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
