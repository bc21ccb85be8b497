"""bench_attention's report, from its JSONL records alone: one table per implementation (times, memory, the
study's prediction, statuses), then the implementations side by side with their speed-ups over naive.
report.render("bench_attention", ...) is the one caller (report.py's docstring has the layout). torch-free; in a
merge of several runs (results.RUN_KEY on each record) every table gets a `run` column.
"""
from __future__ import annotations

from typing import Any

from results import (RUN_COLUMN, comparison_groups, environment_lines, format_bytes, is_merged, pick_columns,
                     render_table, run_of, runs_cell, with_run_column)

IMPL_COLUMNS = ["d", "seq", "fwd ms", "fwd std", "bwd ms", "bwd std", "fwd TFLOP/s", "mem before bwd",
                "peak mem", "saved (autograd)", "naive predicted", "backend", "compile s", "status"]
ALWAYS_SHOWN = {"d", "seq", "fwd ms", "bwd ms", "naive predicted", "status"}
TABLE_COLUMNS = ["impl"] + IMPL_COLUMNS  # what --columns may name (impl: the heading of each table, or a column)


def impl_row(record: dict[str, Any]) -> dict[str, Any]:
    config = record["config"]
    row = {"impl": config["impl"], "d": config["d"], "seq": config["seq_len"], "status": record["status"],
           "naive predicted": format_bytes(record["predicted_naive_saved_bytes"]), RUN_COLUMN: run_of(record)}
    if record["status"] != "ok":
        return row
    if record.get("note"):
        row["status"] += f" ({record['note']})"
    row.update({"fwd ms": record["forward_ms_mean"], "fwd std": record["forward_ms_std"],
                "bwd ms": record["backward_ms_mean"], "bwd std": record["backward_ms_std"],
                "fwd TFLOP/s": record["forward_tflops"],
                "mem before bwd": format_bytes(record.get("mem_before_backward_bytes")),
                "peak mem": format_bytes(record.get("peak_mem_allocated_bytes")),
                "saved (autograd)": format_bytes(record["saved_tensor_bytes"]),
                "backend": record.get("sdpa_backend"), "compile s": record.get("compile_s")})
    return row


def impl_table(records: list[dict[str, Any]], fmt: str, columns: list[str] | None = None,
               merged: bool = False) -> str:
    rows = [impl_row(r) for r in records]
    shown = [c for c in IMPL_COLUMNS if c in ALWAYS_SHOWN or any(row.get(c) is not None for row in rows)]
    return render_table(rows, pick_columns([RUN_COLUMN] + shown if merged else shown, columns, fmt), fmt,
                        floatfmt=".3f")


def memory_measure(records: list[dict[str, Any]]) -> tuple[str, str]:
    """(record key, column label) of the memory to compare: the allocator's figure where there is one (CUDA),
    else the bytes autograd saved."""
    if any("mem_before_backward_bytes" in r for r in records):
        return "mem_before_backward_bytes", "mem before bwd"
    return "saved_tensor_bytes", "saved"


def comparison_table(records: list[dict[str, Any]], impls: list[str], fmt: str) -> str:
    """One row per (d, seq): each implementation's forward and backward mean and memory, and the speed-up over
    naive (naive time / its time). A failed configuration shows its status in place of its times. In a merge,
    runs are set side by side unless one configuration is in two of them: then each run has its own rows
    (results.comparison_groups), so that no measurement is dropped."""
    mem_key, mem_label = memory_measure(records)
    by_shape: dict[tuple[int, int, int], dict[str, dict]] = {}
    groups = comparison_groups(records, lambda r: (r["config"]["impl"], r["config"]["d"], r["config"]["seq_len"]))
    for i, group in enumerate(groups):
        for r in group:
            by_shape.setdefault((i, r["config"]["d"], r["config"]["seq_len"]), {})[r["config"]["impl"]] = r
    columns = with_run_column(["d", "seq"], records)
    for impl in impls:
        columns += [f"{impl} fwd ms", f"{impl} bwd ms", f"{impl} {mem_label}"]
        if impl != "naive" and "naive" in impls:
            columns += [f"{impl} fwd speed-up", f"{impl} bwd speed-up"]
    rows = []
    for (_, d, seq), found in by_shape.items():
        row: dict[str, Any] = {"d": d, "seq": seq, RUN_COLUMN: runs_cell(list(found.values()))}
        naive = found.get("naive")
        for impl, r in found.items():
            if r["status"] != "ok":
                row[f"{impl} fwd ms"] = r["status"]
                continue
            row[f"{impl} fwd ms"], row[f"{impl} bwd ms"] = r["forward_ms_mean"], r["backward_ms_mean"]
            row[f"{impl} {mem_label}"] = format_bytes(r.get(mem_key))
            if impl != "naive" and naive and naive["status"] == "ok":
                for phase, short in (("forward", "fwd"), ("backward", "bwd")):
                    row[f"{impl} {short} speed-up"] = f"{naive[f'{phase}_ms_mean'] / r[f'{phase}_ms_mean']:.2f}x"
        rows.append(row)
    return render_table(rows, columns, fmt, floatfmt=".3f")


def run_settings(records: list[dict[str, Any]]) -> dict[str, Any]:
    config0 = records[0]["config"]
    return {"batch": config0["batch_size"], "dtype": config0["dtype"], "iters": config0["iters"],
            "warmup": config0["warmup"], "causal": "yes"}


def render_report(records: list[dict[str, Any]], fmt: str, columns: list[str] | None = None) -> str:
    """Environment header, one table per implementation (with `columns`: results.pick_columns), the comparison
    table and a note on the memory columns, from the JSONL records alone."""
    lines = environment_lines(records, run_settings)
    done = list(dict.fromkeys(r["config"]["impl"] for r in records))
    for impl in done:
        lines += ["", f"### {impl}", "", impl_table([r for r in records if r["config"]["impl"] == impl], fmt, columns,
                                                    merged=is_merged(records))]
    lines += ["", "### comparison", "", comparison_table(records, done, fmt), "",
              "mem before bwd: torch.cuda.memory_allocated after the forward, graph alive (CUDA only); "
              "saved (autograd): bytes the graph keeps for backward, measured with saved-tensor hooks; "
              "naive predicted: 2*batch*seq^2*elem (scores, softmax) + 4*batch*seq*d*elem (Q, K, V, output)."]
    return "\n".join(lines)
