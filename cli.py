"""The command line shared by the scripts: a one-line error parser, bounded number types, and the --size,
--handout, --dry-run, --fmt/--out/--results-dir arguments. torch-free (the trace and record readers use it too).
"""
from __future__ import annotations

import argparse
import math
import os
from typing import Any, NoReturn

from model_config import DEFAULT_HANDOUT, HANDOUT_ENV, HANDOUTS, ConfigError, Handout, ModelConfig, expand_sizes
from results import TABLE_FORMATS, progress, result_stem, results_folder

class DefaultsHelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """--help with each flag's default, said once: argparse's formatter adds "(default: X)" to every help text, so
    a help that already names its default, or a default of None (its help says what happens then), gets none."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if action.default is None or action.default is False or "default" in text:
            return text
        return super()._get_help_string(action)


class ArgParser(argparse.ArgumentParser):
    """argparse with a one-line error: `prog: error: message (see --help)` and exit status 2, no usage dump. Under
    torchrun every rank parses the same command line and exits; only rank 0 says why (one line, not N)."""

    def __init__(self, *args: Any, **kwargs: Any):
        kwargs.setdefault("formatter_class", DefaultsHelpFormatter)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n" if os.environ.get("RANK", "0") == "0" else None)


# Bounds on numbers from the command line, so a number that cannot be used is a parse error, not an error row.
# torch stores sizes, strides and element counts as int64: a dimension beyond this can never be allocated.
INT64_MAX = 2**63 - 1
# Timed steps and warm-up steps are Python loops whose raw samples are kept in the JSONL record (~20 bytes each):
# a million makes a 20 MB line, far beyond what a mean or a standard deviation needs; more only fills the disk.
MAX_STEPS = 1_000_000
# torch.manual_seed's documented range: [-0x8000_0000_0000_0000, 0xffff_ffff_ffff_ffff] (negative ones are
# remapped); anything else raises at seeding time, inside a configuration.
SEED_RANGE = (-(2**63), 2**64 - 1)


def _bounded_int(text: str, low: int, high: int, what: str) -> int:
    value = int(text)  # a non-integer is argparse's "invalid ... value"
    if not low <= value <= high:
        raise argparse.ArgumentTypeError(f"must be {what}, got {text}")
    return value


def non_negative_float(text: str) -> float:
    value = float(text)
    if not 0 <= value < float("inf"):
        raise argparse.ArgumentTypeError(f"must be a finite number >= 0, got {text}")
    return value


def positive_int(text: str) -> int:
    """A size: 1 .. 2**63-1 (torch's int64 sizes)."""
    return _bounded_int(text, 1, INT64_MAX, f"a positive integer at most {INT64_MAX} (int64)")


def non_negative_int(text: str) -> int:
    return _bounded_int(text, 0, INT64_MAX, f">= 0 and at most {INT64_MAX} (int64)")


def step_count(text: str) -> int:
    """A number of timed steps or iterations: 1 .. MAX_STEPS."""
    return _bounded_int(text, 1, MAX_STEPS, f"a positive integer at most {MAX_STEPS:,} (raw samples are kept)")


def warmup_count(text: str) -> int:
    return _bounded_int(text, 0, MAX_STEPS, f">= 0 and at most {MAX_STEPS:,}")


def seed_int(text: str) -> int:
    low, high = SEED_RANGE
    return _bounded_int(text, low, high, f"within torch.manual_seed's range [{low}, {high}]")


def positive_float(text: str) -> float:
    value = float(text)
    if not (value > 0 and math.isfinite(value)):
        raise argparse.ArgumentTypeError(f"must be a positive finite number, got {text}")
    return value


def refuse(parser: argparse.ArgumentParser, rules: list[tuple[bool, str]]) -> None:
    """The first rule whose condition holds is the user's mistake: one line, exit 2."""
    for broken, message in rules:
        if broken:
            parser.error(message)


def check_tensor_sizes(parser: argparse.ArgumentParser, shapes: dict[str, tuple[int, ...]]) -> None:
    """A user mistake if a tensor the run will build has more bytes than torch can count (int64), at 8 bytes per
    element (the widest dtype these scripts allocate: int64 token ids). `shapes` names each tensor's shape."""
    for name, shape in shapes.items():
        if math.prod(shape) * 8 > INT64_MAX:
            parser.error(f"the {name} tensor {tuple(shape)} would have more than 2**63 bytes; use smaller sizes")


def add_device_args(parser: argparse.ArgumentParser) -> None:
    """--device, the same in every script that sweeps configurations (sweep.add_sweep_args adds the rest)."""
    parser.add_argument("--device", default="auto", help="auto (CUDA if present), cpu, cuda, cuda:N")


def add_workload_args(parser: argparse.ArgumentParser, modes: Any, dtypes: Any, attentions: Any, *,
                      several_modes: bool, several_warmups: bool, warmup: int, steps: int) -> None:
    """--mode, --dtype, --attn, --warmup, --steps and --seed: the settings of the LM workload, the same in bench_e2e
    and mem_profile (`modes`, `dtypes`, `attentions`: the names runner, common and model know). `several_modes`,
    `several_warmups`: a sweep over them (a list) rather than one value."""
    parser.add_argument("--mode", nargs="+" if several_modes else None, choices=list(modes),
                        default=["forward", "train"] if several_modes else "train",
                        help="forward only, forward+backward, or a full training step (forward, backward, AdamW)")
    parser.add_argument("--dtype", nargs="+", choices=list(dtypes), default=["fp32"],
                        help="fp32, or bf16/fp16 autocast mixed precision (fp32 master weights; fp16 with a grad "
                             "scaler); several to compare them")
    parser.add_argument("--attn", nargs="+", choices=list(attentions), default=None,  # None: not given (--model)
                        help="our model's attention: naive = softmax(QK^T)V in the model's own code, sdpa = torch's "
                             "fused scaled_dot_product_attention; both to compare them (default: naive)")
    parser.add_argument("--warmup", type=warmup_count, nargs="+" if several_warmups else None,
                        default=[warmup] if several_warmups else warmup,
                        help="untimed warm-up steps before the peak counter is reset and the timed steps start"
                             + (" (several: the warm-up study)" if several_warmups else ""))
    parser.add_argument("--steps", type=step_count, default=steps, help="timed steps")
    parser.add_argument("--seed", type=seed_int, default=0, help="random seed for weights and data")


def add_size_args(parser: argparse.ArgumentParser, default_help: str) -> None:
    """--size (names of either handout's Table 1, or 'all') and --handout, in every script that takes a size;
    `default_help` says what runs without --size."""
    parser.add_argument("--size", nargs="+", default=None, metavar="SIZE",
                        help="model preset(s) of the handout's Table 1 (2026: "
                             f"{', '.join(HANDOUTS['2026'].presets)}; 2025: {', '.join(HANDOUTS['2025'].presets)}), "
                             f"or 'all' for its Table 1 (default: {default_help})")
    add_handout_arg(parser)


def add_handout_arg(parser: argparse.ArgumentParser) -> None:
    """--handout, in every script that takes a model size."""
    parser.add_argument("--handout", choices=list(HANDOUTS), default=None,
                        help="which handout's Table 1 the size names and this script's defaults come from: "
                             f"2026 = {HANDOUTS['2026'].version} (current), 2025 = {HANDOUTS['2025'].version} "
                             f"(default: ${HANDOUT_ENV} if set, else {DEFAULT_HANDOUT})")


def handout_or_exit(parser: argparse.ArgumentParser, args: argparse.Namespace) -> Handout:
    """The handout to use: --handout, else $CS336_HANDOUT (read now, at parse time), else the current one.
    Sets args.handout to its name and args.handout_source to where it came from; a bad value in the
    variable is a one-line exit 2, like a bad --handout."""
    if args.handout is not None:
        args.handout_source = "--handout"
    elif os.environ.get(HANDOUT_ENV, "").strip():
        args.handout, args.handout_source = os.environ[HANDOUT_ENV].strip(), HANDOUT_ENV
        if args.handout not in HANDOUTS:
            parser.error(f"{HANDOUT_ENV}={args.handout!r} is not a handout; valid handouts: {', '.join(HANDOUTS)}")
    else:
        args.handout, args.handout_source = DEFAULT_HANDOUT, "default"
    return HANDOUTS[args.handout]


def sizes_or_exit(parser: argparse.ArgumentParser, args: argparse.Namespace, names: list[str]) -> list[str]:
    """expand_sizes in args.handout, with a bad name as a one-line exit 2. When the handout was not chosen
    explicitly and a name means another model in the other handout (xl), a note on stderr says which one runs:
    the student who types --size xl from the 2025 handout must not get 2026's xl silently."""
    try:
        sizes = expand_sizes(names, args.handout)
    except ConfigError as exc:
        parser.error(str(exc))
    if args.handout_source == "default":
        mine = HANDOUTS[args.handout].presets
        for size in sizes:
            for other in HANDOUTS.values():
                if other.presets.get(size, mine[size]) != mine[size]:
                    progress(f"note: {size} is handout {args.handout}'s {size} ({_dims(mine[size])}), not handout "
                             f"{other.name}'s ({_dims(other.presets[size])}): for that one pass --handout "
                             f"{other.name} (or set {HANDOUT_ENV}={other.name})")
    return sizes


def _dims(cfg: ModelConfig) -> str:
    return f"d_model {cfg.d_model}, {cfg.num_layers} layers"


def add_dry_run_arg(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--dry-run", action="store_true",
                        help="print the configurations that would run, numbered, and exit: nothing is built, "
                             "run or written")


def print_dry_run(labels: list[str], preamble: str = "", notes: list[str] = (), at_most: bool = False) -> int:
    """--dry-run: the preamble (the configuration table), then the numbered plan, then `notes` (what the run will
    make of it). `at_most`: the plan is an upper bound (a search stops early). Returns the exit status."""
    if preamble:
        print(preamble + "\n")
    count = f"{'at most ' if at_most else ''}{len(labels)} configuration{'s' if len(labels) != 1 else ''}"
    print(f"dry run: {count} would run, in this order:")
    width = len(str(len(labels)))
    for i, label in enumerate(labels, 1):
        print(f"  {i:>{width}}. {label}")
    for note in notes:
        print("\n" + note)
    print("\nnothing was built, run or written (drop --dry-run to run them)")
    return 0


def add_output_args(parser: Any, default_stem: str) -> None:
    """--fmt, --out and --results-dir, the same in every script."""
    parser.add_argument("--fmt", default="github", choices=TABLE_FORMATS, metavar="FMT",
                        help="tabulate table format: github (markdown, default), latex_booktabs, plain, ...")
    parser.add_argument("--out", default=None, type=result_stem,
                        help=f"result file stem, a plain name inside the results folder (default: {default_stem}-"
                             "<UTC timestamp>); an existing result is never overwritten: a numbered suffix is "
                             "added instead")
    parser.add_argument("--results-dir", default="results", type=results_folder,
                        help="root folder for result files (created when missing)")
