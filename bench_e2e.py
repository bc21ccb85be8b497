"""End-to-end timing of the Transformer LM: forward, backward and optimizer step, each timed on its own.

Answers the study's benchmarking questions: how long does a step take for each model size, what does warm-up
do, what do bf16 mixed precision and torch.compile buy.

    python3 bench_e2e.py --size large --warmup 0                  # one size, no warm-up
    python3 bench_e2e.py --size all                                # the handout's Table 1, one row each
    python3 bench_e2e.py --size xl --handout 2025                  # sizes from the Spring 2025 handout
    python3 bench_e2e.py --size all --dtype fp32 bf16 --dry-run    # list the configurations, run nothing
    python3 bench_e2e.py --size small --warmup 0 1 2 5             # the warm-up study, rows side by side
    python3 bench_e2e.py --size all --dtype fp32 bf16              # fp32 vs bf16 autocast, with a speed-up table
    python3 bench_e2e.py --size all --compile off on               # eager vs torch.compile, with a speed-up table
    python3 bench_e2e.py --size tiny --attn naive sdpa             # naive vs fused (SDPA) attention in the model
    python3 bench_e2e.py --size tiny --context-length 128 256 512  # a context sweep; OOM stops larger contexts
    python3 bench_e2e.py --size xl --context-length max            # the longest context that trains
    python3 bench_e2e.py --size 10B --parallel fsdp --world-size 8 --dry-run   # plan: the state per rank on 8 GPUs
    python3 bench_e2e.py --size tiny --profile --steps 3           # torch.profiler kernel tables (no nsys needed)
    torchrun --nproc-per-node 8 bench_e2e.py --size xl --parallel ddp fsdp   # 8 GPUs: DDP vs FSDP2, batch per rank
    python3 bench_e2e.py --size small --model cs336_basics.model:BasicsTransformerLM --flops formula   # the staff model
    python3 bench_e2e.py --size small --model ours my_lm:make_model --flops counted   # ours vs your A1 model
    python3 bench_e2e.py --size small --optimizer ours my_optim:AdamW             # your optimizer beside ours

Method. A configuration is built (prepare: runner.Workload makes the model, wraps it in torch.compile when asked,
the optimizer, and one random batch of token ids, all on the device), then measured (runner.measure_steps): with
--compile the first step is timed apart as compile_s; --warmup untimed steps; the CUDA peak counter reset; --steps
timed steps. The timed step is runner.run_step: the forward pass with the loss, loss.backward(), optimizer.step()
with zero_grad(set_to_none=True), each phase between two device synchronisations (common.SyncTimer: synchronise,
read timeit.default_timer, run, synchronise, read), and the whole step the same way. Nothing else is inside the
timers: no data creation (the batch is made once), no .item(), no printing, no compile (its step is timed apart),
no warm-up, no FLOP counting (--flops counted counts one more step, untimed). Each raw sample is kept; mean and std
(and median, min, max) are derived from them.

Variants of one configuration (--dtype, --compile, --attn, --model, --optimizer values) are compared: by default they
are built in one process and their timed steps alternate in rounds (A B | B A | ..., runner.measure_interleaved),
each variant with its own compile step, warm-up and memory figures, so that a machine that slows down meanwhile
slows every variant alike; the speed-up is a paired ratio with a 95% interval (stats.py), and a phase the variants
run identically (the optimizer step under --compile) is the control that says when the machine drifted anyway.

Size names and the default context length (512; 128 under --handout 2025) come from the study's handout: the current
one (2026, v26.1.1) unless --handout or CS336_HANDOUT says 2025. Each configuration (or comparison) of a sweep runs
in its own child process (an OOM cannot poison the next one). The report (model configurations, then the results) is
saved after every configuration and printed at the end, with one JSON record per configuration, under results/e2e/.
A sweep over dtype, compile, attention, optimizer or parallelism adds a comparison table (speed-ups over the first
variant); --context-length max adds the longest context of each search. The tables are e2e_tables.py's, the same
code that report.py re-renders a saved run with. docs/bench_e2e.md says more. (About 480 lines: three experiments
share this command line, the step timing with its comparisons, the longest-context search and torchrun parallelism;
the machinery is in runner.py, sweep.py and parallel.py, the tables in e2e_tables.py.)
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import functools
import itertools
import json
import os
import sys
import tempfile
import textwrap
from pathlib import Path
from typing import Any

import torch

import cli
import common
import isolation
import model_config
import parallel
import profile_readers
import profile_tables
import report
import runner
import search
import sweep
import user_code
from cli import positive_float, positive_int
from common import DTYPES, matmul_precision_key, peak_tflops, set_ranges
from e2e_tables import COLUMNS, config_key, config_table, context_searches, probe_contexts, variants
from model import ATTENTION
from model_config import DEFAULT_BATCH_SIZE, MODES, PHASES_BY_MODE, ModelConfig, get_config
from results import GIB, ResultFiles, finished
from runner import RunConfig, Workload, run_step
from search import SEARCH_START

NOISY_CV = 0.10  # a phase whose std/mean is above this is flagged: don't quote it without a second look


# ---- one configuration: what is timed ----


def prepare(run: RunConfig) -> runner.Prepared:
    """The configuration built on its device (runner.Workload) and its step to time, run_step(work): forward with
    the loss, backward, optimizer step, each between synchronisations. After the timed steps (untimed): with
    --profile the profiler's tables, with --flops counted one more step under FlopCounterMode."""
    set_ranges(nvtx=run.nvtx, profiler=run.profile_results_dir is not None)
    work = Workload(run)
    profiler = profiler_for(run, work.device)

    def after(record: dict[str, Any]) -> dict[str, Any]:
        out = trace_tables(run, profiler, record) if run.profile_results_dir is not None else {}
        if run.flops == "counted":
            isolation.phase("counting FLOPs (one untimed step)")
            out["counted_step_flops"] = counted_step_flops(work)
        return out

    return runner.Prepared(step=lambda: run_step(work), device=work.device, warmup=run.warmup, steps=run.steps,
                           compile_first=run.compile, profiler=profiler, after=after)


def run_config(run: RunConfig) -> dict[str, Any]:
    """One configuration alone (in a child process of the sweep): its record. Failures propagate as exceptions
    (the sweep makes them rows)."""
    return runner.measure(prepare(run))


def measure_together(runs: list[RunConfig], faults: list) -> list[dict[str, Any]]:
    """The variants of one comparison in one process (a child of the sweep), their timed steps interleaved."""
    device = common.resolve_device(runs[0].device)
    return runner.measure_interleaved(device, [functools.partial(prepare, run) for run in runs], faults)


def counted_step_flops(work: Workload) -> int:
    """FLOPs of one step of work.run.mode as torch.utils.flop_counter.FlopCounterMode counts them (matmuls,
    attention kernels, convolutions; 2 per multiply-add, like model_config's formula; elementwise work and the
    optimizer step not counted), on one more step after the timed ones, untimed, through the model itself (not
    torch.compile's wrapper, which the counter cannot see into). Works for any model: what --flops counted is for."""
    from torch.utils.flop_counter import FlopCounterMode

    with FlopCounterMode(display=False) as counter:
        loss = work.forward(eager=True)
        if work.run.mode != "forward":
            loss.backward()
    work.zero_grad()
    return counter.get_total_flops()


# ---- --profile: torch.profiler over the measured steps ----


def profiler_for(run: RunConfig, device: torch.device) -> contextlib.AbstractContextManager:
    """torch.profiler around the measured steps (CPU activity always, CUDA when on a GPU) when --profile is on;
    a context yielding None otherwise."""
    if run.profile_results_dir is None:
        return contextlib.nullcontext()
    activities = [torch.profiler.ProfilerActivity.CPU]
    if device.type == "cuda":
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    return common.quiet_profiler(activities)


def trace_tables(run: RunConfig, profiler: torch.profiler.profile, record: dict[str, Any]) -> dict[str, Any]:
    """Write the Chrome/Perfetto trace under results/profile/ and build profile_tables' four tables from it, in
    the process that profiled: the parent (and the JSONL record) gets {"profile": trace path and rows}, not the
    profiler object. With --parallel, every rank also measures its time in collectives per phase
    ({"collectives": rows}); only rank 0 keeps its trace and builds the kernel tables."""
    isolation.phase("writing the profiler trace")
    keep = parallel.is_rank_zero()
    if keep:
        stem = f"{run.size}_ctx{run.context_length}_{run.mode}_{run.dtype}"
        stem += f"_{run.parallel}x{run.world_size}" if run.parallel else ""
        trace = ResultFiles(run.profile_results_dir, "profile", None, stem, reserve=".json").path(".json")
    else:
        handle, name = tempfile.mkstemp(suffix=".json")
        os.close(handle)
        trace = Path(name)
    profiler.export_chrome_trace(str(trace))
    out: dict[str, Any] = {}
    try:
        if run.parallel:
            with open(trace) as f:
                out["collectives"] = parallel.collective_rows(json.load(f)["traceEvents"], PHASES_BY_MODE[run.mode])
        if keep:
            tables = profile_tables.build_tables(profile_readers.load_torch_trace(trace),
                                                 profile_tables.stopwatch_ms(record),
                                                 profile_tables.attention_shape(dataclasses.asdict(run)),
                                                 compiled=run.compile)
            out["profile"] = {"trace": str(trace), "tables": tables}
    finally:
        if not keep:
            trace.unlink()
    return out


# ---- derived figures ----


def derive_figures(run: RunConfig, record: dict[str, Any], peak_override: float | None = None) -> dict[str, Any]:
    """Statistics per phase, noisy flags, tokens/s, FLOPs, achieved TFLOP/s and MFU for one finished record."""
    phases = PHASES_BY_MODE[run.mode] + ("step",)
    out: dict[str, Any] = runner.sample_stats(record, phases)
    out["noisy"] = [f"{phase} {out[f'{phase}_ms_cv']:.0%}" for phase in phases
                    if out[f"{phase}_ms_cv"] is not None and out[f"{phase}_ms_cv"] > NOISY_CV]
    if out["step_ms_n"] < 2:
        out["note"] = runner.ONE_SAMPLE_NOTE
    step_s = out["step_ms_mean"] / 1e3  # under --parallel: the slowest rank's step, what the global step costs
    # the global batch: --batch-size is per rank, and every rank does the same work on its own sequences
    tokens = run.batch_size * run.context_length * run.world_size
    out["tokens_per_s"] = tokens / step_s
    flops = step_flops(run, record)
    out["step_flops"], out["flops_source"] = flops, run.flops
    if flops is None:  # --flops none: no FLOPs, so no TFLOP/s and no MFU rather than a formula for another model
        out.update(achieved_tflops=None, peak_tflops=None, peak_source=None, mfu_precision=None, mfu=None)
        return out
    out["achieved_tflops"] = flops / step_s / 1e12
    env = record["environment"]
    precision = matmul_precision_key(run.dtype, bool(env.get("tf32_matmul")))
    if peak_override is not None:
        peak, label = peak_override, "--peak-tflops"
    elif env["device"].startswith("cuda"):
        peak, label = peak_tflops(env["device_name"], precision)
    else:
        peak, label = None, None  # a CPU has no entry in the peak table: no MFU rather than a guess
    out["peak_tflops"], out["peak_source"], out["mfu_precision"] = peak, label, precision
    out["mfu"] = out["achieved_tflops"] / (peak * run.world_size) if peak else None  # N GPUs: N x the peak
    return out


def step_flops(run: RunConfig, record: dict[str, Any]) -> int | None:
    """FLOPs of one global step (every rank's): model_config's formula for our architecture (--flops formula: ours,
    or yours when you confirm it is the same architecture), FlopCounterMode's count (counted), or None (none)."""
    if run.flops == "formula":
        return model_config.step_flops(run.model, run.batch_size, run.context_length, run.mode) * run.world_size
    if run.flops == "counted":
        return record["counted_step_flops"] * run.world_size
    return None


MAX_CONTEXT_DEFAULT = {"cuda": 131072, "cpu": 4096}  # the last doubling probe, unless --max-context; build_parser

# ---- command line ----


def build_parser() -> argparse.ArgumentParser:
    p = cli.ArgParser(description=__doc__.split("\n\n")[0])
    cli.add_size_args(p, "tiny, or 'custom' when --d-model, --d-ff, --num-layers and --num-heads are all given")
    for flag, what in (("--d-model", "d_model"), ("--d-ff", "d_ff"), ("--num-layers", "the number of layers"),
                       ("--num-heads", "the number of heads")):
        p.add_argument(flag, type=positive_int, help=f"override {what}")
    p.add_argument("--vocab-size", type=positive_int, default=10_000, help="vocabulary size")
    p.add_argument("--context-length", type=context_length_value, nargs="+", default=None,
                   help="sequence length(s) (default: the handout's, 512 for 2026 and 128 for 2025), or 'max': the "
                        f"longest that runs, trying {SEARCH_START}, {2 * SEARCH_START}, ... (each in its own child "
                        "process) until the first failure or --max-context, then bisecting after an OOM; one search "
                        "per variant. See docs/bench_e2e.md#the-longest-context-that-fits")
    p.add_argument("--max-context", type=positive_int, default=None, metavar="N",
                   help="--context-length max: the last power of two tried (default: "
                        f"{MAX_CONTEXT_DEFAULT['cuda']} on CUDA, {MAX_CONTEXT_DEFAULT['cpu']} on a CPU, whose memory "
                        "is rarely the limit and where each doubling costs 2-4x the time)")
    p.add_argument("--search-resolution", type=positive_int, default=search.RESOLUTION, metavar="N",
                   help="--context-length max: after the first OOM, bisect to a multiple of N")
    p.add_argument("--search-probes", type=cli.non_negative_int, default=search.PROBE_BUDGET, metavar="N",
                   help="--context-length max: at most N bisection probes per search (0: no bisection)")
    p.add_argument("--batch-size", type=positive_int, default=DEFAULT_BATCH_SIZE, help="batch size")
    cli.add_workload_args(p, MODES, DTYPES, ATTENTION, several_modes=False, several_warmups=True, warmup=5,
                          steps=10)
    p.add_argument("--no-grad", action="store_true", help="forward mode only: run under torch.inference_mode()")
    p.add_argument("--compile", nargs="*", choices=["off", "on"], default=["off"],
                   help="torch.compile the whole model (--compile alone = on; 'off on' compares them); the compile "
                        "step is timed apart")
    user_code.add_model_args(p, "ours = optim.AdamW; torch = torch.optim.AdamW (fused on CUDA, foreach on CPU); give "
                                "several to compare them in one table (train mode)", flops=True)
    p.add_argument("--tf32", choices=["on", "off"], default=None,
                   help="CUDA only: allow TF32 tensor cores for fp32 matmuls (default: PyTorch's default, off)")
    p.add_argument("--nvtx", action="store_true",
                   help="CUDA only: emit NVTX ranges (warmup, measure, forward, backward, optimizer, attention)")
    p.add_argument("--profile", action="store_true",
                   help="profile the timed steps with torch.profiler (CPU, and CUDA when present): a Perfetto trace "
                        "under results/profile/ and kernel tables; the way to profile without nsys")
    p.add_argument("--peak-tflops", type=positive_float, default=None,
                   help="peak TFLOP/s of one GPU for MFU, overriding the built-in table (e.g. for an unlisted GPU)")
    cli.add_device_args(p)
    parallel.add_parallel_args(p)
    sweep.add_sweep_args(p, compares=True)
    cli.add_output_args(p, default_stem="e2e")
    report.add_columns_and_plot_args(p, "bench_e2e")
    cli.add_dry_run_arg(p)
    return p


def context_length_value(text: str) -> int | str:
    """--context-length: a positive integer, or 'max' (the search)."""
    if text == "max":
        return text
    try:
        return positive_int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a positive integer or max, got {text!r}") from None


def parse_args(argv: list[str] | None = None) -> tuple[argparse.Namespace, list[RunConfig]]:
    parser = build_parser()
    args = parser.parse_args(argv)
    handout = cli.handout_or_exit(parser, args)
    report.columns_or_exit(parser, args.columns, COLUMNS)
    sweep.check_sweep_args(parser, args)
    dims = {"d_model": args.d_model, "d_ff": args.d_ff, "num_layers": args.num_layers, "num_heads": args.num_heads}
    if args.size is None:
        args.size = ["custom"] if all(v is not None for v in dims.values()) else ["tiny"]
    else:
        args.size = cli.sizes_or_exit(parser, args, args.size)
    # sweep values in the order given (the first is the comparison's baseline); --compile alone means on
    args.optimizer = list(dict.fromkeys(args.optimizer))
    args.compile = [v == "on" for v in dict.fromkeys(args.compile or ["on"])]
    cli.refuse(parser, [
        (args.no_grad and args.mode != "forward",
         "--no-grad only applies to --mode forward (backward needs the autograd graph)"),
        (len(args.optimizer) > 1 and args.mode != "train",
         "comparing optimizers needs --mode train (other modes take no optimizer step)")])
    user_code.models_or_exit(parser, args, {"--attn": args.attn is not None})
    args.attn = list(dict.fromkeys(args.attn or ["naive"]))
    device = common.device_or_exit(parser, args.device)
    world_size = parallel.check_parallel_args(parser, args, device)
    args.context_length = context_lengths(parser, args, handout, device)
    if device.type != "cuda":  # NVTX on a CPU only through a library named by BENCH_NVTX_LIBRARY (nsys_run.sh's)
        cli.refuse(parser, [
            (args.nvtx and not os.environ.get(common.NVTX_LIBRARY_ENV),
             f"--nvtx needs a CUDA device, and this run is on {device}: on a CPU, set {common.NVTX_LIBRARY_ENV} to an "
             "NVTX library (bash nsys_run.sh builds one with gcc and sets it; by hand: docs/nsys_run.md, 'The NVTX "
             "library')"),
            (args.tf32 is not None, f"--tf32 needs a CUDA device, and this run is on {device}")])
    if args.nvtx:
        try:
            common.nvtx_functions()
        except ValueError as exc:
            parser.error(str(exc))
    return args, plan_runs(parser, args, dims, world_size)


def plan_runs(parser: argparse.ArgumentParser, args: argparse.Namespace, dims: dict[str, int | None],
              world_size: int) -> list[RunConfig]:
    """Every configuration of the sweep, in order: size x parallel x context x dtype x compile x model x attn x
    optimizer x warmup (x FSDP2's settings); a search's probes in a row, shortest first (the context innermost)."""
    axes = {"size": args.size, "parallel": args.parallel or [None], "ctx": args.context_length, "dtype": args.dtype,
            "compile": args.compile, "model": args.model, "attn": args.attn, "optimizer": args.optimizer,
            "warmup": args.warmup, "fsdp_mp": args.fsdp_mixed_precision, "reshard": args.reshard_after_forward}
    order = [axis for axis in axes if axis != "ctx"] + ["ctx"] if args.context_search else list(axes)
    runs = []
    try:
        for values in itertools.product(*(axes[axis] for axis in order)):
            c = dict(zip(order, values))
            kind = c["parallel"]
            if kind != "fsdp":  # FSDP-only settings do not multiply the other rows
                c["fsdp_mp"], c["reshard"] = "off", "on"
            if c["model"] != user_code.OURS:  # nor does our model's attention multiply the rows of yours
                c["attn"] = "naive"
            if c["size"] == "custom":
                model = ModelConfig(**dims, vocab_size=args.vocab_size, context_length=c["ctx"])
            else:
                model = get_config(c["size"], args.handout, **dims, vocab_size=args.vocab_size, context_length=c["ctx"])
            runs.append(RunConfig(size=c["size"], handout=args.handout, model=model, batch_size=args.batch_size,
                                  warmup=c["warmup"], steps=args.steps, mode=args.mode, no_grad=args.no_grad,
                                  dtype=c["dtype"], compile=c["compile"], attn=c["attn"], optimizer=c["optimizer"],
                                  model_factory=user_code.model_factory(c["model"]),
                                  flops=user_code.flops_source(c["model"], args.flops),
                                  tf32=None if args.tf32 is None else args.tf32 == "on", device=args.device,
                                  seed=args.seed, nvtx=args.nvtx,
                                  profile_results_dir=args.results_dir if args.profile else None,
                                  parallel=kind, world_size=world_size if kind else 1,
                                  fsdp_mixed_precision=c["fsdp_mp"], reshard_after_forward=c["reshard"] == "on",
                                  pg_timeout_s=args.pg_timeout))
    except model_config.ConfigError as exc:
        parser.error(str(exc))
    runs = list(dict.fromkeys(runs))  # ddp rows are not multiplied by the FSDP-only axes, yours by --attn
    for run in runs:
        cli.check_tensor_sizes(parser, model_config.model_tensor_shapes(run.model, run.batch_size))
    return runs


def context_lengths(parser: argparse.ArgumentParser, args: argparse.Namespace, handout: model_config.Handout,
                    device: torch.device) -> list[int]:
    """The contexts to run: those given, the handout's default, or for 'max' the doubling probes of the search
    (sets args.context_search, args.max_context and args.max_context_default). A search needs a child per probe
    and at least the steps that reach the training peak."""
    given = list(dict.fromkeys(args.context_length or [handout.default_context_length]))
    args.context_search = "max" in given
    search_flags = [flag for flag, default in (("--max-context", None), ("--search-resolution", search.RESOLUTION),
                                               ("--search-probes", search.PROBE_BUDGET))
                    if getattr(args, flag[2:].replace("-", "_")) != default]
    if not args.context_search:
        cli.refuse(parser, [(bool(search_flags), f"{search_flags[0] if search_flags else ''} only applies to "
                                                 "--context-length max")])
        return given
    args.max_context_default = None  # which default --max-context took, for --dry-run; None when given
    if args.max_context is None:
        args.max_context = MAX_CONTEXT_DEFAULT["cuda" if device.type == "cuda" else "cpu"]
        args.max_context_default = ("the default on CUDA" if device.type == "cuda" else
                                    f"the default on a CPU; on CUDA {MAX_CONTEXT_DEFAULT['cuda']}")
    cli.refuse(parser, [
        (len(given) > 1, "--context-length max searches for the longest context on its own: give max or numbers, "
                         f"not both (got {' '.join(map(str, given))})"),
        (args.max_context < SEARCH_START,
         f"--max-context must be at least {SEARCH_START}, where the search starts; got {args.max_context}"),
        (args.in_process, "--context-length max runs every probe in its own child process (an OOM must not leave "
                          "memory behind for the next probe): drop --in-process"),
        (args.no_skip, "--no-skip does not apply to --context-length max: a search ends at its first failure"),
        (len(set(args.warmup)) > 1,  # a search is a skip group, which warm-up counts share
         "--context-length max takes one --warmup value: the warm-up does not change what fits"),
        (args.mode == "train" and min(args.warmup) + args.steps < 2,
         "--context-length max --mode train needs --warmup + --steps >= 2 per probe: AdamW makes its moments in the "
         "first step, so only the second reaches the training peak")])
    return probe_contexts(args.max_context)


# ---- the sweep ----


def finish_record(run: RunConfig, record: dict[str, Any], args: argparse.Namespace) -> None:
    """The derived figures of a finished configuration; its status says whether a phase was noisy. Under
    --parallel, every row (failed ones too) gets the predicted state bytes per rank; in a --context-length max
    search, the search's settings (its upper bound, the bisection's resolution and budget)."""
    if run.parallel:
        record["predicted"] = parallel.state_bytes_per_rank(run.model, run.parallel, run.world_size, run.mode)
    if finished(record):  # measured (the status says "ok" until the noisy check)
        record.update(derive_figures(run, record, args.peak_tflops))
        record["status"] = "noisy" if record["noisy"] else "ok"
    if args.context_search:  # a probe of --context-length max: context_searches finds it by this
        record["context_search"] = {"max_context": args.max_context, "resolution": args.search_resolution,
                                    "probe_budget": args.search_probes}


def dry_run_label(run: RunConfig) -> str:
    """A planned configuration, with the training state each rank will hold (parallel.state_bytes_per_rank), so
    whether it fits is known before the run."""
    state = parallel.state_bytes_per_rank(run.model, run.parallel, run.world_size, run.mode)["state_bytes"]
    return f"{run.label()} (predicted state {state / GIB:.2f} GiB per rank, activations aside)"


def plan_notes(runs: list[RunConfig], args: argparse.Namespace) -> list[str]:
    """What --dry-run adds below the plan: the comparison table's variants (and how they are timed) and the
    context searches."""
    notes = []
    configs = [dataclasses.asdict(run) for run in runs]
    names = variants(configs)
    if names:
        how = ("each comparison's variants in one process, their timed steps interleaved" if args.interleave == "steps"
               else f"each variant in its own process, {args.repeats} run(s) each, alternating")
        notes.append(f"then a comparison table: {' vs '.join(names)}, one row per size and context, speed-ups over "
                     f"{names[0]} ({how}).")
    if args.context_search:
        searches = len({config_key(c, context=False) for c in configs})
        contexts = probe_contexts(args.max_context)
        source = f"; {args.max_context_default}" if args.max_context_default else ""
        bisect = (f" After an OOM that follows a fit, up to {args.search_probes} more probes bisect between them to a "
                  f"multiple of {args.search_resolution}." if args.search_probes else "")
        notes.append(f"context search: {searches} search{'es' if searches > 1 else ''} (one per configuration but the "
                     f"context), each trying ctx {', '.join(map(str, contexts))} in turn, every probe in its own child "
                     "process. A search ends at its first OOM (the answer: the context before it), error or timeout "
                     f"(inconclusive), or after {contexts[-1]} (--max-context {args.max_context}{source}).{bisect}")
    return [textwrap.fill(note, width=116) for note in notes]


def main(argv: list[str] | None = None) -> int:
    args, runs = parse_args(argv)
    rank_zero = parallel.is_rank_zero()  # under torchrun only rank 0 prints and writes files
    if args.dry_run:
        if not rank_zero:
            return 0
        return cli.print_dry_run([dry_run_label(run) for run in runs],
                                 preamble=config_table([dataclasses.asdict(run) for run in runs], args.fmt),
                                 notes=plan_notes(runs, args), at_most=args.context_search)
    files = ResultFiles(args.results_dir, "e2e", args.out, "e2e") if rank_zero else None
    live = report.LiveReport("bench_e2e", args.columns)  # the .md and --fmt file, rewritten as rows finish
    experiment = sweep.Experiment(
        name="bench_e2e", measure=run_config, measure_together=measure_together, resize=RunConfig.with_context,
        finish=lambda run, record: finish_record(run, record, args),
        summary=lambda record: f"{record['step_ms_mean'] / 1e3:.3f} s/step", render=live)
    records, code = sweep.run_sweep(experiment, runs, files, common.resolve_device(args.device), args,
                                    search=args.context_search)
    if records and rank_zero:
        # each search's answer as a record of its own, after its probes; then the report, then the figures
        published = report.publish("bench_e2e", records, files, args.fmt, args.columns, plot=args.plot, live=live,
                                   append=context_searches(records))
        return code or published  # an interrupted sweep says so first
    return code


if __name__ == "__main__":
    sys.exit(main())
