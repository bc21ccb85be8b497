"""How long does a training step of the Transformer LM take, per phase? The study's benchmarking questions: each
model size, the effect of warm-up, what bf16 mixed precision, torch.compile, fused attention, another model or
optimizer buy, and the longest context that trains.

    python3 bench_e2e.py --size all                                # the handout's Table 1, one row each
    python3 bench_e2e.py --size small --warmup 0 1 2 5             # the warm-up study, rows side by side
    python3 bench_e2e.py --size all --dtype fp32 bf16              # fp32 vs bf16 autocast, with a speed-up table
    python3 bench_e2e.py --size all --compile off on               # eager vs torch.compile
    python3 bench_e2e.py --size tiny --attn naive sdpa             # naive vs fused (SDPA) attention in the model
    python3 bench_e2e.py --size tiny --context-length 128 256 512  # a context sweep; OOM stops larger contexts
    python3 bench_e2e.py --size xl --context-length max            # the longest context that trains
    python3 bench_e2e.py --size tiny --profile --steps 3           # torch.profiler kernel tables (no nsys needed)
    python3 bench_e2e.py --size small --model ours staff=cs336_basics.model:BasicsTransformerLM --flops formula
    python3 bench_e2e.py --size small --optimizer ours my_optim:AdamW             # your optimizer beside ours
    python3 bench_e2e.py --size 10B --parallel fsdp --world-size 8 --dry-run   # plan: the state per rank on 8 GPUs
    torchrun --nproc-per-node 8 bench_e2e.py --size xl --parallel ddp fsdp   # 8 GPUs: DDP vs FSDP2, batch per rank

Method (runner.run_step and runner.measure_steps, shared with leaderboard.py; the `measure` section): the compile
step (compile_s) and --warmup steps run untimed; the peak-memory counter is reset; then --steps timed steps, each
phase (forward with the loss, backward, optimizer step) and the whole step between two device synchronisations.
Variants are built in one process and timed A B | B A | ... (measure_interleaved); each configuration runs in a
child process (runner.py), so an OOM is a row. The 2026 leaderboard is leaderboard.py. Manual: docs/bench_e2e.md.
"""
from __future__ import annotations

import argparse
import dataclasses
import functools
import itertools
import json
import re
import sys
import tempfile
import textwrap
import uuid
from pathlib import Path
from typing import Any, Callable

import torch

import common
import kernel_tables
import parallel
import report
import results
import runner
from common import DTYPES, annotate, peak_memory_bytes, reset_peak_memory, resolve_device
from model import ATTENTION
from report import E2E_COLUMNS, SEARCH_START, config_key, context_searches, probe_contexts, sizes_table, variants
from results import (DEFAULT_BATCH_SIZE, GIB, MODES, PHASES_BY_MODE, ModelConfig, ResultFiles, block_sizes, finished,
                     get_config, positive_float, positive_int, steps_per_block)
from runner import (PROBE_BUDGET, RESOLUTION, RunConfig, Workload, derive_figures, measure_steps, phase, timed_phase,
                    warm_up, with_samples)
MAX_CONTEXT_DEFAULT = {"cuda": 131072, "cpu": 4096}  # --context-length max: the last doubling probe


# ---------------------------------------------------------------- arguments


def context_length_value(text: str) -> int | str:
    """--context-length: a positive integer, or 'max' (the search)."""
    if text == "max":
        return text
    try:
        return positive_int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a positive integer or max, got {text!r}") from None


def parse_args(argv: list[str] | None = None) -> tuple[argparse.Namespace, list[RunConfig]]:
    p = results.ArgParser(description=__doc__.split("\n\n")[0])
    results.add_size_args(p, "tiny, or 'custom' when --d-model, --d-ff, --num-layers and --num-heads are all given")
    results.add_shape_args(p, "override the {}", vocab_size="vocabulary size (default: 10000)")
    p.add_argument("--context-length", type=context_length_value, nargs="+", default=None,
                   help="sequence length(s) (default: the handout's, 512 for 2026 and 128 for 2025), or 'max': the "
                        f"longest that runs, trying {SEARCH_START}, {2 * SEARCH_START}, ... until the first failure "
                        "or --max-context, then bisecting after an OOM; one search per variant")
    p.add_argument("--max-context", type=positive_int, default=None, metavar="N",
                   help=f"--context-length max: the last power of two tried (default: {MAX_CONTEXT_DEFAULT['cuda']} "
                        f"on CUDA, {MAX_CONTEXT_DEFAULT['cpu']} on a CPU)")
    p.add_argument("--search-resolution", type=positive_int, default=RESOLUTION, metavar="N",
                   help="--context-length max: after the first OOM, bisect to a multiple of N")
    p.add_argument("--search-probes", type=results.non_negative_int, default=PROBE_BUDGET, metavar="N",
                   help="--context-length max: at most N bisection probes per search (0: no bisection)")
    p.add_argument("--batch-size", type=positive_int, default=None,
                   help=f"batch size (default: {DEFAULT_BATCH_SIZE})")
    results.add_workload_args(p, MODES, DTYPES, ATTENTION, several_modes=False, several_warmups=True, warmup=5,
                          steps=10)
    p.add_argument("--no-grad", action="store_true", help="forward mode only: run under torch.inference_mode()")
    p.add_argument("--compile", nargs="*", choices=["off", "on"], default=["off"],
                   help="torch.compile the whole model (--compile alone = on; 'off on' compares them); the compile "
                        "step is timed apart")
    common.add_model_args(p, "ours = optim.AdamW; torch = torch.optim.AdamW (fused on CUDA, foreach on CPU); give "
                                "several to compare them in one table (train mode)", flops=True)
    model_flag = next(a for a in p._actions if a.dest == "model")
    model_flag.type = common.named_model
    model_flag.help += "; NAME=MODEL names it in tables and records (default: ours)"
    model_flag.default = [(None, common.OURS)]
    p.add_argument("--tf32", choices=["on", "off"], default=None,
                   help="CUDA only: allow TF32 tensor cores for fp32 matmuls (default: PyTorch's default, off)")
    p.add_argument("--nvtx", action="store_true",
                   help="emit NVTX ranges for nsys (warmup, measure, forward, backward, optimizer, attention); needs "
                        "a CUDA build of torch")
    p.add_argument("--profile", action="store_true",
                   help="profile the timed steps with torch.profiler (CPU, and CUDA when present): a Perfetto trace "
                        "under results/profile/ and kernel tables; the way to profile without nsys")
    p.add_argument("--peak-tflops", type=positive_float, default=None,
                   help="peak TFLOP/s of one GPU for MFU, overriding the built-in table (e.g. for an unlisted GPU)")
    p.add_argument("--leaderboard", nargs="?", const="", help="moved: python3 leaderboard.py (docs/leaderboard.md)")
    results.add_device_args(p)
    runner.add_recalibrate_arg(p)
    parallel.add_parallel_args(p)
    runner.add_sweep_args(p, compares=True)
    results.add_output_args(p, default_stem="e2e-<UTC time>")
    report.add_columns_and_plot_args(p, "bench_e2e")
    results.add_dry_run_arg(p)
    args, unknown = p.parse_known_args(argv)
    if args.leaderboard is not None:  # its flags are leaderboard.py's: only this line answers them here
        p.error("the 2026 leaderboard is its own script now: python3 leaderboard.py [full] --model ... (its flags)")
    if unknown:
        p.error(f"unrecognized arguments: {' '.join(unknown)}")
    args.batch_size = args.batch_size or DEFAULT_BATCH_SIZE
    args.vocab_size = args.vocab_size or 10_000
    handout = results.handout_or_exit(p, args)
    report.columns_or_exit(p, args.columns, E2E_COLUMNS)
    runner.check_sweep_args(p, args)
    dims = {k: getattr(args, k) for k in ("d_model", "d_ff", "num_layers", "num_heads")}
    default = "custom" if None not in dims.values() else "tiny"
    args.size = results.sizes_or_exit(p, args, args.size) if args.size else [default]
    # sweep values in the order given (the first is the comparison's baseline); --compile alone means on
    args.optimizer = common.once_each("--optimizer", args.optimizer)
    args.compile = [v == "on" for v in dict.fromkeys(args.compile or ["on"])]
    given = common.once_each("--model", args.model, lambda m: "=".join(filter(None, m)))  # (NAME or None, model)
    args.model_names = {m: n for n, m in given if n is not None}
    args.model = [m for _, m in given]
    # what names a row (report.model_label, report.optimizer_label): two alike and their rows could not be told apart
    models = [report.model_label({"model_name": args.model_names.get(m), "model_factory": common.model_factory(m)})
              for m in args.model]
    optimizers = [report.optimizer_label({"optimizer": o}) for o in args.optimizer]
    results.refuse(p, [
        (args.no_grad and args.mode != "forward",
         "--no-grad only applies to --mode forward (backward needs the autograd graph)"),
        (len(args.optimizer) > 1 and args.mode != "train",
         "comparing optimizers needs --mode train (other modes take no optimizer step)"),
        (len(set(args.model)) < len(given) or len(set(models)) < len(models),
         "--model: give each model once, and each a name of its own"),
        (len(set(optimizers)) < len(optimizers), "--optimizer: give each optimizer a name of its own")])
    common.models_or_exit(p, args, {"--attn": args.attn is not None})
    args.attn = list(dict.fromkeys(args.attn or ["naive"]))
    device = common.device_or_exit(p, args.device)
    world_size = parallel.check_parallel_args(p, args, device)
    args.context_length = context_lengths(p, args, handout, device)
    if args.tf32 is not None and device.type != "cuda":
        p.error(f"--tf32 needs a CUDA device, and this run is on {device}")
    if args.nvtx:  # torch's NVTX: a CUDA build has it, with or without a GPU (nsys records the ranges either way)
        try:
            common.nvtx_functions()
        except ValueError as exc:
            p.error(f"--nvtx: {exc}")
    # every configuration: size x parallel x context x dtype x compile x model x attn x optimizer x warmup (x FSDP2's
    # settings); a search's probes in a row, shortest first (the context innermost)
    axes = {"size": args.size, "parallel": args.parallel or [None], "ctx": args.context_length, "dtype": args.dtype,
            "compile": args.compile, "model": args.model, "attn": args.attn, "optimizer": args.optimizer,
            "warmup": args.warmup, "fsdp_mixed_precision": args.fsdp_mixed_precision,
            "reshard_after_forward": [v == "on" for v in args.reshard_after_forward]}
    order = [axis for axis in axes if axis != "ctx"] + ["ctx"] if args.context_search else list(axes)
    fixed = dict(handout=args.handout, batch_size=args.batch_size, steps=args.steps, mode=args.mode,
                 no_grad=args.no_grad, tf32=None if args.tf32 is None else args.tf32 == "on", device=args.device,
                 seed=args.seed, nvtx=args.nvtx, profile_results_dir=args.results_dir if args.profile else None,
                 pg_timeout_s=args.pg_timeout)
    runs = []
    try:
        for values in itertools.product(*(axes[axis] for axis in order)):
            c = dict(zip(order, values))
            if c["parallel"] != "fsdp":  # FSDP-only settings do not multiply the other rows
                c["fsdp_mixed_precision"], c["reshard_after_forward"] = "off", True
            if c["model"] != common.OURS:  # nor does our model's attention multiply the rows of yours
                c["attn"] = "naive"
            ctx, spec = c.pop("ctx"), c.pop("model")
            model = (ModelConfig(**dims, vocab_size=args.vocab_size, context_length=ctx) if c["size"] == "custom"
                     else get_config(c["size"], args.handout, **dims, vocab_size=args.vocab_size, context_length=ctx))
            runs.append(RunConfig(**fixed, **c, model=model, model_factory=common.model_factory(spec),
                                  model_name=args.model_names.get(spec), flops=common.flops_source(spec, args.flops),
                                  world_size=world_size if c["parallel"] else 1))
    except results.ConfigError as exc:
        p.error(str(exc))
    runs = list(dict.fromkeys(runs))  # ddp rows are not multiplied by the FSDP-only axes, yours by --attn
    for run in runs:
        results.check_tensor_sizes(p, results.model_tensor_shapes(run.model, run.batch_size))
    return args, runs


def context_lengths(parser: argparse.ArgumentParser, args: argparse.Namespace, handout: results.Handout,
                    device: torch.device) -> list[int]:
    """The contexts to run: those given, the handout's default, or for 'max' the search's doubling probes."""
    given = list(dict.fromkeys(args.context_length or [handout.default_context_length]))
    args.context_search = "max" in given
    if not args.context_search:
        results.refuse(parser, [(getattr(args, k) != parser.get_default(k),
                                 f"--{k.replace('_', '-')} only applies to --context-length max")
                                for k in ("max_context", "search_resolution", "search_probes")])
        return given
    args.max_context_default = None  # which default --max-context took, for --dry-run
    if args.max_context is None:
        args.max_context = MAX_CONTEXT_DEFAULT["cuda" if device.type == "cuda" else "cpu"]
        args.max_context_default = ("the default on CUDA" if device.type == "cuda" else
                                    f"the default on a CPU; on CUDA {MAX_CONTEXT_DEFAULT['cuda']}")
    results.refuse(parser, [
        (len(given) > 1, "--context-length max searches for the longest context on its own: give max or numbers, "
                         f"not both (got {' '.join(map(str, given))})"),
        (args.max_context < SEARCH_START,
         f"--max-context must be at least {SEARCH_START}, where the search starts; got {args.max_context}"),
        (args.in_process, "--context-length max runs every probe in its own child process (an OOM must not leave "
                          "memory behind for the next probe): drop --in-process"),
        (args.no_skip, "--no-skip does not apply to --context-length max: a search ends at its first failure"),
        (len(set(args.warmup)) > 1, "--context-length max takes one --warmup value: the warm-up does not change "
                                    "what fits"),
        (args.mode == "train" and min(args.warmup) + args.steps < 2,
         "--context-length max --mode train needs --warmup + --steps >= 2 per probe: AdamW makes its moments in the "
         "first step, so only the second reaches the training peak")])
    return probe_contexts(args.max_context)


# ---------------------------------------------------------------- build

# A configuration is a runner.RunConfig; runner.Workload builds its model, optimizer and batch on the device.


# ---------------------------------------------------------------- measure


# A block of one variant's consecutive timed steps lasts at least this long (unless that leaves fewer than 6
# rounds): switching variants costs cold caches and another graph, and each CUDA synchronisation ~10 us.
MIN_BLOCK_S = 0.005


def measure_interleaved(device: torch.device, builders: list[Callable[[], Workload]]) -> list[dict[str, Any]]:
    """The variants of one comparison: each built, compiled and warmed up in turn, then one block of timed steps of
    each per round (runner.interleave: A B | B A | ...), so drift falls on every side alike; `pairing` says which
    samples came from which round. A variant's CUDA peak: its resident bytes plus its blocks' most above that."""
    records, turns, warmup_times = [], [], []  # turns: (workload, resident bytes)
    for i, build in enumerate(builders):
        level = allocated_bytes(device)
        phase(f"building variant {i + 1}/{len(builders)}")
        work = build()
        record, last_warmup_s = warm_up(work, f" of variant {i + 1}")
        records.append(record)
        turns.append((work, allocated_bytes(device) - level))
        warmup_times.append(last_warmup_s)
    steps = turns[0][0].run.steps
    # the fastest variant sets the block: every variant's block then lasts at least MIN_BLOCK_S
    block = steps_per_block(None if None in warmup_times else min(warmup_times), steps, MIN_BLOCK_S)
    sizes = block_sizes(steps, block)
    samples: list[list[dict[str, float]]] = [[] for _ in turns]
    rounds: list[list[list[int]]] = [[] for _ in turns]

    def run_block(i: int, r: int) -> None:
        """Variant i's block of round r: its timed steps back to back (run_step: a SyncTimer around each phase)."""
        work, resident = turns[i]
        start, size = len(samples[i]), sizes[r]
        reset_peak_memory(device)
        level = allocated_bytes(device)
        for s in range(size):
            with timed_phase(f"round {r + 1}/{len(sizes)}, variant {i + 1}, step {s + 1}/{size}"):
                samples[i].append(work.step())
        rounds[i].append([start, start + size])
        if device.type == "cuda":  # the block's own peak above its start, plus what this variant holds
            peak = peak_memory_bytes(device)["peak_mem_allocated_bytes"] - level + resident
            records[i]["peak_mem_allocated_bytes"] = max(records[i].get("peak_mem_allocated_bytes", 0), peak)

    with annotate("measure"):
        runner.interleave(len(turns), len(sizes), run_block)
    phase("after the timed steps")
    group = uuid.uuid4().hex[:12]
    for i, (work, _) in enumerate(turns):
        records[i]["pairing"] = {"group": group, "mode": "steps", "position": i, "variants": len(turns),
                                 "steps_per_block": block, "rounds": rounds[i]}
        records[i] = with_samples(work, records[i], samples[i])
        records[i].update(after_steps(work, records[i]))
    return records


def allocated_bytes(device: torch.device) -> int:
    """Bytes of live tensors on a CUDA device now (a CPU has no allocator counter: 0)."""
    return torch.cuda.memory_allocated(device) if device.type == "cuda" else 0


def run_config(run: RunConfig) -> dict[str, Any]:
    """One configuration alone, in a child process of the sweep (which makes a failure its row)."""
    work = Workload(run)
    record = measure_steps(work)
    return {**record, **after_steps(work, record)}


def measure_together(runs: list[RunConfig]) -> list[dict[str, Any]]:
    """The variants of one comparison in one child process, their timed steps interleaved."""
    return measure_interleaved(resolve_device(runs[0].device), [functools.partial(Workload, r) for r in runs])


def after_steps(work: Workload, record: dict[str, Any]) -> dict[str, Any]:
    """Untimed, after the timed steps: --profile's trace and tables; --flops counted: FlopCounterMode's count of
    one more step through the model itself (matmuls and attention; the counter cannot see into torch.compile)."""
    out = trace_tables(work.run, work.profiler, record) if work.run.profile_results_dir is not None else {}
    if work.run.flops == "counted":
        from torch.utils.flop_counter import FlopCounterMode, sdpa_backward_flop_count, sdpa_flop_count
        phase("counting FLOPs (one untimed step)")
        # the counter knows the CUDA SDPA kernels but not the CPU's: its formulas for them too
        aten = torch.ops.aten
        cpu_sdpa = {aten._scaled_dot_product_flash_attention_for_cpu:
                    lambda q, k, v, *_, **__: sdpa_flop_count(q, k, v),
                    aten._scaled_dot_product_flash_attention_for_cpu_backward:
                    lambda grad, q, k, v, *_, **__: sdpa_backward_flop_count(grad, q, k, v)}
        with FlopCounterMode(display=False, custom_mapping=cpu_sdpa) as counter:
            loss = work.forward(eager=True)
            if work.run.mode != "forward":
                loss.backward()
        work.model.zero_grad(set_to_none=True)
        out["counted_step_flops"] = counter.get_total_flops()
    return out


def trace_tables(run: RunConfig, profiler: Any, record: dict[str, Any]) -> dict[str, Any]:
    """--profile: the Chrome/Perfetto trace under results/profile/ and its kernel tables ({"profile": ...}); under
    --parallel every rank's time in collectives ({"collectives": ...}), and only rank 0 keeps its trace."""
    phase("writing the profiler trace")
    keep, out = parallel.is_rank_zero(), {}
    with tempfile.TemporaryDirectory() as scratch:
        stem = re.sub(r"[^\w.-]+", "_", run.label().replace("ctx=", "ctx"))  # one name per variant of a sweep
        trace = (ResultFiles(run.profile_results_dir, "profile", None, stem, reserve=".json").path(".json") if keep
                 else Path(scratch, "trace.json"))
        profiler.export_chrome_trace(str(trace))
        if run.parallel:
            events = json.loads(trace.read_text())["traceEvents"]
            out["collectives"] = parallel.collective_rows(events, PHASES_BY_MODE[run.mode])
        if keep:
            out["profile"] = {"trace": str(trace), "tables": kernel_tables.build_tables(
                kernel_tables.load_torch_trace(trace), kernel_tables.stopwatch_ms(record),
                kernel_tables.attention_shape(dataclasses.asdict(run)), compiled=run.compile)}
    return out


# ---------------------------------------------------------------- report


def finish_record(run: RunConfig, record: dict[str, Any], args: argparse.Namespace) -> None:
    """A row's derived figures and status; the predicted state per rank (--parallel); the search's settings."""
    if run.parallel:
        record["predicted"] = parallel.state_bytes_per_rank(run.model, run.parallel, run.world_size, run.mode)
    if finished(record):
        record.update(derive_figures(run, record, args.peak_tflops, getattr(args, "ceiling", None)))
        record["status"] = "noisy" if record["noisy"] else "ok"
    if args.context_search:
        record["context_search"] = {"max_context": args.max_context, "resolution": args.search_resolution,
                                    "probe_budget": args.search_probes}


def plan_notes(runs: list[RunConfig], args: argparse.Namespace) -> list[str]:
    """What --dry-run says below the plan: the comparison's variants (and how they are timed), the searches."""
    notes, configs = [], [dataclasses.asdict(run) for run in runs]
    if names := variants(configs):
        how = ("each comparison's variants in one process, their timed steps interleaved; with warm-up 0 each "
               "variant in its own process (as --interleave runs)" if args.interleave == "steps"
               else f"each variant in its own process, {args.repeats} run(s) each, alternating")
        notes.append(f"then a comparison table: {' vs '.join(names)}, one row per size and context, speed-ups over "
                     f"{names[0]} ({how}).")
    if args.context_search:
        searches, contexts = len({config_key(c, context=False) for c in configs}), probe_contexts(args.max_context)
        notes.append(
            f"context search: {searches} search{'es' if searches > 1 else ''} (one per configuration but the context), "
            f"each trying ctx {', '.join(map(str, contexts))} in turn, every probe in its own child process. A search "
            "ends at its first OOM (the answer: the context before it), error or timeout (inconclusive), or after "
            f"{contexts[-1]} (--max-context {args.max_context}"
            f"{'; ' + args.max_context_default if args.max_context_default else ''})."
            + (f" After an OOM that follows a fit, up to {args.search_probes} more probes bisect between them to a "
               f"multiple of {args.search_resolution}." if args.search_probes else ""))
    return [textwrap.fill(note, width=116) for note in notes]


def main(argv: list[str] | None = None) -> int:
    args, runs = parse_args(argv)
    rank_zero = parallel.is_rank_zero()  # under torchrun only rank 0 prints and writes files
    if args.dry_run:
        if not rank_zero:
            return 0
        states = [parallel.state_bytes_per_rank(r.model, r.parallel, r.world_size, r.mode)["state_bytes"] for r in runs]
        labels = [f"{run.label()} (predicted state {state / GIB:.2f} GiB per rank, activations aside)"
                  for run, state in zip(runs, states)]
        return results.print_dry_run(labels, preamble=sizes_table([dataclasses.asdict(run) for run in runs], args.fmt),
                                 notes=plan_notes(runs, args), at_most=args.context_search)
    args.ceiling = runner.measured_ceiling(args, resolve_device(args.device))  # before any file: Ctrl-C leaves none
    files = ResultFiles(args.results_dir, "e2e", args.out, "e2e") if rank_zero else None
    live = report.LiveReport("bench_e2e", args.columns)  # the .md and --fmt file, rewritten as rows finish
    plan = runs if args.context_search else runner.comparisons(runs, RunConfig.comparison_key)
    records, code = runner.run_configurations(
        run_config, plan, files, args, name="bench_e2e", device=resolve_device(args.device),
        finish=lambda run, record: finish_record(run, record, args), render=live,
        summary=lambda record: f"{record['step_ms_mean'] / 1e3:.3f} s/step",
        measure_variants=measure_together, resize=RunConfig.with_context, search=args.context_search,
        ceiling=args.ceiling)
    if records and rank_zero:  # each search's answer as a record after its probes, then the report and figures
        published = report.publish("bench_e2e", records, files, args.fmt, args.columns, plot=args.plot,
                                   append=context_searches(records))
        return code or published or runner.all_failed(records)  # an interrupted sweep says so first
    return code


if __name__ == "__main__":
    sys.exit(main())
