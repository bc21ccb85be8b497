"""mixed_precision_accumulation: the handout's four loops adding 0.01 a thousand times, + bfloat16.

Why keep accumulators in float32, and why does a float32 accumulator fed float16 addends still miss 10? The
table shows each sum, the addend's exact stored value and the accumulator's spacing; notes explain the errors.

    python3 precision_demo.py                           # the handout's setup: 0.01 x 1000
    python3 precision_demo.py --plot                    # + running sums as a PNG (needs matplotlib)
    python3 precision_demo.py --fmt latex_booktabs      # the same table for a LaTeX writeup
    python3 precision_demo.py --value 0.1 --count 100   # another sum

Printed, and saved with one JSON record per case under results/precision/.
"""
from __future__ import annotations

import argparse
import math
from decimal import Decimal

import torch

import report
import results
from common import dtype_name, environment
from results import ResultFiles

# case: (accumulator dtype, addend dtype, addend converted with .type(torch.float32) before adding).
# 1-4 are the handout's; 2-bf16 and 3-bf16 their bfloat16 counterparts (what people train with).
CASES = {"1": (torch.float32, torch.float32, False), "2": (torch.float16, torch.float16, False),
         "3": (torch.float32, torch.float16, False), "4": (torch.float32, torch.float16, True),
         "2-bf16": (torch.bfloat16, torch.bfloat16, False),
         "3-bf16": (torch.float32, torch.bfloat16, False)}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = results.ArgParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--value", type=float, default=0.01, help="the number added each time")
    p.add_argument("--count", type=results.positive_int, default=1000, help="how many times to add it")
    p.add_argument("--plot", action="store_true",
                   help="also draw the running sums against the number of additions as a PNG "
                        "(needs matplotlib)")
    results.add_output_args(p, default_stem="precision_demo-<UTC time>")
    args = p.parse_args(argv)
    f16_max = torch.finfo(torch.float16).max  # past it case 2's sum is inf; the study is rounding
    stored = torch.tensor(args.value, dtype=torch.float16).item()  # float16 rounds it: 6550 is 6552
    results.refuse(p, [
        (not math.isfinite(args.value) or args.value == 0,
         f"--value must be a finite non-zero number, got {args.value}"),
        (args.count > 1_000_000, f"--count must be at most 1000000 (a Python add each), got "
                                 f"{args.count}"),
        (abs(stored) * args.count > f16_max,
         f"--value x --count must be at most {f16_max:g} in magnitude (float16's largest finite "
         f"number) with --value as float16 stores it, got {stored:g} x {args.count}")])
    return args


def run_case(case: str, value: float, count: int) -> dict:
    """The handout's loop, with [n, sum after n adds] at log-spaced n from 1 to count (the plot)."""
    accumulator, addend, to_float32 = CASES[case]
    sample_at = {round(count ** (i / 30)) for i in range(31)}
    s = torch.tensor(0, dtype=accumulator)
    partial_sums = []
    for i in range(count):
        x = torch.tensor(value, dtype=addend)
        s += x.type(torch.float32) if to_float32 else x
        if i + 1 in sample_at:
            partial_sums.append([i + 1, s.item()])

    stored = Decimal(torch.tensor(value, dtype=addend).item())  # exact: float64 holds any fp16/32
    result, target = s.item(), value * count
    # the step from s to the next number its dtype holds: an add below half of it is lost
    spacing = (torch.nextafter(s, torch.tensor(math.inf, dtype=s.dtype)) - s).item()
    return {"case": case, "accumulator_dtype": dtype_name(accumulator),
            "addend_dtype": dtype_name(addend), "addend_converted_to_float32": to_float32,
            "value": value, "count": count,
            # what torch converts both operands to for `s += x` (torch.result_type): case 3's note
            "promoted_dtype": dtype_name(torch.result_type(s, torch.tensor(0, dtype=addend))),
            "addend_stored_exact": str(stored), "count_times_stored": float(stored) * count,
            "result": result, "abs_error": abs(result - target),
            "rel_error": abs(result - target) / abs(target), "result_spacing": spacing,
            "partial_sums": partial_sums}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    files = ResultFiles(args.results_dir, "precision", args.out, "precision_demo")
    env = environment(torch.device("cpu"))
    records = []
    for case in CASES:
        records.append({"experiment": "precision_demo", **run_case(case, args.value, args.count),
                        "status": "ok", "environment": env})
        files.append_record(records[-1])
    return report.publish("precision_demo", records, files, args.fmt, plot=args.plot)


if __name__ == "__main__":
    raise SystemExit(main())
