"""bench_attention's tables from its JSONL records alone (torch-free; report.py re-renders saved
runs with them): one table per implementation, then the comparison a student pastes, a row per
(d, seq, dtype) and implementation: its forward, backward and forward+backward beside naive's (the
handout's "PyTorch"), the speed-ups and the check."""
from __future__ import annotations

import math
from typing import Any

import results
from results import (RUN_COLUMN, comparison_groups, environment_lines, format_bytes, is_merged,
                     pick_columns, render_table, run_of, runs_cell, with_run_column)

BASELINE = "naive"  # the speed-ups are over it
PHASES = ("forward", "backward", "forward_backward")
ATTENTION_PHASE_SHORT = {"forward": "fwd", "backward": "bwd", "forward_backward": "fwd+bwd"}
ATTENTION_IMPL_COLUMNS = [
    "impl", "d", "seq", "dtype", "fwd ms", "fwd std", "bwd ms", "bwd std", "fwd+bwd ms",
    "fwd+bwd std", "fwd TFLOP/s", "mem before bwd", "peak mem", "saved (autograd)",
    "naive predicted", "backend", "compile s", "max err", "tol", "status"]
BASELINE_TIMES = ["naive fwd", "naive bwd", "naive fwd+bwd"]  # ms
ATTENTION_COLUMNS = ATTENTION_IMPL_COLUMNS + ["batch", *BASELINE_TIMES, "speed-up", "check"]


def check_summary(check: dict[str, Any]) -> str:
    """'WRONG: modifies q in place; dk error 5.1e-01 > tolerance 5e-02'; '' for a passed check."""
    if check["ok"]:
        return ""
    error, tolerance = check["max_error"], check["tolerance"]
    over = error is not None and math.isfinite(error) and error > tolerance  # NaN: named already
    return "WRONG: " + "; ".join(check["problems"] + over * [
        f"{check['worst']} error {error:.1e} > tolerance {tolerance:.0e}"])


def timed(record: dict[str, Any] | None) -> bool:
    return bool(record) and "forward_ms_mean" in record


def check_cell(record: dict[str, Any]) -> str:
    """The comparison's word on a record: ok, WRONG and what first, or why it has no times."""
    if not timed(record):
        return record["status"].split(":")[0]
    problems = record["check"]["problems"] or [record["check"]["worst"]]
    return "ok" if record["check"]["ok"] else "WRONG: " + problems[0].split(" (")[0]


def impl_row(record: dict[str, Any]) -> dict[str, Any]:
    config = record["config"]
    row = {"impl": config["impl"], "dtype": config["dtype"], "d": config["d"],
           "seq": config["seq_len"],
           "status": record["status"] + (f" ({record['note']})" if record.get("note") else ""),
           "naive predicted": format_bytes(record.get("predicted_naive_saved_bytes")),
           RUN_COLUMN: run_of(record)}
    if not timed(record):
        return row
    for phase, short in ATTENTION_PHASE_SHORT.items():
        row.update({f"{short} ms": record[f"{phase}_ms_mean"],
                    f"{short} std": record[f"{phase}_ms_std"]})
    check, error = record["check"], record["check"]["max_error"]
    finite = error is not None and math.isfinite(error)  # the error as text: .3f would show 0.000
    row.update({"fwd TFLOP/s": record["forward_tflops"], "backend": record.get("sdpa_backend"),
                "mem before bwd": format_bytes(record.get("mem_before_backward_bytes")),
                "peak mem": format_bytes(record.get("peak_mem_allocated_bytes")),
                "saved (autograd)": format_bytes(record["saved_tensor_bytes"]),
                "compile s": record.get("compile_s"), "tol": check["tolerance"],
                "max err": f"{f'{error:.1e}' if finite else 'not finite'} ({check['worst']})"})
    return row


def picked(default: list[str], columns: list[str] | None, fmt: str, has: list[str]) -> list[str]:
    """--columns: those this table has, in the order given (its default if it has none)."""
    return [c for c in pick_columns(default, columns, fmt) if c in has + [RUN_COLUMN]] or default


def impl_table(records: list[dict[str, Any]], fmt: str, columns: list[str] | None = None,
               merged: bool = False) -> str:
    rows = [impl_row(r) for r in records]
    shown = [c for c in ATTENTION_IMPL_COLUMNS if c in ("d", "seq", "status", "naive predicted")
             or any(row.get(c) is not None for row in rows)]
    shown.remove("impl")  # the heading says it, and the dtype when there is one
    shown = [c for c in shown if c != "dtype" or len({row["dtype"] for row in rows}) > 1]
    shown = picked([RUN_COLUMN] * merged + shown, columns, fmt, ATTENTION_IMPL_COLUMNS)
    return render_table(rows, shown, fmt, floatfmt=".3f")


def attention_comparison(records: list[dict[str, Any]], impls: list[str], fmt: str,
                         columns: list[str] | None = None) -> tuple[str, list[str]]:
    """(table, notes): a row per (d, seq, dtype, batch) and implementation other than naive, with
    naive's times, the speed-ups over naive (paired by round when timed together: results.speedup)
    and the check. In a merge where a configuration is in two runs, each run has its own rows."""
    def shape(c: dict[str, Any]) -> tuple:
        return c["d"], c["seq_len"], c["dtype"], c["batch_size"]

    by_shape: dict[tuple, dict[str, dict]] = {}
    groups = comparison_groups(records, lambda r: (r["config"]["impl"], *shape(r["config"])))
    for i, group in enumerate(groups):
        for r in group:
            by_shape.setdefault((i, *shape(r["config"])), {})[r["config"]["impl"]] = r
    rows, unresolved, few, pulled = [], [], {}, []  # notes under the table, over every row
    shorts = ATTENTION_PHASE_SHORT.values()
    for (_, d, seq, dtype, batch), found in by_shape.items():
        naive = found.get(BASELINE)
        for impl, r in [(i, found[i]) for i in impls if i in found and i != BASELINE]:
            row = {"d": d, "seq": seq, "dtype": dtype, "batch": batch, "impl": impl,
                   RUN_COLUMN: runs_cell(list(found.values())), "check": check_cell(r)}
            for phase, short in ATTENTION_PHASE_SHORT.items():
                row.update({f"{short} ms": r.get(f"{phase}_ms_mean"),
                            f"naive {short}": (naive or {}).get(f"{phase}_ms_mean")})
            if naive and check_cell(naive) != "ok":
                row["check"] = f"naive {check_cell(naive)}; {row['check']}"
            if timed(naive) and timed(r):
                speedups = [results.speedup(naive, r, (phase,)) for phase in PHASES]
                row["speed-up"] = "/".join(f"{s.ratio:.2f}" for s in speedups) + "x"
                where = f"d={d} seq={seq} {dtype} {impl}"
                unresolved += [f"{where} {short} ({s.interval_text()})"
                               for short, s in zip(shorts, speedups) if s.resolved is False]
                if speedups[0].rounds and speedups[0].low is None:  # too few for an interval
                    few[impl] = (speedups[0].rounds, "--iters")
                pulled += [f"{where} {short} {ratio:.2f}x"
                           for phase, short, s in zip(PHASES, shorts, speedups)
                           if (ratio := results.means_outside(s, naive, r, (phase,))) is not None]
            rows.append(row)
    base = BASELINE in impls
    several = [key for key in ("dtype", "batch") if len({row[key] for row in rows}) > 1]
    default = with_run_column(["d", "seq", *several, "impl"] + BASELINE_TIMES * base + [
        "fwd ms", "bwd ms", "fwd+bwd ms"] + ["speed-up"] * base + ["check"], records)
    table = render_table(rows, picked(default, columns, fmt, default), fmt, floatfmt=".3f")
    return table, results.interval_notes(unresolved, few, pulled, "calls")


def timing_label(records: list[dict[str, Any]]) -> str:
    """How the rows were timed, from the first record that says."""
    timing = next((r["timing"] for r in records if "timing" in r), None)
    if timing is None:  # nothing was timed
        return "nothing timed"
    if timing["method"] == "triton.testing.do_bench":
        return (f"triton.testing.do_bench (warmup {timing['warmup_ms']:g} ms, rep "
                f"{timing['rep_ms']:g} ms, L2 flushed before every call, "
                f"triton {timing['triton']})")
    why = f"; {timing['why']}" if timing.get("why") else ""
    return (f"{timing['method']} ({timing['warmup_calls']} warm-up and {timing['timed_calls']} "
            f"timed calls per phase{why})")


def attention_settings(records: list[dict[str, Any]]) -> dict[str, Any]:
    dtypes = dict.fromkeys(r["config"]["dtype"] for r in records)
    return {"batch": records[0]["config"]["batch_size"], "dtype": " ".join(dtypes), "causal": "yes",
            "timing": timing_label(records)}


NOTE = ("mem before bwd, peak mem: torch.cuda.memory_allocated after the forward, graph alive, and "
        "the peak with its backward (CUDA only); saved (autograd): bytes the graph keeps for "
        "backward (saved-tensor hooks, any device); naive predicted: what model.naive_attention "
        "keeps, 3*B*S^2*e (masked scores, exp, probabilities) + S^2 (bool mask) + (3d+2)*B*S*e (Q, "
        "K, V, row max and sum), equal to naive's saved bytes on any device, bf16 as fp32 (Q, K, V "
        "are made in the dtype: no autocast)")


def render_attention(records: list[dict[str, Any]], fmt: str,
                     columns: list[str] | None = None) -> str:
    """The environment, a table per implementation, the comparison (both with the `columns` they
    have) and what the columns mean."""
    lines = environment_lines(records, attention_settings)
    impls = list(dict.fromkeys(r["config"]["impl"] for r in records))
    for impl in impls:
        mine = [r for r in records if r["config"]["impl"] == impl]
        lines += ["", f"### {impl}", "", impl_table(mine, fmt, columns, is_merged(records))]
    if len(impls) > 1:
        table, notes = attention_comparison(records, impls, fmt, columns)
        lines += ["", "### comparison", "", table, "", "naive fwd, bwd, fwd+bwd: ms; speed-up: "
                  "naive's time / the implementation's, forward/backward/forward+backward",
                  *(f"- {note}" for note in notes)]
    tolerances = ", ".join(dict.fromkeys(f"{r['config']['dtype']} {r['check']['tolerance']:.0e}"
                                         for r in records if r.get("check")))
    checked = (f"; max err: max |x - ref| / (1 + |ref|) over the output and the gradients of Q, "
               f"K, V (the worst named) against causal attention in float64 on copies of the "
               f"inputs; WRONG above tol ({tolerances}), or for a kernel writing into its inputs "
               "or returning NaN/inf; a WRONG kernel is still timed") if tolerances else ""
    lines += ["", NOTE + checked + ". " + results.speedup_note(BASELINE, "calls")]
    return "\n".join(lines)


# the names report.py and test_report.py use, until integration
render_report, TABLE_COLUMNS = render_attention, ATTENTION_COLUMNS


def comparison_table(records: list[dict[str, Any]], impls: list[str], fmt: str) -> str:
    return attention_comparison(records, impls, fmt)[0]
