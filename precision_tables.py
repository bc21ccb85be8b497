"""The reports of the two mixed-precision scripts, from their JSONL records alone: precision_demo's sums in low
precision (the table and the notes that explain cases 3 and 4 and the low-precision accumulators) and
toy_autocast's dtypes under torch.autocast. report.render is the one caller (report.py's docstring has the
layout). torch-free: every dtype and every number here was computed by the run and is read from its records. In
a merge of several runs (results.RUN_KEY on each record) every table gets a `run` column.
"""
from __future__ import annotations

from typing import Any

from results import RUN_COLUMN, by_run, environment_lines, is_merged, pick_columns, render_table, run_of

# ---- precision_demo ----

COLUMNS = ["case", "accumulator", "addend", "addend as stored (exact)", "count x stored (float64)", "result",
           "abs error", "rel error", "accumulator spacing at result"]


def exact_fraction(stored: str) -> str:
    """'0.01000213623046875' -> '0.01000213623046875 = 1311/2^17': every float is an integer over a power of two,
    and seeing that integer shows how few bits the dtype kept."""
    numerator, denominator = float(stored).as_integer_ratio()
    return f"{stored} = {numerator}/2^{denominator.bit_length() - 1}"


def three_digits(x: float) -> float:
    return float(f"{x:.3g}")


def table_row(record: dict[str, Any]) -> dict[str, Any]:
    """Floats are printed in full (shortest repr that round-trips: floatfmt=""), errors to three digits."""
    addend = record["addend_dtype"] + (" -> float32" if record["addend_converted_to_float32"] else "")
    return {RUN_COLUMN: run_of(record), "case": record["case"], "accumulator": record["accumulator_dtype"],
            "addend": addend, "addend as stored (exact)": exact_fraction(record["addend_stored_exact"]),
            "count x stored (float64)": record["count_times_stored"], "result": record["result"],
            "abs error": three_digits(record["abs_error"]), "rel error": three_digits(record["rel_error"]),
            "accumulator spacing at result": record["result_spacing"]}


def promotion_note(records: list[dict[str, Any]]) -> str:
    """Why case 3 equals case 4, from the computed values and torch's own type-promotion rule (torch.result_type,
    which the run recorded as "promoted_dtype")."""
    by_case = {r["case"]: r for r in records}
    r3, r4 = by_case["3"], by_case["4"]
    promoted = r3.get("promoted_dtype")
    to = f" to {promoted}" if promoted else ""  # records from before the run recorded it say less, not a guess
    relation = "equal" if r3["result"] == r4["result"] else "NOT equal"
    matches = "exactly" if r3["result"] == r3["count_times_stored"] else "close to"
    return (f"Cases 3 and 4 are {relation} ({r3['result']!r} and {r4['result']!r}): for float32 += float16 "
            f"PyTorch promotes the float16 addend{to} before adding (torch.result_type), so the explicit "
            f".type(torch.float32) of case 4 changes nothing. Their error comes from the addend itself: "
            f"{r3['value']} stored in float16 is {r3['addend_stored_exact']}, and {r3['count']} x that is "
            f"{r3['count_times_stored']!r}, {matches} what both cases print. Case 1 stores {r3['value']} as "
            f"{by_case['1']['addend_stored_exact']}; what is left of its error is float32 rounding in the "
            "accumulator.")


def accumulator_note(record: dict[str, Any]) -> str:
    """How a low-precision accumulator loses the sum, read off its spacing at the result."""
    half_spacing = record["result_spacing"] / 2
    if half_spacing >= abs(float(record["addend_stored_exact"])):
        return (f"The {record['accumulator_dtype']} accumulator (case {record['case']}) stops at {record['result']!r}: "
                f"half its spacing there ({half_spacing!r}) is at least the addend, so every later add rounds away.")
    return (f"The {record['accumulator_dtype']} accumulator (case {record['case']}) ends at {record['result']!r}: "
            f"near there it can only move in steps of {record['result_spacing']!r}, so each add of the addend is "
            "rounded to a multiple of that step.")


def notes(records: list[dict[str, Any]]) -> list[str]:
    """The notes of one run (cases 3 and 4 explained, when both ran; each low-precision accumulator)."""
    low_precision = [r for r in records if r["accumulator_dtype"] != "float32"]
    cases = {r["case"] for r in records}
    return ([promotion_note(records)] if {"1", "3", "4"} <= cases else []) + [accumulator_note(r)
                                                                             for r in low_precision]


def sum_title(records: list[dict[str, Any]]) -> str:
    value, count = records[0]["value"], records[0]["count"]
    return f"Sum of {value} added {count} times (exact answer {value * count!r})"


def render_precision_report(records: list[dict[str, Any]], fmt: str, columns: list[str] | None = None) -> str:
    """The environment, the sum's title, the table (with `columns`: results.pick_columns) and the notes. A merge:
    one table with a run column, each run's title and notes named."""
    merged = is_merged(records)
    groups = by_run(records)
    titles = [f"{run}: {sum_title(rs)}" if merged else sum_title(rs) for run, rs in groups.items()]
    said = [f"{run}: {note}" if merged else note for run, rs in groups.items() for note in notes(rs)]
    default = [RUN_COLUMN] + COLUMNS if merged else COLUMNS
    return "\n".join([*environment_lines(records, lambda rs: {}), "", *titles, "",
                      render_table([table_row(r) for r in records], pick_columns(default, columns, fmt), fmt,
                                   floatfmt=""), "",
                      "\n\n".join(said)])


# ---- toy_autocast ----

# The note printed with CPU results: CPU and CUDA autocast follow different op lists (torch.amp docs,
# "Autocast Op Reference"), so a CPU table must not be quoted as the CUDA answer.
TOY_CPU_NOTE = ("NOTE: these are CPU autocast results. CUDA autocast follows a different, documented policy: it "
                "runs layer_norm (and softmax, log_softmax, cross_entropy) in float32, so on a GPU the LayerNorm "
                "output is float32, not the low-precision dtype shown here. Do not copy these CPU dtypes into an "
                "answer about CUDA; run with --device cuda on a GPU for that.")


def autocast_column(record: dict[str, Any]) -> str:
    """"float16 autocast": the table's column for one record (one autocast dtype)."""
    return f"{record['autocast_dtype']} autocast"


def toy_columns(records: list[dict[str, Any]]) -> list[str]:
    return ["tensor"] + list(dict.fromkeys(autocast_column(r) for r in records))


def toy_rows(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per tensor (in the order observed: parameters first, then outputs, loss and gradients), one column
    per autocast dtype; a dtype whose run failed shows its status in every cell (and in a single row when no run
    succeeded)."""
    labels: dict[str, None] = {}
    for r in records:
        if r["status"] == "ok":
            labels.update(dict.fromkeys(r["dtypes"]))
    params = [label for label in labels if label.startswith("parameter ")]
    ordered = params + [label for label in labels if label not in params] or ["(run)"]
    rows = []
    for label in ordered:
        row: dict[str, Any] = {"tensor": label}
        for r in records:
            row[autocast_column(r)] = r["dtypes"].get(label) if r["status"] == "ok" else r["status"]
        rows.append(row)
    return rows


def toy_title(records: list[dict[str, Any]]) -> str:
    r0 = records[0]
    c = r0["config"]
    return (f"ToyModel dtypes under torch.autocast on {r0['device']} ({r0['environment']['device_name']}), "
            f"batch {c['batch_size']}, {c['in_features']} -> 10 -> {c['out_features']}")


def render_toy_report(records: list[dict[str, Any]], fmt: str, columns: list[str] | None = None) -> str:
    """The environment, the title, the CPU note when the run was not on CUDA, and the table of dtypes. A merge:
    each run's rows, with a run column."""
    merged = is_merged(records)
    lines = environment_lines(records, lambda rs: {}) + [""]
    rows = []
    for run, group in by_run(records).items():
        lines += [f"{run}: {toy_title(group)}" if merged else toy_title(group), ""]
        if not str(group[0]["device"]).startswith("cuda"):
            lines += [f"{run}: {TOY_CPU_NOTE}" if merged else TOY_CPU_NOTE, ""]
        rows += [{RUN_COLUMN: run, **row} for row in toy_rows(group)]
    default = [RUN_COLUMN] + toy_columns(records) if merged else toy_columns(records)
    return "\n".join(lines + [render_table(rows, pick_columns(default, columns, fmt), fmt)])
