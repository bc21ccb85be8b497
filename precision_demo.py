"""Accumulation in low precision: sum 0.01 one thousand times in the study's four ways (plus bfloat16).

Answers the study's mixed-precision question: why do mixed-precision recipes keep accumulators in float32, and
why does a float32 accumulator fed float16 addends still miss 10? Each sum runs exactly as the study's loop does,

    s = torch.tensor(0, dtype=accumulator)
    for i in range(1000):
        s += torch.tensor(0.01, dtype=addend)          # case 4: .type(torch.float32) first

and the table shows what 0.01 becomes in the addend's dtype, so the errors can be read off.

    python3 precision_demo.py                           # the study's setup: 0.01 x 1000
    python3 precision_demo.py --fmt latex_booktabs      # the same table for a LaTeX writeup
    python3 precision_demo.py --value 0.1 --count 100   # another sum

The table (precision_tables.py, the code report.py re-renders saved runs with) is printed on stdout and saved, with
one JSON record per case, under results/precision/.
"""
from __future__ import annotations

import argparse
import math
import sys
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

import torch

import cli
import figures
import report
from common import dtype_name, environment
from results import ResultFiles


@dataclass(frozen=True)
class Case:
    name: str
    accumulator: torch.dtype
    addend: torch.dtype
    convert_to_fp32: bool = False  # convert each addend with .type(torch.float32) before adding


# The study's four cases, then their bfloat16 counterparts (what people actually train with).
CASES = [
    Case("1", torch.float32, torch.float32),
    Case("2", torch.float16, torch.float16),
    Case("3", torch.float32, torch.float16),
    Case("4", torch.float32, torch.float16, convert_to_fp32=True),
    Case("2-bf16", torch.bfloat16, torch.bfloat16),
    Case("3-bf16", torch.float32, torch.bfloat16),
]

FLOAT16_MAX = torch.finfo(torch.float16).max  # 65504

def accumulate(case: Case, value: float, count: int,
               sample_at: frozenset[int] = frozenset()) -> tuple[torch.Tensor, list[list]]:
    """The study's loop: a 0-dim accumulator of case.accumulator, `count` in-place adds of `value` stored as
    case.addend (converted to float32 first for case 4). Returns the accumulator tensor and the partial sums
    [n, sum after n adds] at the counts in `sample_at` (read between adds; the loop is the same)."""
    s = torch.tensor(0, dtype=case.accumulator)
    partial_sums = []
    for n in range(1, count + 1):
        x = torch.tensor(value, dtype=case.addend)
        if case.convert_to_fp32:
            x = x.type(torch.float32)
        s += x
        if n in sample_at:
            partial_sums.append([n, s.item()])
    return s, partial_sums


def sample_counts(count: int, per_decade: int = 10) -> frozenset[int]:
    """Logarithmically spaced addition counts from 1 to `count` (both included), about `per_decade` per factor
    of ten: where the partial sums are recorded for the plot."""
    steps = max(1, round(math.log10(count) * per_decade)) if count > 1 else 1
    return frozenset({1, count} | {round(count ** (i / steps)) for i in range(steps + 1)})


def stored_value(value: float, dtype: torch.dtype) -> Decimal:
    """The exact number `value` becomes in `dtype` (every float16/bfloat16/float32 is exact in float64, and
    Decimal(float) prints a float64 exactly)."""
    return Decimal(torch.tensor(value, dtype=dtype).item())


def spacing(s: torch.Tensor) -> float:
    """Distance from `s` to the next representable number above it, in s's dtype: an addend below half of this
    is rounded away entirely."""
    return (torch.nextafter(s, torch.tensor(math.inf, dtype=s.dtype)) - s).item()


def run_case(case: Case, value: float, count: int) -> dict[str, Any]:
    """One JSON-ready record: the case, the stored addend, the computed sum and its error against value*count."""
    result, partial_sums = accumulate(case, value, count, sample_counts(count))
    target = value * count
    stored = stored_value(value, case.addend)
    result_value = result.item()
    # what PyTorch converts both operands to before adding (torch.result_type), for the note on cases 3 and 4
    promoted = torch.result_type(torch.tensor(0, dtype=case.accumulator), torch.tensor(0, dtype=case.addend))
    return {"case": case.name, "accumulator_dtype": dtype_name(case.accumulator),
            "addend_dtype": dtype_name(case.addend), "addend_converted_to_float32": case.convert_to_fp32,
            "promoted_dtype": dtype_name(promoted),
            "result_dtype": dtype_name(result.dtype), "value": value, "count": count,
            "addend_stored_exact": str(stored), "count_times_stored": float(stored) * count,
            "result": result_value, "abs_error": abs(result_value - target),
            "rel_error": abs(result_value - target) / abs(target), "result_spacing": spacing(result),
            "partial_sums": partial_sums}


# ---- command line ----


def build_parser() -> argparse.ArgumentParser:
    p = cli.ArgParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--value", type=float, default=0.01, help="the number added each time")
    p.add_argument("--count", type=cli.positive_int, default=1000, help="how many times it is added")
    p.add_argument("--plot", action="store_true",
                   help="also draw the running sums against the number of additions as a PNG (needs matplotlib)")
    cli.add_output_args(p, default_stem="precision_demo")
    return p


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not math.isfinite(args.value) or args.value == 0:
        parser.error(f"--value must be a finite non-zero number, got {args.value}")
    # Every case stores the addend in float16 or bfloat16 and case 2 accumulates in float16: beyond float16's
    # largest finite number the sum is infinite and the errors mean nothing. (The study is about rounding.)
    if abs(args.value) * args.count > FLOAT16_MAX:
        parser.error(f"--value x --count must be at most {FLOAT16_MAX:g} in magnitude (float16's largest finite "
                     f"number), got {args.value} x {args.count}")
    if args.count > 1_000_000:
        parser.error(f"--count must be at most 1000000 (one Python-level add each), got {args.count}")
    if args.plot and (message := figures.matplotlib_missing()):
        parser.error(message)
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    files = ResultFiles(args.results_dir, "precision", args.out, "precision_demo")
    env = environment(torch.device("cpu"))
    records = []
    for case in CASES:
        record = {"experiment": "precision_demo", **run_case(case, args.value, args.count), "status": "ok",
                  "environment": env}
        records.append(record)
        files.append_record(record)
    return report.publish("precision_demo", records, files, args.fmt, plot=args.plot)

if __name__ == "__main__":
    sys.exit(main())
