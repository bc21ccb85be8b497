"""The reports of precision_demo (the sums, with notes) and toy_autocast (each tensor's dtype under
autocast) from their records alone: torch-free, every number and dtype was computed by the run.
"""
from __future__ import annotations

from typing import Any

from results import (RUN_COLUMN, by_run, environment_lines, is_merged, pick_columns, render_table,
                     run_of)

# ---- precision_demo ----

PRECISION_COLUMNS = ["case", "accumulator", "addend", "addend as stored (exact)",
                     "count x stored (float64)", "result", "abs error", "rel error",
                     "accumulator spacing at result"]
COLUMNS = PRECISION_COLUMNS  # the name report.py's RENDERERS reads


def precision_row(r: dict[str, Any]) -> dict[str, Any]:
    """Floats in full (floatfmt="": the shortest repr that round-trips), errors to 3 digits; the
    stored addend also as an integer over a power of two, which shows how many bits it kept."""
    numerator, denominator = float(r["addend_stored_exact"]).as_integer_ratio()
    return {RUN_COLUMN: run_of(r), "case": r["case"], "accumulator": r["accumulator_dtype"],
            "addend": r["addend_dtype"] + (" -> float32" * r["addend_converted_to_float32"]),
            "addend as stored (exact)":
                f"{r['addend_stored_exact']} = {numerator}/2^{denominator.bit_length() - 1}",
            "count x stored (float64)": r["count_times_stored"], "result": r["result"],
            "abs error": float(f"{r['abs_error']:.3g}"),
            "rel error": float(f"{r['rel_error']:.3g}"),
            "accumulator spacing at result": r["result_spacing"]}


def precision_notes(records: list[dict[str, Any]]) -> list[str]:
    """Why case 3 equals case 4 (torch's type promotion, as recorded by the run), then how each
    low-precision accumulator loses the sum, read off its spacing at the result."""
    by_case = {r["case"]: r for r in records}
    notes = []
    if {"1", "3", "4"} <= by_case.keys():
        r1, r3, r4 = by_case["1"], by_case["3"], by_case["4"]
        same, exact = r3["result"] == r4["result"], r3["result"] == r3["count_times_stored"]
        notes.append(
            f"Cases 3 and 4 are {'equal' if same else 'NOT equal'} ({r3['result']!r} and "
            f"{r4['result']!r}): torch promotes a float16 addend to {r3['promoted_dtype']} before "
            "adding it to a float32 (torch.result_type), so case 4's .type(torch.float32) changes "
            f"nothing. Their error is the addend's: {r3['value']} in float16 is "
            f"{r3['addend_stored_exact']}, and {r3['count']} x that is "
            f"{r3['count_times_stored']!r}, {'exactly' if exact else 'close to'} what both print. "
            f"Case 1 stores {r1['value']} as {r1['addend_stored_exact']}; the rest of its error is "
            "float32 rounding in the sum.")
    for r in [r for r in records if r["accumulator_dtype"] != "float32"]:
        half_step = r["result_spacing"] / 2
        stalled = half_step >= abs(float(r["addend_stored_exact"]))
        stuck = f"; half a step ({half_step!r}) is at least the addend: every add rounds away"
        notes.append(
            f"The {r['accumulator_dtype']} accumulator (case {r['case']}) ends at {r['result']!r}: "
            f"near there it moves in steps of {r['result_spacing']!r}, so each add is rounded to a "
            "multiple of that step" + (stuck if stalled else "") + ".")
    return notes


def render_precision_report(records: list[dict[str, Any]], fmt: str,
                            columns: list[str] | None = None) -> str:
    """The environment, the sum, the table (`columns`: pick_columns), the notes; runs named."""
    merged = is_merged(records)
    titles, notes = [], []
    for run, rs in by_run(records).items():
        named, value, count = f"{run}: " * merged, rs[0]["value"], rs[0]["count"]
        titles.append(f"{named}Sum of {value} added {count} times (exact answer {value * count!r})")
        notes += [named + note for note in precision_notes(rs)]
    default = [RUN_COLUMN] * merged + PRECISION_COLUMNS
    table = render_table([precision_row(r) for r in records], pick_columns(default, columns, fmt),
                         fmt, floatfmt="")
    return "\n".join([*environment_lines(records, lambda rs: {}), "", *titles, "", table, "",
                      "\n\n".join(notes)])


# ---- toy_autocast ----

# CPU and CUDA autocast follow different op lists (torch.amp docs, "Autocast Op Reference"): a CPU
# table must not be quoted as the CUDA answer.
TOY_CPU_NOTE = ("NOTE: these are CPU autocast results. CUDA autocast runs layer_norm (and "
                "softmax, log_softmax, cross_entropy) in float32, so on a GPU the LayerNorm output "
                "is float32. Do not quote it as the CUDA answer: run --device cuda on a GPU.")


def toy_columns(records: list[dict[str, Any]]) -> list[str]:
    return ["tensor"] + list(dict.fromkeys(f"{r['autocast_dtype']} autocast" for r in records))


def toy_rows(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per tensor, as observed; one column per autocast dtype. A failed dtype shows its
    status in every cell (in one row when no dtype succeeded)."""
    ok = [r for r in records if r["status"] == "ok"]
    labels = list(dict.fromkeys(label for r in ok for label in r["dtypes"])) or ["(run)"]
    return [{"tensor": label, **{f"{r['autocast_dtype']} autocast": r["dtypes"].get(label)
                                 if r["status"] == "ok" else r["status"] for r in records}}
            for label in labels]


def render_toy_report(records: list[dict[str, Any]], fmt: str,
                      columns: list[str] | None = None) -> str:
    """The environment, the title, the CPU note when not run on CUDA, the table of dtypes."""
    merged = is_merged(records)
    lines, rows = [*environment_lines(records, lambda rs: {}), ""], []
    for run, rs in by_run(records).items():
        named, r0, c = f"{run}: " * merged, rs[0], rs[0]["config"]
        lines += [f"{named}ToyModel dtypes under torch.autocast on {r0['device']} "
                  f"({r0['environment']['device_name']}), batch {c['batch_size']}, "
                  f"{c['in_features']} -> 10 -> {c['out_features']}", ""]
        if not r0["device"].startswith("cuda"):
            lines += [named + TOY_CPU_NOTE, ""]
        rows += [{RUN_COLUMN: run, **row} for row in toy_rows(rs)]
    default = [RUN_COLUMN] * merged + toy_columns(records)
    return "\n".join(lines + [render_table(rows, pick_columns(default, columns, fmt), fmt)])
