"""bench_attention's report, from its JSONL records alone: one table per implementation (times of the forward, the
backward and the two together, memory, the study's prediction, the correctness check, statuses), then the
implementations side by side with their speed-ups over naive (the handout's "PyTorch"). report.render(
"bench_attention", ...) is the one caller (report.py's docstring has the layout). torch-free; in a merge of several
runs (results.RUN_KEY on each record) every table gets a `run` column.
"""
from __future__ import annotations

from typing import Any

import stats
from results import (RUN_COLUMN, comparison_groups, environment_lines, format_bytes, is_merged, pick_columns,
                     render_table, run_of, runs_cell, with_run_column)

BASELINE = "naive"  # "PyTorch" in the handout's flash_benchmarking: the speed-ups are over it
PHASES = ("forward", "backward", "forward_backward")  # what bench_attention times, each on its own
PHASE_SHORT = {"forward": "fwd", "backward": "bwd", "forward_backward": "fwd+bwd"}

IMPL_COLUMNS = ["d", "seq", "dtype", "fwd ms", "fwd std", "bwd ms", "bwd std", "fwd+bwd ms", "fwd+bwd std",
                "fwd TFLOP/s", "mem before bwd", "peak mem", "saved (autograd)", "naive predicted", "backend",
                "compile s", "max err", "tol", "check", "status"]
ALWAYS_SHOWN = {"d", "seq", "fwd ms", "bwd ms", "naive predicted", "status"}
TABLE_COLUMNS = ["impl"] + IMPL_COLUMNS  # what --columns may name (impl: the heading of each table, or a column)


def check_summary(check: dict[str, Any]) -> str:
    """"WRONG: dk error 5.1e-01 > tolerance 5e-02" for a failed check; "" for a passed one."""
    if check["ok"]:
        return ""
    return f"WRONG: {check['worst']} error {check['max_error']:.1e} > tolerance {check['tolerance']:.0e}"


def impl_row(record: dict[str, Any]) -> dict[str, Any]:
    config = record["config"]
    row = {"impl": config["impl"], "dtype": config.get("dtype"), "d": config["d"], "seq": config["seq_len"],
           "status": record["status"], "naive predicted": format_bytes(record["predicted_naive_saved_bytes"]),
           RUN_COLUMN: run_of(record)}
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
                "backend": record.get("sdpa_backend"), "compile s": record.get("compile_s"),
                "fwd+bwd ms": record.get("forward_backward_ms_mean"),
                "fwd+bwd std": record.get("forward_backward_ms_std")})
    if check := record.get("check"):  # the error as text: floatfmt would round 1e-07 to 0.000
        row.update({"max err": f"{check['max_error']:.1e} ({check['worst']})", "tol": check["tolerance"],
                    "check": "ok" if check["ok"] else "WRONG"})
    return row


def impl_table(records: list[dict[str, Any]], fmt: str, columns: list[str] | None = None,
               merged: bool = False) -> str:
    rows = [impl_row(r) for r in records]
    shown = [c for c in IMPL_COLUMNS if c in ALWAYS_SHOWN or any(row.get(c) is not None for row in rows)]
    if len({row["dtype"] for row in rows}) == 1 and "dtype" in shown:  # one dtype: the header says it
        shown.remove("dtype")
    return render_table(rows, pick_columns([RUN_COLUMN] + shown if merged else shown, columns, fmt), fmt,
                        floatfmt=".3f")


def memory_measure(records: list[dict[str, Any]]) -> tuple[str, str]:
    """(record key, column label) of the memory to compare: the allocator's figure where there is one (CUDA),
    else the bytes autograd saved."""
    if any("mem_before_backward_bytes" in r for r in records):
        return "mem_before_backward_bytes", "mem before bwd"
    return "saved_tensor_bytes", "saved"


def comparison_table(records: list[dict[str, Any]], impls: list[str], fmt: str) -> str:
    """One row per (d, seq, dtype, batch): each implementation's forward, backward and forward+backward mean and memory,
    the speed-up over naive (naive time / its time) and whether every implementation passed its check. A failed
    configuration shows its status in place of its times; the speed-up of a kernel that failed its check says so.
    In a merge, runs are set side by side unless one configuration is in two of them: then each run has its own
    rows (results.comparison_groups), so that no measurement is dropped."""
    mem_key, mem_label = memory_measure(records)
    by_shape: dict[tuple, dict[str, dict]] = {}
    def shape(c: dict[str, Any]) -> tuple:  # what a speed-up compares across: everything but the implementation
        return c["d"], c["seq_len"], c.get("dtype"), c.get("batch_size")

    groups = comparison_groups(records, lambda r: (r["config"]["impl"], *shape(r["config"])))
    for i, group in enumerate(groups):
        for r in group:
            by_shape.setdefault((i, *shape(r["config"])), {})[r["config"]["impl"]] = r
    # forward and backward always (a failed row's status goes there); fwd+bwd where timed (older records lack it)
    phases = [p for p in PHASES if p != "forward_backward" or any(f"{p}_ms_mean" in r for r in records)]
    dtypes = len({key[3] for key in by_shape}) > 1
    batches = len({key[4] for key in by_shape}) > 1
    columns = with_run_column(["d", "seq"] + (["dtype"] if dtypes else []) + (["batch"] if batches else []), records)
    for impl in impls:
        columns += [f"{impl} {PHASE_SHORT[phase]} ms" for phase in phases] + [f"{impl} {mem_label}"]
        if impl != BASELINE and BASELINE in impls:
            columns += [f"{impl} {PHASE_SHORT[phase]} speed-up" for phase in phases]
    checked = any("check" in r for r in records)
    columns += ["check"] if checked else []
    rows = []
    for (_, d, seq, dtype, batch), found in by_shape.items():
        row: dict[str, Any] = {"d": d, "seq": seq, "dtype": dtype, "batch": batch,
                               RUN_COLUMN: runs_cell(list(found.values()))}
        naive = found.get(BASELINE)
        wrong, unresolved, few_rounds, pulled = [], [], {}, []
        for impl, r in found.items():
            if r["status"] != "ok":
                row[f"{impl} fwd ms"] = r["status"]
                continue
            if r.get("check") and not r["check"]["ok"]:
                wrong.append(f"{impl} ({check_summary(r['check']).removeprefix('WRONG: ')})")
            for phase in phases:
                row[f"{impl} {PHASE_SHORT[phase]} ms"] = r.get(f"{phase}_ms_mean")
            row[f"{impl} {mem_label}"] = format_bytes(r.get(mem_key))
            if impl != BASELINE and naive and naive["status"] == "ok":
                flag = " (wrong)" if r.get("check") and not r["check"]["ok"] else ""
                for phase in phases:
                    if f"{phase}_ms_mean" in r and f"{phase}_ms_mean" in naive:
                        # paired by round when the two were timed interleaved, else the ratio of the means
                        speedup = stats.speedup(naive, r, (phase,))
                        row[f"{impl} {PHASE_SHORT[phase]} speed-up"] = f"{speedup.ratio:.2f}x{flag}"
                        row[f"{impl} {PHASE_SHORT[phase]} 95% CI"] = speedup.interval_text()
                        if speedup.resolved is False:
                            unresolved.append(f"{impl} {PHASE_SHORT[phase]}")
                        if speedup.rounds and speedup.low is None:
                            few_rounds[impl] = (speedup.rounds, "--iters")
                        if (means := stats.means_outside(speedup, naive, r, (phase,))) is not None:
                            pulled.append(f"{impl} {PHASE_SHORT[phase]} {means:.2f}x")
        if checked:
            row["check"] = "WRONG: " + "; ".join(wrong) if wrong else "ok"
        row["notes"] = "; ".join(stats.interval_notes(unresolved, few_rounds, pulled, "calls")) or None
        rows.append(row)

    def interval(column: str) -> str:
        return column.replace(" speed-up", " 95% CI")

    if any(row.get(interval(c)) for row in rows for c in columns if c.endswith(" speed-up")):  # paired: beside them
        columns = [x for c in columns for x in ([c, interval(c)] if c.endswith(" speed-up") else [c])]
    if any(row["notes"] for row in rows):  # before the check, which stays the last column
        columns.insert(len(columns) - checked, "notes")
    return render_table(rows, columns, fmt, floatfmt=".3f")


def timing_label(records: list[dict[str, Any]]) -> str:
    """How the rows were timed, from the first record that says (kernel_timing.TimingMethod.describe)."""
    timing = next((r["timing"] for r in records if "timing" in r), None)
    config0 = records[0]["config"]
    if timing is None:  # a run that timed nothing, or a record from before the timing method was recorded
        return f"{config0['warmup']} warm-up, {config0['iters']} timed calls per phase"
    if timing["method"] == "triton.testing.do_bench":
        return (f"triton.testing.do_bench (warmup {timing['warmup_ms']:g} ms, rep {timing['rep_ms']:g} ms, L2 "
                f"flushed before every call, triton {timing['triton']}); tables show the mean, the record every "
                f"sample and the quantiles {', '.join(f'{q:g}' for q in timing['quantiles'])}")
    why = f"; {timing['why']}" if timing.get("why") else ""
    return (f"{timing['method']} ({timing['warmup_calls']} warm-up and {timing['timed_calls']} timed calls per "
            f"phase{why})")


def run_settings(records: list[dict[str, Any]]) -> dict[str, Any]:
    config0 = records[0]["config"]
    dtypes = list(dict.fromkeys(str(r["config"].get("dtype")) for r in records))
    return {"batch": config0["batch_size"], "dtype": " ".join(dtypes), "causal": "yes",
            "timing": timing_label(records)}


def check_note(records: list[dict[str, Any]]) -> str:
    """What the check columns mean, with the metric and the tolerances these records were checked with."""
    checks = [r["check"] for r in records if r.get("check")]
    if not checks:
        return ""
    tolerances = dict.fromkeys(f"{r['config']['dtype']} {r['check']['tolerance']:.0e}" for r in records
                               if r.get("check"))
    return (f"; max err: {checks[0]['metric']} over the output and the gradients of Q, K and V (the worst named) "
            "against causal attention in float64 on the same inputs; check: WRONG when it exceeds tol ("
            + ", ".join(tolerances) + ": docs/bench_attention.md). A WRONG kernel is still timed: its speed-ups say "
            "(wrong)")


def render_report(records: list[dict[str, Any]], fmt: str, columns: list[str] | None = None) -> str:
    """Environment header, one table per implementation (with `columns`: results.pick_columns), the comparison
    table and a note on the memory and check columns, from the JSONL records alone."""
    lines = environment_lines(records, run_settings)
    done = list(dict.fromkeys(r["config"]["impl"] for r in records))
    for impl in done:
        lines += ["", f"### {impl}", "", impl_table([r for r in records if r["config"]["impl"] == impl], fmt, columns,
                                                    merged=is_merged(records))]
    lines += ["", "### comparison", "", comparison_table(records, done, fmt), "",
              "mem before bwd: torch.cuda.memory_allocated after the forward, graph alive (CUDA only); "
              "saved (autograd): bytes the graph keeps for backward, measured with saved-tensor hooks; "
              "naive predicted: 2*batch*seq^2*elem (scores, softmax) + 4*batch*seq*d*elem (Q, K, V, output)"
              + check_note(records) + ". " + stats.speedup_note(BASELINE, "calls")]
    return "\n".join(lines)
