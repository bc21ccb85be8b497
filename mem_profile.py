"""Memory of the Transformer LM: peak memory of a forward pass and of a training step, the allocation timeline,
where the largest allocations come from, and what autograd keeps for backward.

Answers the study's memory questions: how much memory do forward-only and a full training step (forward,
backward, AdamW) need at each context length, with and without bf16 mixed precision; how big is one
residual-stream activation tensor; which allocations are the largest and which line of code makes them; what
does activation checkpointing buy, and at what cost in step time.

    python3 mem_profile.py --dtype fp32 bf16                     # the handout's question: 2026 xl at ctx 128, 2048
    python3 mem_profile.py --handout 2025 --dtype fp32 bf16      # the 2025 one: 2.7B at ctx 128, 256, 512
    python3 mem_profile.py --size xl --context-length 128 --mode train --dtype bf16 --snapshot     # + pickle, PNG
    python3 mem_profile.py --mode train --checkpoint 0 1 2 4 8     # checkpointing: 2026's xl, batch 4, ctx 2048
    python3 mem_profile.py --size xl --context-length 512 --attn naive sdpa --mode train           # attention kernels
    python3 mem_profile.py --analyze results/memory/<run>_<config>.pickle                          # re-read a snapshot
    python3 mem_profile.py --model cs336_basics.model:BasicsTransformerLM --snapshot               # the staff model

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
transient), with the K that minimises it. Tables (memory_tables.py, the code report.py re-renders saved runs with)
go to stdout and, with one JSON record per configuration, to results/memory/.

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
from typing import Any, Callable

import torch

import cli
import common
import isolation
import memory_snapshot
import memory_tables
import model_config
import report
import runner
import sweep
import user_code
from cli import non_negative_int, positive_int
from common import DTYPES, resolve_device
from e2e_tables import config_table
from lm_memory import (FP32_BYTES, activation_figures, attention_scores_bytes, checkpoint_prediction,
                       residual_stream_bytes, saved_for_backward, static_memory_bytes, summarize_saved)
from model import ATTENTION
from model_config import DEFAULT_BATCH_SIZE, MODES, get_config
from results import ResultFiles, finished, format_bytes
from runner import RunConfig, Workload, run_step

# ---- accounting from the config ----


def accounting(run: RunConfig, num_params: int | None = None) -> dict[str, Any]:
    """The formulas' figures for one configuration; `num_params` (counted on your --model) replaces our
    architecture's count in the weights, gradients and AdamW state."""
    cfg, batch, ctx = run.model, run.batch_size, run.context_length
    record: dict[str, Any] = static_memory_bytes(cfg, run.mode, num_params)
    record["residual_stream_bytes"] = residual_stream_bytes(batch, ctx, cfg.d_model)
    record["residual_stream_formula"] = f"{batch} x {ctx} x {cfg.d_model} x {FP32_BYTES} B"
    record["attention_scores_layer_bytes"] = attention_scores_bytes(batch, cfg.num_heads, ctx, run.dtype)
    record["attention_scores_formula"] = (f"{batch} x {cfg.num_heads} x {ctx} x {ctx} x "
                                          f"{DTYPES[run.dtype].itemsize} B")
    return record


# ---- saved for backward ----


def saved_for_backward_record(run: RunConfig) -> dict[str, Any]:
    """The saved-for-backward summary of one configuration, on fake tensors of its device (CUDA picks other
    attention kernels than the CPU, so sdpa's residuals differ); for our model also the peak it predicts
    (lm_memory.checkpoint_prediction: checkpointing is ours only)."""
    isolation.phase("saved for backward (fake tensors)")
    device = resolve_device(run.device)
    saved = saved_for_backward(run.model, run.batch_size, run.dtype, run.attn, run.checkpoint_every, device,
                               model_factory=run.model_factory)
    summary = summarize_saved(saved, run.model.num_layers)
    if run.model_factory is not None:  # your parameters, counted on meta tensors (no memory)
        with torch.device("meta"):
            model = runner.build_model(run.model, factory=run.model_factory)
        summary["model_num_params"] = sum(p.numel() for p in model.parameters())
        return summary
    isolation.phase("predicting the peak (fake tensors)")
    figures = activation_figures(run.model, run.batch_size, run.dtype, run.attn, str(device), run.mode != "forward")
    summary["checkpoint_prediction"] = checkpoint_prediction(run.model, run.batch_size, run.mode, run.checkpoint_every,
                                                             summary["saved_blocks_bytes"], figures)
    return summary


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
                     png_path: Path, title: str, top: int, requested_peak: int | None = None,
                     code_root: str | Path | None = None) -> dict[str, Any]:
    """Timeline, peak check, largest allocations, what was live at the peak, and the PNG, from a pickle. The
    sites name the user's own lines: frames under `code_root`, else under the snapshot's own most common source
    root (memory_snapshot.code_root; this project's folder for its own runs)."""
    snapshot = memory_snapshot.load_snapshot(path)
    timeline = memory_snapshot.rebuild_timeline(snapshot)
    spans = memory_snapshot.phase_spans([tuple(m) for m in marks or []])
    root = Path(code_root) if code_root else memory_snapshot.code_root(snapshot) or memory_snapshot.PROJECT_ROOT
    out: dict[str, Any] = {
        "snapshot_peak_check": memory_snapshot.peak_check(timeline.peak_bytes, requested_peak, measured_peak),
        "snapshot_largest": memory_snapshot.largest_allocations(snapshot, top, timeline.device, spans, root),
        "snapshot_live_at_peak": memory_snapshot.live_at_peak(snapshot, timeline, top, root),
        "snapshot_code_root": str(root),
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
    record.update(accounting(run, record.get("model_num_params")))
    record.setdefault("saved_status", record["status"])
    if finished(record):
        record.update(runner.sample_stats(record, ("step",)))
    if "snapshot_path" in record:
        try:
            record.update(analyze_snapshot(record["snapshot_path"], record["snapshot_phase_marks"],
                                           record["snapshot_max_allocated_bytes"],
                                           files.path(f"_{slug(run)}_timeline.png"), run.label(), top,
                                           record.get("snapshot_requested_peak_bytes")))
        except Exception as exc:  # noqa: BLE001 - the measurement stands; the analysis failure is a field
            record["snapshot_status"] = common.failure_status(exc)


def profile_sweep(runs: list[RunConfig], args: argparse.Namespace, files: ResultFiles, measure: bool,
                  render: Callable[[list[dict], str], str] | None = None) -> tuple[list[dict], int]:
    """Every configuration through the shared sweep. Without a GPU only fake tensors run: no child processes."""
    experiment = sweep.Experiment(
        name="mem_profile",
        measure=functools.partial(profile_config, measure=measure, max_entries=args.max_entries,
                                  snapshot_prefix=str(files.path("")) if args.snapshot and measure else None),
        finish=lambda run, record: finish_record(run, record, files, args.top),
        summary=lambda record: f"peak {format_bytes(record['peak_mem_allocated_bytes'])}",
        render=render or report.LiveReport("mem_profile", args.columns))
    if not measure:
        args.in_process = True  # fake tensors only: nothing to isolate, and a child would cost more than the work
    return sweep.run_sweep(experiment, runs, files, resolve_device(args.device), args)


# ---- command line ----


def build_parser() -> argparse.ArgumentParser:
    p = cli.ArgParser(description=__doc__.split("\n\n")[0])
    cli.add_size_args(p, "the handout's memory_profiling size, 2026: xl, 2025: 2.7B; with --checkpoint K > 0, "
                            "the gradient_checkpointing size, 2026: xl")
    p.add_argument("--context-length", type=positive_int, nargs="+", default=None,
                   help="sequence length(s) (default: the handout's memory_profiling contexts, 2026: 128 2048, "
                        "2025: 128 256 512; with --checkpoint K > 0, the gradient_checkpointing context, 2026: 2048)")
    cli.add_workload_args(p, MODES, DTYPES, ATTENTION, several_modes=True, several_warmups=False, warmup=3, steps=5)
    user_code.add_model_args(p, "ours = optim.AdamW; torch = torch.optim.AdamW (fused on CUDA, foreach on CPU) in a "
                                "training step; several to compare their peaks", flops=False)
    p.add_argument("--checkpoint", type=non_negative_int, nargs="+", default=[0], metavar="K",
                   help="activation checkpointing every K blocks (non-reentrant torch.utils.checkpoint); 0 = off; "
                        "each K's predicted peak (any device) beside its measured peak and step time (CUDA)")
    p.add_argument("--num-heads", type=positive_int, default=None,
                   help="override the preset's number of heads: the 2026 handout's section 3.2 code builds the xl "
                        "block with 16 heads where its Table 1 says 32 (docs/mem_profile.md#the-handouts-xl-block-"
                        "has-16-heads); --num-heads 16 compares with its per-block figure")
    p.add_argument("--batch-size", type=positive_int, default=None,
                   help=f"batch size (default: {DEFAULT_BATCH_SIZE}, or the gradient_checkpointing batch with "
                        "--checkpoint K > 0: 4 in 2026)")
    p.add_argument("--snapshot", action="store_true",
                   help="CUDA only: record the allocator's history around one more step; save the pickle "
                        "(pytorch.org/memory_viz), a timeline PNG, the largest allocations and the peak check")
    p.add_argument("--max-entries", type=positive_int, default=1_000_000,
                   help="allocator events kept by --snapshot (a ring buffer: older events are dropped)")
    p.add_argument("--top", type=positive_int, default=10, help="rows in the largest-allocations tables")
    p.add_argument("--analyze", metavar="PICKLE", default=None,
                   help="analyse a saved snapshot instead of running (timeline PNG, largest allocations, peak "
                        "check when its _meta.json is beside it); needs no GPU; anyone's snapshot")
    p.add_argument("--code-root", metavar="DIR", default=None,
                   help="--analyze: the folder of the code whose lines the tables name (as the snapshot's frames "
                        "spell it; default: the most common source root of the snapshot's own Python frames)")
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
        if args.code_root is not None:  # frames hold absolute paths: a relative folder is this machine's
            args.code_root = str(Path(args.code_root).absolute())
        return args, []
    if args.code_root is not None:
        parser.error("--code-root goes with --analyze")
    common.device_or_exit(parser, args.device)
    report.columns_or_exit(parser, args.columns, memory_tables.PEAK_COLUMNS)
    handout = cli.handout_or_exit(parser, args)
    user_code.models_or_exit(parser, args, {"--attn": args.attn is not None, "--checkpoint": any(args.checkpoint)})
    args.attn = list(dict.fromkeys(args.attn or ["naive"]))
    args.optimizer = list(dict.fromkeys(args.optimizer))
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
        for size, ctx, mode, dtype, model, attn, k, optimizer in itertools.product(
                sizes, args.context_length, args.mode, args.dtype, args.model, args.attn, args.checkpoint,
                args.optimizer):
            if model != user_code.OURS:  # our attention and checkpointing do not multiply the rows of yours
                attn, k = "naive", 0
            if mode != "train":  # no optimizer step: the optimizer does not multiply these rows
                optimizer = user_code.OURS
            runs.append(RunConfig(size=size, handout=args.handout,
                                  model=get_config(size, args.handout, context_length=ctx,
                                                   num_heads=args.num_heads),
                                  batch_size=args.batch_size, warmup=args.warmup, steps=args.steps, mode=mode,
                                  dtype=dtype, attn=attn, device=args.device, seed=args.seed, checkpoint_every=k,
                                  model_factory=user_code.model_factory(model), optimizer=optimizer))
    except model_config.ConfigError as exc:
        parser.error(str(exc))
    runs = list(dict.fromkeys(runs))  # your model's rows are not multiplied by --attn and --checkpoint
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
                                  meta.get("requested_bytes_peak"), args.code_root)
    # Not a pickle, truncated, or a pickle of something else (entries lacking fields or of the wrong type): bad
    # input, so one line and exit 2.
    except (OSError, EOFError, ValueError, pickle.UnpicklingError, ImportError, KeyError, TypeError, AttributeError,
            IndexError) as exc:
        print(f"error: cannot analyse {args.analyze}: {type(exc).__name__}: {exc}", file=sys.stderr)
        files.release()
        return 2
    files.append_record({"snapshot_path": args.analyze, **fields})
    how = "--code-root" if args.code_root else "the most common source root of its Python frames; --code-root DIR"
    print(f"note: the sites name lines of the code under {fields['snapshot_code_root']} ({how})", file=sys.stderr)
    files.publish(lambda fmt: memory_tables.snapshot_report(args.analyze, fields, fmt), args.fmt,
                  [fields["snapshot_png"]] if "snapshot_png" in fields else [])
    return 0


def main(argv: list[str] | None = None) -> int:
    args, runs = parse_args(argv)
    if args.dry_run:
        return cli.print_dry_run([run.label() for run in runs],
                                 preamble=config_table([dataclasses.asdict(run) for run in runs], args.fmt))
    files = ResultFiles(args.results_dir, "memory", args.out, "memory")
    if args.analyze is not None:
        return analyze_main(args, files)
    live = report.LiveReport("mem_profile", args.columns)  # the .md and --fmt file, rewritten as rows finish
    records, code = profile_sweep(runs, args, files, resolve_device(args.device).type == "cuda", live)
    if records:
        published = report.publish("mem_profile", records, files, args.fmt, args.columns, plot=args.plot, live=live,
                                   extra_paths=[r[k] for r in records for k in ("snapshot_path", "snapshot_png")
                                                if k in r])
        return code or published  # an interrupted sweep says so first
    return code

if __name__ == "__main__":
    sys.exit(main())
