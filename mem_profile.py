"""Memory of the Transformer LM: peak memory of a forward pass and of a training step, the allocation timeline,
where the largest allocations come from, and what autograd keeps for backward.

Answers the study's memory questions: how much memory do forward-only and a full training step (forward,
backward, AdamW) need at each context length, with and without bf16 mixed precision; how big is one
residual-stream activation tensor; which allocations are the largest and which line of code makes them; what
does activation checkpointing buy, and at what cost in step time.

    python mem_profile.py --dtype fp32 bf16                     # the handout's question: 2026 xl at ctx 128, 2048
    python mem_profile.py --handout 2025 --dtype fp32 bf16      # the 2025 one: 2.7B at ctx 128, 256, 512
    python mem_profile.py --size xl --context-length 128 --mode train --dtype bf16 --snapshot     # + pickle, PNG
    python mem_profile.py --mode train --checkpoint 0 1 2 4 8     # checkpointing: 2026's xl, batch 4, ctx 2048
    python mem_profile.py --size xl --context-length 512 --attn naive sdpa --mode train           # attention kernels
    python mem_profile.py --analyze results/memory/<run>_<config>.pickle                          # re-read a snapshot

Peak memory is measured on CUDA only (torch.cuda.max_memory_allocated after warm-up, with the peak counter
reset; reserved memory too), each configuration in its own child process, an OOM is a row. `--snapshot`
records the allocator's history around one more step and saves the pickle (open it at pytorch.org/memory_viz),
a timeline PNG with the forward / backward / optimizer phases shaded, the largest allocations with the line of
code that made them, what was live at the peak, and a check of the peak rebuilt from the trace against
torch.cuda.memory_stats()["requested_bytes.all.peak"] (max_memory_allocated beside it). Three things need no GPU
(lm_memory.py): the accounting (weights, gradients, AdamW state, residual-stream and attention-score tensor
sizes), the saved-for-backward tables, measured with torch.autograd.graph.saved_tensors_hooks on fake tensors
(shapes and dtypes without memory, so even 2.7B takes seconds on a laptop), and with --checkpoint K the peak those
figures predict for each K (the model state, the N/K segment inputs, one segment's K recomputed blocks, the largest
transient), with the K that minimises it. Tables go to stdout and, with one JSON record per configuration, to
results/memory/.

Sizes and the default sizes and contexts come from the study's handout: the current one (2026, v26.1.1) unless
--handout or CS336_HANDOUT says 2025. --dry-run lists the configurations and runs nothing.
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import functools
import itertools
import json
import pickle
import sys
import time
import traceback
from pathlib import Path
from typing import Any

import torch

import cli
import common
import isolation
import memory_snapshot
import model_config
import report
import runner
import sweep
from cli import non_negative_int, positive_int
from common import DTYPES, resolve_device
from lm_memory import (FP32_BYTES, activation_figures, attention_scores_bytes, checkpoint_prediction,
                       residual_stream_bytes, saved_for_backward, static_memory_bytes, summarize_saved)
from model import ATTENTION
from model_config import DEFAULT_BATCH_SIZE, HANDOUTS, get_config
from results import GIB, MIB, ResultFiles, environment_header, format_bytes, render_table
from runner import MODES, RunConfig, Workload, run_step

CPU_NOTE = ("note: measured peaks and snapshots need a CUDA device, and this run is on {device}: only the "
            "accounting and the saved-for-backward tables are printed (those are exact on any device); the peak "
            "tables, per configuration and per context length, need a GPU run.")


# ---- accounting from the config ----


def accounting(run: RunConfig) -> dict[str, Any]:
    cfg, batch, ctx = run.model, run.batch_size, run.context_length
    record: dict[str, Any] = static_memory_bytes(cfg, run.mode)
    record["residual_stream_bytes"] = residual_stream_bytes(batch, ctx, cfg.d_model)
    record["residual_stream_formula"] = f"{batch} x {ctx} x {cfg.d_model} x {FP32_BYTES} B"
    record["attention_scores_layer_bytes"] = attention_scores_bytes(batch, cfg.num_heads, ctx, run.dtype)
    record["attention_scores_formula"] = (f"{batch} x {cfg.num_heads} x {ctx} x {ctx} x "
                                          f"{DTYPES[run.dtype].itemsize} B")
    return record


# ---- saved for backward ----


def saved_for_backward_record(run: RunConfig) -> dict[str, Any]:
    """The saved-for-backward summary of one configuration and its predicted peak (checkpoint_prediction), on fake
    tensors of its device (CUDA picks other attention kernels than the CPU, so sdpa's residuals differ)."""
    isolation.phase("saved for backward (fake tensors)")
    device = resolve_device(run.device)
    saved = saved_for_backward(run.model, run.batch_size, run.dtype, run.attn, run.checkpoint_every, device)
    record = summarize_saved(saved, run.model.num_layers)
    isolation.phase("predicting the peak (fake tensors)")
    figures = activation_figures(run.model, run.batch_size, run.dtype, run.attn, str(device), run.mode != "forward")
    record["checkpoint_prediction"] = checkpoint_prediction(run.model, run.batch_size, run.mode, run.checkpoint_every,
                                                            record["saved_blocks_bytes"], figures)
    return record


# ---- measured peaks and snapshots (CUDA only) ----


def snapshot_meta_path(pickle_path: str | Path) -> Path:
    """The JSON beside a snapshot pickle: phase marks and max_memory_allocated of the recorded step."""
    pickle_path = Path(pickle_path)
    return pickle_path.with_name(pickle_path.stem + "_meta.json")


def record_snapshot(work: Workload, path: str, max_entries: int) -> dict[str, Any]:
    """One more step with the allocator's history recorded (Python stacks, up to `max_entries` events, peak
    counter reset first); the snapshot pickled to `path`, recording stopped afterwards whatever happens.
    Phase boundaries are host-clock marks in microseconds since the epoch, the clock of the trace's time_us."""
    device = work.device
    marks: list[tuple[str, float]] = []
    isolation.phase("recording a memory snapshot")
    common.reset_peak_memory(device)
    torch.cuda.memory._record_memory_history(enabled="all", stacks="python", max_entries=max_entries,
                                             clear_history=True)
    try:
        run_step(work, on_phase=lambda phase: marks.append((phase, time.time_ns() / 1e3)))
        torch.cuda.synchronize(device)
        snapshot = torch.cuda.memory._snapshot()
    finally:
        torch.cuda.memory._record_memory_history(enabled=None)
    measured = common.peak_memory_bytes(device)["peak_mem_allocated_bytes"]
    # the trace records requested sizes: their peak is the counterpart of the rebuilt peak (memory_snapshot)
    requested = torch.cuda.memory_stats(device).get("requested_bytes.all.peak")
    with open(path, "wb") as f:
        pickle.dump(snapshot, f)
    snapshot_meta_path(path).write_text(json.dumps({"phase_marks": marks, "max_memory_allocated_bytes": measured,
                                                    "requested_bytes_peak": requested}))
    return {"snapshot_path": path, "snapshot_phase_marks": marks, "snapshot_max_allocated_bytes": measured,
            "snapshot_requested_peak_bytes": requested}


def measure_config(run: RunConfig, snapshot_path: str | None = None, max_entries: int = 1_000_000) -> dict[str, Any]:
    """CUDA only: the shared run path (warm-up, peak counter reset, `run.steps` timed steps, peaks): peak
    allocated and reserved bytes and the step times. With snapshot_path, one more step is recorded
    (record_snapshot)."""
    if resolve_device(run.device).type != "cuda":
        raise ValueError(f"measured peaks need a CUDA device, not {run.device}")
    work = Workload(run)
    record = runner.measure(runner.Prepared(step=lambda: run_step(work), device=work.device, warmup=run.warmup,
                                            steps=run.steps))
    if snapshot_path:
        record.update(record_snapshot(work, snapshot_path, max_entries))
    return record


def analyze_snapshot(path: str | Path, marks: list[tuple[str, float]] | None, measured_peak: int | None,
                     png_path: Path, title: str, top: int, requested_peak: int | None = None) -> dict[str, Any]:
    """Timeline, peak check, largest allocations, what was live at the peak, and the PNG, from a pickle."""
    snapshot = memory_snapshot.load_snapshot(path)
    timeline = memory_snapshot.rebuild_timeline(snapshot)
    spans = memory_snapshot.phase_spans([tuple(m) for m in marks or []])
    out: dict[str, Any] = {
        "snapshot_peak_check": memory_snapshot.peak_check(timeline.peak_bytes, requested_peak, measured_peak),
        "snapshot_largest": memory_snapshot.largest_allocations(snapshot, top, timeline.device, spans),
        "snapshot_live_at_peak": memory_snapshot.live_at_peak(snapshot, timeline, top),
        "snapshot_baseline_bytes": timeline.baseline_bytes, "snapshot_events": len(timeline.allocated_bytes)}
    try:
        out["snapshot_png"] = str(memory_snapshot.render_timeline_png(timeline, png_path, title, spans))
    except ImportError as exc:
        out["snapshot_png_note"] = str(exc)
    return out


# ---- the sweep ----


def slug(run: RunConfig) -> str:
    """The part of a file name that says which configuration a snapshot or PNG belongs to."""
    return run.label().replace("=", "").replace(" ", "_")


def profile_config(run: RunConfig, measure: bool, snapshot_prefix: str | None = None,
                   max_entries: int = 1_000_000) -> dict[str, Any]:
    """The measured part of one configuration's record: what autograd saves for backward and, on CUDA, the
    measured peak (and snapshot). A failed measurement is the row's status; the saved-for-backward summary,
    which needs no GPU, is kept either way."""
    record: dict[str, Any] = {}
    try:
        with stage(run, "saved"):
            record.update(saved_for_backward_record(run), saved_status="ok")
    except Exception as exc:  # noqa: BLE001 - a failure is data
        record.update(saved_status=common.failure_status(exc), saved_traceback=traceback.format_exc())
    if not measure:
        record["status"] = "skipped: measured peaks need a CUDA device"
        return record
    snapshot_path = f"{snapshot_prefix}_{slug(run)}.pickle" if snapshot_prefix else None
    try:
        with stage(run, "measure"):
            record.update(measure_config(run, snapshot_path, max_entries), status="ok")
    except Exception as exc:  # noqa: BLE001
        record.update(status=common.failure_status(exc), traceback=traceback.format_exc())
    return record


@contextlib.contextmanager
def stage(run: RunConfig, name: str) -> Any:
    """One of a configuration's two stages, each with its own status: the sweep's fault hook (tests) with the
    run's fields and `stage=saved|measure`, so either can be made to fail alone."""
    with sweep.injected_fault({**run.fault_fields(), "stage": name}):
        yield


def finish_record(run: RunConfig, record: dict[str, Any], files: ResultFiles, top: int) -> None:
    """The accounting from the config, the step-time statistics and the snapshot's analysis (timeline PNG,
    largest allocations, peak check), added in this process. A configuration that failed before its stages ran (a
    child killed or timed out, a fault injected for the whole configuration) has its status as its saved stage's."""
    record.update(accounting(run))
    record.setdefault("saved_status", record["status"])
    if record["status"] == "ok":
        record.update(runner.sample_stats(record, ("step",)))
    if "snapshot_path" in record:
        try:
            record.update(analyze_snapshot(record["snapshot_path"], record["snapshot_phase_marks"],
                                           record["snapshot_max_allocated_bytes"],
                                           files.path(f"_{slug(run)}_timeline.png"), run.label(), top,
                                           record.get("snapshot_requested_peak_bytes")))
        except Exception as exc:  # noqa: BLE001 - the measurement stands; the analysis failure is a field
            record["snapshot_status"] = common.failure_status(exc)


def profile_sweep(runs: list[RunConfig], args: argparse.Namespace, files: ResultFiles,
                  measure: bool) -> tuple[list[dict], int]:
    """Every configuration through the shared sweep. Without a GPU only fake tensors run: no child processes."""
    experiment = sweep.Experiment(
        name="mem_profile",
        measure=functools.partial(profile_config, measure=measure, max_entries=args.max_entries,
                                  snapshot_prefix=str(files.path("")) if args.snapshot and measure else None),
        finish=lambda run, record: finish_record(run, record, files, args.top),
        summary=lambda record: f"peak {format_bytes(record['peak_mem_allocated_bytes'])}",
        render=lambda records, fmt: render_report(records, fmt, args.columns))
    if not measure:
        args.in_process = True  # fake tensors only: nothing to isolate, and a child would cost more than the work
    return sweep.run_sweep(experiment, runs, files, resolve_device(args.device), args)


# ---- tables ----


def config_table(items: list[RunConfig] | list[dict], fmt: str) -> str:
    """The model configurations of the runs (RunConfig) or of their records, naming the handout."""
    configs = [dataclasses.asdict(x) if isinstance(x, RunConfig) else x["config"] for x in items]
    return model_config.config_table([(c["size"], model_config.ModelConfig(**c["model"])) for c in configs],
                                     HANDOUTS[configs[0].get("handout", model_config.DEFAULT_HANDOUT)], fmt)


def accounting_table(records: list[dict], fmt: str) -> str:
    rows, seen = [], set()
    for rec in records:
        c = rec["config"]
        key = (c["size"], c["model"]["context_length"], c["mode"], c["dtype"])
        if key in seen:
            continue
        seen.add(key)
        static = rec["weights_bytes"] + rec["grads_bytes"] + rec["adamw_state_bytes"]
        rows.append({"size": c["size"], "ctx": key[1], "mode": c["mode"], "dtype": c["dtype"],
                     "weights MiB": rec["weights_bytes"] / MIB, "grads MiB": rec["grads_bytes"] / MIB,
                     "AdamW state MiB": rec["adamw_state_bytes"] / MIB, "static GiB": static / GIB,
                     "residual stream MiB": rec["residual_stream_bytes"] / MIB,
                     "= B x S x d_model x 4 B":
                         f"{rec['residual_stream_formula']} = {rec['residual_stream_bytes']:,} B",
                     "scores/layer MiB": rec["attention_scores_layer_bytes"] / MIB,
                     "= B x H x S x S x bytes": rec["attention_scores_formula"]})
    return render_table(rows, list(rows[0]), fmt)


def saved_tables(records: list[dict], fmt: str) -> str:
    summary, ops, seen = [], [], set()
    for rec in records:
        c = rec["config"]
        key = (c["size"], c["model"]["context_length"], c["dtype"], c["attn"], c["checkpoint_every"])
        if key in seen:
            continue
        seen.add(key)
        ident = dict(zip(["size", "ctx", "dtype", "attn", "ckpt"], key))
        if rec["saved_status"] != "ok":
            summary.append({**ident, "status": rec["saved_status"]})
            continue
        summary.append({**ident, "per block MiB": rec["saved_block_bytes_mean"] / MIB,
                        "x layers": c["model"]["num_layers"], "blocks MiB": rec["saved_blocks_bytes"] / MIB,
                        "outside blocks MiB": rec["saved_outside_bytes"] / MIB,
                        "total MiB": rec["saved_total_bytes"] / MIB, "status": "ok"})
        for scope, rows in (("per block", rec["saved_block_top"]), ("outside blocks", rec["saved_outside_top"])):
            for row in rows:
                ops.append({**ident, "scope": scope, "module": row["module"], "op": row["op"],
                            "shape": row["shape"], "tensor dtype": row["dtype"], "MiB": row["bytes"] / MIB,
                            "share": f"{row['share']:.1%}"})
    columns = ["size", "ctx", "dtype", "attn", "ckpt", "per block MiB", "x layers", "blocks MiB",
               "outside blocks MiB", "total MiB", "status"]
    text = render_table(summary, columns, fmt)
    if ops:
        text += ("\n\nLargest saved tensors: the top 5 per block (MiB per block, share of the blocks' total) and "
                 "the top 3 outside the blocks (share of the total):\n\n" + render_table(ops, list(ops[0]), fmt))
    return text


PEAK_COLUMNS = ["size", "ctx", "mode", "dtype", "attn", "ckpt", "peak alloc MiB", "peak alloc GiB",
                "peak reserved MiB", "peak reserved GiB", "step ms", "status"]


def peak_rows(records: list[dict]) -> list[dict[str, Any]]:
    """One row of the peak-memory table per configuration (report.py re-renders them)."""
    rows = []
    for rec in records:
        c = rec["config"]
        row = {"size": c["size"], "ctx": c["model"]["context_length"], "mode": c["mode"], "dtype": c["dtype"],
               "attn": c["attn"], "ckpt": c["checkpoint_every"], "status": rec["status"]}
        if rec["status"] == "ok":
            row.update({"peak alloc MiB": rec["peak_mem_allocated_bytes"] / MIB,
                        "peak alloc GiB": rec["peak_mem_allocated_bytes"] / GIB,
                        "peak reserved MiB": rec["peak_mem_reserved_bytes"] / MIB,
                        "peak reserved GiB": rec["peak_mem_reserved_bytes"] / GIB,
                        "step ms": rec["step_ms_mean"]})
        rows.append(row)
    return rows


def peak_table(records: list[dict], fmt: str, columns: list[str] | None = None) -> str:
    return render_table(peak_rows(records), report.pick_columns(PEAK_COLUMNS, columns, fmt), fmt)


def peak_by_context_table(records: list[dict], fmt: str) -> str | None:
    """The memory_profiling answer as the study asks for it: one row per size and context length, the peak of
    each mode side by side (forward, then a training step), for each dtype (fp32 beside bf16). attn and ckpt
    get a column only when they vary. A failed configuration shows its status in its cell. None when no
    configuration was measured (a CPU run: there are no measured peaks to show)."""
    if all(rec["status"].startswith("skipped") for rec in records):
        return None
    configs = [rec["config"] for rec in records]
    varying = [key for key in ("attn", "checkpoint_every") if len({c[key] for c in configs}) > 1]
    dtypes = list(dict.fromkeys(c["dtype"] for c in configs))
    modes = [m for m in MODES if any(c["mode"] == m for c in configs)]
    columns = ["size", "ctx"] + [{"checkpoint_every": "ckpt"}.get(k, k) for k in varying]
    columns += [f"{dtype} {mode} GiB" for dtype in dtypes for mode in modes]
    rows: dict[tuple, dict[str, Any]] = {}
    for rec, c in zip(records, configs):
        key = (c["size"], c["model"]["context_length"], *(c[k] for k in varying))
        row = rows.setdefault(key, dict(zip(columns, key)))
        ok = rec["status"] == "ok"
        row[f"{c['dtype']} {c['mode']} GiB"] = rec["peak_mem_allocated_bytes"] / GIB if ok else rec["status"]
    return render_table(list(rows.values()), columns, fmt, floatfmt=".3f")


CHECKPOINT_COLUMNS = ["size", "ctx", "mode", "dtype", "attn", "K", "kept MiB", "recomputed MiB", "transient MiB",
                      "state GiB", "predicted GiB", "at", "measured GiB", "measured / predicted"]


def checkpoint_table(records: list[dict], fmt: str) -> str | None:
    """Activation checkpointing, one row per configuration: the parts of its predicted peak (checkpoint_prediction:
    what the forward kept for backward, one recomputed segment, the largest transient, the model state), the
    predicted peak and the moment it falls in, beside the measured peak where there is one (CUDA); then the K that
    minimises the prediction. None when no configuration checkpoints or none was predicted."""
    predicted = [r for r in records if r.get("checkpoint_prediction")]
    if not any(r["config"]["checkpoint_every"] for r in predicted):
        return None
    rows = []
    for rec in predicted:
        c, p = rec["config"], rec["checkpoint_prediction"]
        k = c["checkpoint_every"]
        row = {"size": c["size"], "ctx": c["model"]["context_length"], "mode": c["mode"], "dtype": c["dtype"],
               "attn": c["attn"], "K": k, "kept MiB": p["kept_bytes"] / MIB,
               "recomputed MiB": min(k, c["model"]["num_layers"]) * p["block_bytes"] / MIB if k else None,
               "transient MiB": p["transient_bytes"] / MIB, "state GiB": p["state_bytes"] / GIB,
               "predicted GiB": p["predicted_peak_bytes"] / GIB, "at": p["peak_moment"]}
        if rec["status"] == "ok" and rec.get("peak_mem_allocated_bytes"):
            row["measured GiB"] = rec["peak_mem_allocated_bytes"] / GIB
            row["measured / predicted"] = f"{rec['peak_mem_allocated_bytes'] / p['predicted_peak_bytes']:.2f}"
        rows.append(row)
    columns = [c for c in CHECKPOINT_COLUMNS if c not in ("measured GiB", "measured / predicted")
               or any(c in row for row in rows)]
    best = {(r["config"]["size"], r["config"]["model"]["context_length"], r["config"]["mode"], r["config"]["dtype"],
             r["config"]["attn"]): r["checkpoint_prediction"] for r in predicted}
    minima = "; ".join(f"{size} ctx {ctx} {mode} {dtype} {attn}: K = {p['best_k']} "
                       f"({p['best_predicted_peak_bytes'] / GIB:.3f} GiB)"
                       for (size, ctx, mode, dtype, attn), p in best.items())
    return (render_table(rows, columns, fmt, floatfmt=".3f") + "\n\nPredicted peak: the largest of the moments a "
            "step's peak can fall in (at): backward starts (model state without gradients + what the forward kept + "
            "what the rest of the model keeps + the largest transient), the first segment's backward with K > 0 (the "
            "state + the gradients already made + the ceil(N/K) segment inputs + its K blocks recomputed), backward "
            "ends (state + gradients), the optimizer step (+ one parameter-sized temporary). kept: what the blocks "
            "keep for backward (with K > 0, one residual-stream tensor per segment); recomputed: one segment's K "
            f"blocks. Smallest predicted peak over K = 0..N: {minima}.")


def snapshot_report(title: str, fields: dict[str, Any], fmt: str) -> str:
    """The peak check row, the largest allocations and what was live at the peak, for one snapshot."""
    check = fields["snapshot_peak_check"]

    def mib(key: str) -> float | None:
        return check[key] / MIB if check.get(key) is not None else None

    check_row = {"check": "peak rebuilt from the trace vs requested_bytes.all.peak",
                 "rebuilt MiB": mib("rebuilt_peak_bytes"), "requested peak MiB": mib("requested_peak_bytes"),
                 "diff MiB": mib("diff_bytes"), "status": check["status"],
                 "max_memory_allocated MiB (rounded blocks)": mib("max_memory_allocated_bytes")}
    largest = [{"size MiB": r["size_bytes"] / MIB, "count": r["count"], "total MiB": r["total_bytes"] / MIB,
                "first frame in this project's code": r["sites"], "phase": r["phases"]}
               for r in fields["snapshot_largest"]]
    live = [{"live at the peak, by site": r["site"], "count": r["count"], "MiB": r["bytes"] / MIB,
             "share of peak": f"{r['share']:.1%}"} for r in fields["snapshot_live_at_peak"]]
    parts = [f"#### Snapshot: {title}", "", render_table([check_row], list(check_row), fmt), "",
             "Largest allocations in the recorded step:", "",
             render_table(largest, list(largest[0]) if largest else ["size MiB"], fmt), "",
             render_table(live, list(live[0]), fmt)]
    if "snapshot_png" in fields:
        parts += ["", f"timeline: {fields['snapshot_png']}"]
    else:
        parts += ["", f"no timeline image: {fields['snapshot_png_note']}"]
    return "\n".join(parts)


def render_report(records: list[dict], fmt: str, columns: list[str] | None = None) -> str:
    """The accounting, saved-for-backward, peak (with `columns`: report.pick_columns) and snapshot tables from the
    JSONL records alone."""
    env = next((r["environment"] for r in records if "device_name" in r.get("environment", {})), None)
    config0 = records[0]["config"]
    settings = {"sizes from": HANDOUTS[config0.get("handout", model_config.DEFAULT_HANDOUT)].title,
                "batch": config0["batch_size"], "warmup": config0["warmup"], "steps": config0["steps"]}
    parts = [environment_header(env, **settings) if env else f"settings: {settings}", "", config_table(records, fmt), "",
             "### Accounting from the config (MiB and GiB are 2^20 and 2^30 bytes)", "",
             accounting_table(records, fmt), "",
             "### Saved for backward (autograd's residuals for one forward pass and the loss; each storage once)",
             "", saved_tables(records, fmt), ""]
    checkpointing = checkpoint_table(records, fmt)
    if checkpointing:
        parts += ["### Activation checkpointing: the predicted peak for each K (any device)", "", checkpointing, ""]
    devices = {r["environment"].get("device", "") for r in records}
    if not any(d.startswith("cuda") for d in devices):
        parts.append(CPU_NOTE.format(device=", ".join(sorted(devices))))
        return "\n".join(parts)
    parts += ["### Peak memory (after warm-up, peak counter reset; allocated = tensors, reserved = allocator)",
              "", peak_table(records, fmt, columns)]
    by_context = peak_by_context_table(records, fmt)
    if by_context is not None:
        parts += ["", "### Peak allocated memory per context length (GiB = 2^30 bytes): forward-only beside a "
                      "training step", "", by_context]
    for rec in records:
        if "snapshot_peak_check" in rec:
            parts += ["", snapshot_report(rec["label"], rec, fmt)]
        elif "snapshot_status" in rec:
            parts += ["", f"snapshot of {rec['label']}: {rec['snapshot_status']}"]
    return "\n".join(parts)


# ---- command line ----


def build_parser() -> argparse.ArgumentParser:
    p = cli.ArgParser(description=__doc__.split("\n\n")[0],
                      formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    cli.add_size_args(p, "the handout's memory_profiling size, 2026: xl, 2025: 2.7B; with --checkpoint K > 0, "
                            "the gradient_checkpointing size, 2026: xl")
    p.add_argument("--context-length", type=positive_int, nargs="+", default=None,
                   help="sequence length(s) (default: the handout's memory_profiling contexts, 2026: 128 2048, "
                        "2025: 128 256 512; with --checkpoint K > 0, the gradient_checkpointing context, 2026: 2048)")
    p.add_argument("--checkpoint", type=non_negative_int, nargs="+", default=[0], metavar="K",
                   help="activation checkpointing every K blocks (non-reentrant torch.utils.checkpoint); 0 = off; "
                        "each K's predicted peak (any device) beside its measured peak and step time (CUDA)")
    p.add_argument("--batch-size", type=positive_int, default=None,
                   help=f"batch size (default: {DEFAULT_BATCH_SIZE}, or the gradient_checkpointing batch with "
                        "--checkpoint K > 0: 4 in 2026)")
    cli.add_workload_args(p, MODES, DTYPES, ATTENTION, several_modes=True, several_warmups=False, warmup=3, steps=5)
    p.add_argument("--snapshot", action="store_true",
                   help="CUDA only: record the allocator's history around one more step; save the pickle "
                        "(pytorch.org/memory_viz), a timeline PNG, the largest allocations and the peak check")
    p.add_argument("--max-entries", type=positive_int, default=1_000_000,
                   help="allocator events kept by --snapshot (a ring buffer: older events are dropped)")
    p.add_argument("--top", type=positive_int, default=10, help="rows in the largest-allocations tables")
    p.add_argument("--analyze", metavar="PICKLE", default=None,
                   help="analyse a saved snapshot instead of running (timeline PNG, largest allocations, peak "
                        "check when its _meta.json is beside it); needs no GPU")
    cli.add_device_args(p)
    sweep.add_sweep_args(p)
    cli.add_output_args(p, default_stem="memory")
    report.add_columns_and_plot_args(p, "mem_profile")
    cli.add_dry_run_arg(p)
    return p


def parse_args(argv: list[str] | None = None) -> tuple[argparse.Namespace, list[RunConfig]]:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.analyze is not None:
        if args.dry_run:
            parser.error("--dry-run lists a sweep's configurations; --analyze runs none")
        if not Path(args.analyze).is_file():
            parser.error(f"--analyze: {'not a file' if Path(args.analyze).exists() else 'no such file'}: "
                         f"{args.analyze}")
        return args, []
    common.device_or_exit(parser, args.device)
    report.columns_or_exit(parser, args.columns, PEAK_COLUMNS)
    handout = cli.handout_or_exit(parser, args)
    # the study's setup when none is given: gradient_checkpointing (b) when checkpointing is asked for and the
    # handout has that question, its memory_profiling question otherwise
    if any(args.checkpoint) and handout.checkpoint_setup is not None:
        default_size, default_batch, default_context = handout.checkpoint_setup
        default_contexts = (default_context,)
    else:
        default_size, default_batch = handout.memory_size, DEFAULT_BATCH_SIZE
        default_contexts = handout.memory_contexts
    args.batch_size = args.batch_size or default_batch
    sizes = cli.sizes_or_exit(parser, args, args.size or [default_size])
    args.context_length = args.context_length or list(default_contexts)
    runs = []
    try:
        for size, ctx, mode, dtype, attn, k in itertools.product(sizes, args.context_length, args.mode, args.dtype,
                                                                 args.attn, args.checkpoint):
            runs.append(RunConfig(size=size, handout=args.handout,
                                  model=get_config(size, args.handout, context_length=ctx),
                                  batch_size=args.batch_size, warmup=args.warmup, steps=args.steps, mode=mode,
                                  dtype=dtype, attn=attn, device=args.device, seed=args.seed, checkpoint_every=k))
    except model_config.ConfigError as exc:
        parser.error(str(exc))
    for run in runs:
        cli.check_tensor_sizes(parser, model_config.model_tensor_shapes(run.model, run.batch_size))
    return args, runs


def analyze_main(args: argparse.Namespace, files: ResultFiles) -> int:
    """--analyze: the snapshot tables and PNG from a pickle, with the phases and measured peak of its
    _meta.json when there is one."""
    meta_path = snapshot_meta_path(args.analyze)
    meta = json.loads(meta_path.read_text()) if meta_path.is_file() else {}
    try:
        fields = analyze_snapshot(args.analyze, meta.get("phase_marks"), meta.get("max_memory_allocated_bytes"),
                                  files.path("_timeline.png"), Path(args.analyze).name, args.top,
                                  meta.get("requested_bytes_peak"))
    # Not a pickle, truncated, or a pickle of something else (entries lacking fields or of the wrong type): bad
    # input, so one line and exit 2.
    except (OSError, EOFError, ValueError, pickle.UnpicklingError, ImportError, KeyError, TypeError, AttributeError,
            IndexError) as exc:
        print(f"error: cannot analyse {args.analyze}: {type(exc).__name__}: {exc}", file=sys.stderr)
        files.release()
        return 2
    files.append_record({"snapshot_path": args.analyze, **fields})
    files.publish(lambda fmt: snapshot_report(args.analyze, fields, fmt), args.fmt,
                  [fields["snapshot_png"]] if "snapshot_png" in fields else [])
    return 0


def main(argv: list[str] | None = None) -> int:
    args, runs = parse_args(argv)
    if args.dry_run:
        return cli.print_dry_run([run.label() for run in runs], preamble=config_table(runs, args.fmt))
    files = ResultFiles(args.results_dir, "memory", args.out, "memory")
    if args.analyze is not None:
        return analyze_main(args, files)
    records, code = profile_sweep(runs, args, files, measure=resolve_device(args.device).type == "cuda")
    if records:  # (the sweep saved the report after each row: the figures come after it)
        figures = report.figures_after_run("mem_profile", records, files) if args.plot else []
        files.publish(lambda fmt: render_report(records, fmt, args.columns), args.fmt,
                      [r[k] for r in records for k in ("snapshot_path", "snapshot_png") if k in r] + figures)
    return code


if __name__ == "__main__":
    sys.exit(main())
