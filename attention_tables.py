"""bench_attention's tables from its JSONL records alone (torch-free; report.py re-renders saved runs with them): one
table per implementation, then the comparison a student pastes: one row per (d, seq, dtype) and implementation, its
forward, backward and forward+backward beside naive's (the handout's "PyTorch"), the speed-ups and the check.
"""
from __future__ import annotations

import math
from typing import Any

import stats
from results import (RUN_COLUMN, comparison_groups, environment_lines, format_bytes, is_merged, pick_columns,
                     render_table, run_of, runs_cell, with_run_column)

BASELINE = "naive"  # the speed-ups are over it
PHASES = ("forward", "backward", "forward_backward")
ATTENTION_PHASE_SHORT = {"forward": "fwd", "backward": "bwd", "forward_backward": "fwd+bwd"}
ATTENTION_IMPL_COLUMNS = ["impl", "d", "seq", "dtype", "fwd ms", "fwd std", "bwd ms", "bwd std", "fwd+bwd ms",
                          "fwd+bwd std", "fwd TFLOP/s", "mem before bwd", "peak mem", "saved (autograd)",
                          "naive predicted", "backend", "compile s", "max err", "tol", "status"]
ATTENTION_ALWAYS_SHOWN = {"d", "seq", "fwd ms", "bwd ms", "naive predicted", "status"}
SPEEDUPS = "speed-up"
BASELINE_TIMES = [f"{BASELINE} {short}" for short in ATTENTION_PHASE_SHORT.values()]  # ms
ATTENTION_COLUMNS = ATTENTION_IMPL_COLUMNS + ["batch", *BASELINE_TIMES, SPEEDUPS, "check"]  # what --columns names


def check_summary(check: dict[str, Any]) -> str:
    """'WRONG: modifies q in place; dk error 5.1e-01 > tolerance 5e-02' for a failed check; '' for a passed one."""
    if check["ok"]:
        return ""
    error, tolerance = check["max_error"], check["tolerance"]
    over = [f"{check['worst']} error {error:.1e} > tolerance {tolerance:.0e}"] if (
        error is not None and math.isfinite(error) and error > tolerance) else []
    return "WRONG: " + "; ".join(check.get("problems", []) + over)


def timed(record: dict[str, Any] | None) -> bool:
    return bool(record) and "forward_ms_mean" in record


def check_cell(record: dict[str, Any]) -> str:
    """The comparison's word on one record: ok, WRONG and the first thing wrong, or why it has no times."""
    if not timed(record):
        return record["status"].split(":")[0]
    if record["check"]["ok"]:
        return "ok"
    problems = record["check"].get("problems")
    return "WRONG: " + (problems[0].split(" (")[0] if problems else record["check"]["worst"])


def impl_row(record: dict[str, Any]) -> dict[str, Any]:
    config = record["config"]
    row = {"impl": config["impl"], "dtype": config.get("dtype"), "d": config["d"], "seq": config["seq_len"],
           "status": record["status"], "naive predicted": format_bytes(record.get("predicted_naive_saved_bytes")),
           RUN_COLUMN: run_of(record)}
    if not timed(record):
        return row
    row["status"] += f" ({record['note']})" if record.get("note") else ""
    for phase, short in ATTENTION_PHASE_SHORT.items():
        row.update({f"{short} ms": record.get(f"{phase}_ms_mean"), f"{short} std": record.get(f"{phase}_ms_std")})
    row.update({"fwd TFLOP/s": record.get("forward_tflops"), "backend": record.get("sdpa_backend"),
                "mem before bwd": format_bytes(record.get("mem_before_backward_bytes")),
                "peak mem": format_bytes(record.get("peak_mem_allocated_bytes")),
                "saved (autograd)": format_bytes(record.get("saved_tensor_bytes")),
                "compile s": record.get("compile_s")})
    if check := record.get("check"):  # as text: floatfmt would round 1e-07 to 0.000
        error = check["max_error"]
        shown = f"{error:.1e}" if error is not None and math.isfinite(error) else "not finite"
        row.update({"max err": f"{shown} ({check['worst']})", "tol": check["tolerance"]})
    return row


def impl_table(records: list[dict[str, Any]], fmt: str, columns: list[str] | None = None,
               merged: bool = False) -> str:
    rows = [impl_row(r) for r in records]
    shown = [c for c in ATTENTION_IMPL_COLUMNS[1:]
             if c in ATTENTION_ALWAYS_SHOWN or any(row.get(c) is not None for row in rows)]
    if len({row["dtype"] for row in rows}) == 1:  # one dtype: the header says it
        shown.remove("dtype")
    default = [RUN_COLUMN] + shown if merged else shown
    picked = [c for c in pick_columns(default, columns, fmt) if c in ATTENTION_IMPL_COLUMNS + [RUN_COLUMN]]
    return render_table(rows, picked or default, fmt, floatfmt=".3f")


def attention_comparison(records: list[dict[str, Any]], impls: list[str], fmt: str,
                         columns: list[str] | None = None) -> tuple[str, list[str]]:
    """(table, notes): a row per (d, seq, dtype, batch) and implementation other than naive, naive's times beside
    its own, the speed-ups over naive (paired by round when timed interleaved: stats.speedup) and the check. In a
    merge where one configuration is in two runs, each run has its own rows (results.comparison_groups)."""
    def shape(c: dict[str, Any]) -> tuple:
        return c["d"], c["seq_len"], c.get("dtype"), c.get("batch_size")

    by_shape: dict[tuple, dict[str, dict]] = {}
    for i, group in enumerate(comparison_groups(records, lambda r: (r["config"]["impl"], *shape(r["config"])))):
        for r in group:
            by_shape.setdefault((i, *shape(r["config"])), {})[r["config"]["impl"]] = r
    base = BASELINE if BASELINE in impls else None
    rows, notes = [], []
    for (_, d, seq, dtype, batch), found in by_shape.items():
        naive = found.get(base)
        for impl in [i for i in impls if i in found and i != base]:
            r = found[impl]
            row: dict[str, Any] = {"d": d, "seq": seq, "dtype": dtype, "batch": batch, "impl": impl,
                                   RUN_COLUMN: runs_cell(list(found.values()))}
            for phase, short in ATTENTION_PHASE_SHORT.items():
                row[f"{short} ms"] = r.get(f"{phase}_ms_mean")
                row[f"{BASELINE} {short}"] = naive.get(f"{phase}_ms_mean") if naive else None
            cells = [f"{BASELINE} {check_cell(naive)}" if naive and check_cell(naive) != "ok" else "", check_cell(r)]
            row["check"] = "; ".join(c for c in cells if c)
            if timed(naive) and timed(r):
                speedups = [stats.speedup(naive, r, (phase,)) for phase in PHASES]
                row[SPEEDUPS] = "/".join(f"{s.ratio:.2f}" for s in speedups) + "x"
                where = f"d={d} seq={seq} {dtype} {impl}"
                unresolved = [f"{where} {short} ({s.interval_text()})"
                              for short, s in zip(ATTENTION_PHASE_SHORT.values(), speedups) if s.resolved is False]
                few = {impl: (speedups[0].rounds, "--iters")} if speedups[0].rounds and speedups[0].low is None else {}
                pulled = [f"{where} {short} {ratio:.2f}x" for phase, short, s in zip(PHASES, ATTENTION_PHASE_SHORT.values(),
                                                                                     speedups)
                          if (ratio := stats.means_outside(s, naive, r, (phase,))) is not None]
                notes += stats.interval_notes(unresolved, few, pulled, "calls")
            rows.append(row)
    several = {key: len({row[key] for row in rows}) > 1 for key in ("dtype", "batch")}
    default = with_run_column(["d", "seq"] + [k for k in ("dtype", "batch") if several[k]] + ["impl"]
                              + (BASELINE_TIMES if base else []) + ["fwd ms", "bwd ms", "fwd+bwd ms"]
                              + ([SPEEDUPS] if base else []) + ["check"], records)
    picked = [c for c in pick_columns(default, columns, fmt) if c in default] if columns else default
    return render_table(rows, picked or default, fmt, floatfmt=".3f"), list(dict.fromkeys(notes))


def comparison_table(records: list[dict[str, Any]], impls: list[str], fmt: str,
                     columns: list[str] | None = None) -> str:
    return attention_comparison(records, impls, fmt, columns)[0]


def timing_label(records: list[dict[str, Any]]) -> str:
    """How the rows were timed, from the first record that says."""
    timing = next((r["timing"] for r in records if "timing" in r), None)
    if timing is None:  # nothing was timed
        return f"{records[0]['config']['warmup']} warm-up, {records[0]['config']['iters']} timed calls per phase"
    if timing["method"] == "triton.testing.do_bench":
        return (f"triton.testing.do_bench (warmup {timing['warmup_ms']:g} ms, rep {timing['rep_ms']:g} ms, L2 "
                f"flushed before every call, triton {timing['triton']}); tables show the mean, the record every "
                "sample")
    why = f"; {timing['why']}" if timing.get("why") else ""
    return f"{timing['method']} ({timing['warmup_calls']} warm-up and {timing['timed_calls']} timed calls per phase{why})"


def attention_settings(records: list[dict[str, Any]]) -> dict[str, Any]:
    dtypes = dict.fromkeys(str(r["config"].get("dtype")) for r in records)
    return {"batch": records[0]["config"]["batch_size"], "dtype": " ".join(dtypes), "causal": "yes",
            "timing": timing_label(records)}


def render_attention(records: list[dict[str, Any]], fmt: str, columns: list[str] | None = None) -> str:
    """Environment header, one table per implementation (`columns`: results.pick_columns), the comparison (the same
    `columns`, those it has) and what the columns mean, from the JSONL records alone."""
    lines = environment_lines(records, attention_settings)
    impls = list(dict.fromkeys(r["config"]["impl"] for r in records))
    for impl in impls:
        lines += ["", f"### {impl}", "",
                  impl_table([r for r in records if r["config"]["impl"] == impl], fmt, columns, is_merged(records))]
    if len(impls) > 1:
        table, notes = attention_comparison(records, impls, fmt, columns)
        lines += ["", "### comparison", "", table, "", f"{', '.join(BASELINE_TIMES)}: ms; speed-up: naive's time / "
                  "the implementation's, forward/backward/forward+backward", *(f"- {note}" for note in notes)]
    tolerances = ", ".join(dict.fromkeys(f"{r['config']['dtype']} {r['check']['tolerance']:.0e}"
                                         for r in records if r.get("check")))
    lines += ["", "mem before bwd, peak mem: torch.cuda.memory_allocated after the forward, graph alive, and the "
              "peak with the backward (CUDA only); saved (autograd): bytes the graph keeps for backward (saved-tensor "
              "hooks, any device); naive predicted: what model.naive_attention keeps, 3 B*S^2*e (masked scores, exp, "
              "probabilities) + S^2 (bool mask) + (3d+2)*B*S*e (Q, K, V, row max and sum), equal to naive's saved "
              "bytes on any device and in bf16 as in fp32 (Q, K, V are made in the dtype: no autocast here)"
              + (f"; max err: max |x - ref| / (1 + |ref|) over the output and the gradients of Q, K and V (the "
                 f"worst named) against causal attention in float64 on copies of the same inputs; WRONG above tol "
                 f"({tolerances}) or when the kernel writes into its inputs or returns NaN/inf; a WRONG kernel is "
                 "still timed" if tolerances else "") + ". " + stats.speedup_note(BASELINE, "calls")]
    return "\n".join(lines)


# the names report.py and test_report.py use, until the integration renames them
render_report, TABLE_COLUMNS = render_attention, ATTENTION_COLUMNS
