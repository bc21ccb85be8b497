"""End-to-end timing of the Transformer LM: forward, backward and optimizer step, each timed on its own.

Answers the study's benchmarking questions: how long does a step take for each model size, what does warm-up
do, what do bf16 mixed precision and torch.compile buy.

    python bench_e2e.py --size large --warmup 0                  # one size, no warm-up
    python bench_e2e.py --size all                                # the handout's Table 1, one row each
    python bench_e2e.py --size xl --handout 2025                  # sizes from the Spring 2025 handout
    python bench_e2e.py --size all --dtype fp32 bf16 --dry-run    # list the configurations, run nothing
    python bench_e2e.py --size small --warmup 0 1 2 5             # the warm-up study, rows side by side
    python bench_e2e.py --size medium --dtype fp32 bf16           # fp32 vs bf16 autocast
    python bench_e2e.py --size small --compile                    # eager vs torch.compile (run both)
    python bench_e2e.py --size tiny --context-length 128 256 512  # a context sweep; OOM stops larger contexts
    python bench_e2e.py --size tiny --profile --steps 3           # torch.profiler kernel tables (no nsys needed)

Size names and the default context length (512; 128 under --handout 2025) come from the study's handout: the
current one (2026, v26.1.1) unless --handout or CS336_HANDOUT says 2025. Each configuration of a sweep runs in
its own child process (an OOM cannot poison the next one). The table is printed on stdout and saved with one JSON
record per configuration under results/e2e/.
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import itertools
import sys
from dataclasses import dataclass
from typing import Any, Callable

import torch

import common
import kernel_tables
from common import (DEFAULT_BATCH_SIZE, DEFAULT_HANDOUT, DTYPES, HANDOUTS, ModelConfig, ResultFiles,
                    SyncTimer, annotate, environment, environment_header, get_config,
                    matmul_precision_key, non_negative_int, peak_tflops, positive_float, positive_int,
                    precision_context, progress, render_table, resolve_device, run_isolated, set_ranges, summarize)
from model import ATTENTION, TransformerLM, cross_entropy
from optim import AdamW

MODES = ("forward", "forward-backward", "train")
PHASES_BY_MODE = {"forward": ("forward",), "forward-backward": ("forward", "backward"),
                  "train": ("forward", "backward", "optimizer")}
NOISY_CV = 0.10  # a phase whose std/mean is above this is flagged: don't quote it without a second look


# ---- one configuration ----


@dataclass(frozen=True)
class RunConfig:
    size: str  # preset name, or "custom"
    model: ModelConfig  # its context_length is the benchmarked sequence length
    handout: str = DEFAULT_HANDOUT  # whose Table 1 the size name comes from
    batch_size: int = DEFAULT_BATCH_SIZE
    warmup: int = 5
    steps: int = 10
    mode: str = "train"
    no_grad: bool = False  # forward mode only: run under torch.inference_mode()
    dtype: str = "fp32"  # fp32, or bf16/fp16 autocast with fp32 master weights
    compile: bool = False
    attn: str = "naive"
    optimizer: str = "ours"  # ours = optim.AdamW; torch = torch.optim.AdamW (fused on CUDA, foreach on CPU)
    tf32: bool | None = None  # None = leave PyTorch's default
    device: str = "auto"
    seed: int = 0
    nvtx: bool = False
    checkpoint_every: int = 0
    profile_results_dir: str | None = None  # --profile: torch.profiler trace under <this>/profile/; None = off

    @property
    def context_length(self) -> int:
        return self.model.context_length

    def label(self) -> str:
        parts = [self.size, f"ctx={self.context_length}", self.dtype, f"warmup={self.warmup}"]
        if self.optimizer != "ours":
            parts.append(f"optimizer={self.optimizer}")
        return " ".join(parts + (["compiled"] if self.compile else []))


class Workload:
    """Model, optimizer, one random batch and the three phases of a training step, set up on a device.

    forward() is the model call plus the loss; backward() is loss.backward() (through the gradient scaler for
    fp16); optimizer_step() is step() plus zero_grad(set_to_none=True)."""

    def __init__(self, run: RunConfig):
        self.run = run
        self.device = resolve_device(run.device)
        if run.tf32 is not None:
            torch.backends.cuda.matmul.allow_tf32 = run.tf32
            torch.backends.cudnn.allow_tf32 = run.tf32
        torch.manual_seed(run.seed)
        with self.device:  # initialise directly on the device: CPU init of a 2.7B model takes minutes
            self.model = TransformerLM(run.model, attn=run.attn, checkpoint_every=run.checkpoint_every)
        self.callable_model = torch.compile(self.model) if run.compile else self.model
        self.tokens = torch.randint(0, run.model.vocab_size, (run.batch_size, run.context_length), device=self.device)
        self.targets = torch.randint(0, run.model.vocab_size, (run.batch_size, run.context_length), device=self.device)
        self.optimizer = None
        if run.mode == "train":
            if run.optimizer == "ours":
                self.optimizer = AdamW(self.model.parameters())
            elif self.device.type == "cuda":
                self.optimizer = torch.optim.AdamW(self.model.parameters(), fused=True)
            else:
                self.optimizer = torch.optim.AdamW(self.model.parameters(), foreach=True)
        # fp16 gradients underflow without loss scaling; bf16 has fp32's exponent range and needs none
        self.scaler = torch.amp.GradScaler(self.device.type) if run.dtype == "fp16" and run.mode != "forward" else None

    def forward(self) -> torch.Tensor:
        grad_mode = torch.inference_mode() if self.run.no_grad else torch.enable_grad()
        with grad_mode, precision_context(self.device, self.run.dtype):
            logits = self.callable_model(self.tokens)
            return cross_entropy(logits, self.targets)

    def backward(self, loss: torch.Tensor) -> None:
        (self.scaler.scale(loss) if self.scaler else loss).backward()

    def optimizer_step(self) -> None:
        if self.scaler:
            self.scaler.step(self.optimizer)
            self.scaler.update()
        else:
            self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)

    def zero_grad(self) -> None:
        """Between forward-backward steps, drop the gradients (untimed) so each step starts alike."""
        self.model.zero_grad(set_to_none=True)


def run_step(work: Workload, on_phase: Callable[[str], None] | None = None) -> dict[str, float]:
    """One step of work.run.mode with a device synchronisation at every phase boundary. Returns seconds per
    phase and for the whole step. `on_phase(name)` is called (outside the timers) before each phase and with
    "end" after the last; mem_profile uses it to mark phases in a memory timeline."""
    device = work.device
    times: dict[str, float] = {}
    phases = PHASES_BY_MODE[work.run.mode]
    with SyncTimer(device) as step_timer:
        for phase in phases:
            if on_phase:
                on_phase(phase)
            with annotate(phase), SyncTimer(device) as timer:
                if phase == "forward":
                    loss = work.forward()
                elif phase == "backward":
                    work.backward(loss)
                else:
                    work.optimizer_step()
            times[phase] = timer.elapsed_s
        if on_phase:
            on_phase("end")
    times["step"] = step_timer.elapsed_s
    if work.run.mode == "forward-backward":
        work.zero_grad()
    return times


def run_config(run: RunConfig) -> dict[str, Any]:
    """Build the workload, compile (if asked), warm up, time `run.steps` steps. Returns a JSON-ready record.
    Runs in a child process during sweeps; failures propagate as exceptions (the runner turns them into rows)."""
    common.maybe_inject_fault({"size": run.size, "context_length": run.context_length, "dtype": run.dtype,
                               "warmup": run.warmup})
    set_ranges(nvtx=run.nvtx, profiler=run.profile_results_dir is not None)
    work = Workload(run)
    device = work.device
    record: dict[str, Any] = {"environment": environment(device)}
    if run.compile:  # the first call compiles (forward, and backward on first backward): timed apart
        _, record["compile_s"] = SyncTimer(device).time(lambda: run_step(work))
    with annotate("warmup"):
        for _ in range(run.warmup):
            run_step(work)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    samples: list[dict[str, float]] = []
    with profiler_for(run, device) as profiler, annotate("measure"):
        for _ in range(run.steps):
            samples.append(run_step(work))
    if device.type == "cuda":
        record["peak_mem_allocated_bytes"] = torch.cuda.max_memory_allocated(device)
        record["peak_mem_reserved_bytes"] = torch.cuda.max_memory_reserved(device)
    for key in samples[0]:
        record[f"{key}_ms"] = [s[key] * 1e3 for s in samples]
    if profiler is not None:
        record["profile"] = profile_tables(run, profiler, record)
    return record


# ---- --profile: torch.profiler over the measured steps ----


def profiler_for(run: RunConfig, device: torch.device) -> contextlib.AbstractContextManager:
    """torch.profiler around the measured steps (CPU activity always, CUDA when on a GPU) when --profile is on;
    a context yielding None otherwise."""
    if run.profile_results_dir is None:
        return contextlib.nullcontext()
    activities = [torch.profiler.ProfilerActivity.CPU]
    if device.type == "cuda":
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    return torch.profiler.profile(activities=activities)


def profile_tables(run: RunConfig, profiler: torch.profiler.profile, record: dict[str, Any]) -> dict[str, Any]:
    """Write the Chrome/Perfetto trace under results/profile/ and build kernel_tables' four tables from it, in
    the process that profiled: the parent (and the JSONL record) gets the trace path and the rows, not the
    profiler object."""
    stem = f"{run.size}_ctx{run.context_length}_{run.mode}_{run.dtype}"
    files = ResultFiles(run.profile_results_dir, "profile", None, stem)
    trace = files.path(".json")
    profiler.export_chrome_trace(str(trace))
    tables = kernel_tables.build_tables(kernel_tables.load_torch_trace(trace), kernel_tables.stopwatch_ms(record),
                                        kernel_tables.attention_shape(dataclasses.asdict(run)))
    return {"trace": str(trace), "tables": tables}


def profile_report(runs: list[RunConfig], records: list[dict], fmt: str) -> str:
    """The --profile tables of every configuration that has them."""
    parts = []
    for run, rec in zip(runs, records):
        if "profile" in rec:
            parts.append(f"## torch.profiler: {run.label()} (timings above were taken with the profiler on)\n\n"
                         + kernel_tables.render_tables(rec["profile"]["tables"], fmt)
                         + f"\n\ntrace: {rec['profile']['trace']} (open in https://ui.perfetto.dev)")
    return "\n\n".join(parts)


# ---- derived figures ----


def derive_figures(run: RunConfig, record: dict[str, Any], peak_override: float | None = None) -> dict[str, Any]:
    """Statistics per phase, noisy flags, tokens/s, FLOPs, achieved TFLOP/s and MFU for one finished record."""
    out: dict[str, Any] = {}
    noisy = []
    for phase in PHASES_BY_MODE[run.mode] + ("step",):
        stats = summarize(record[f"{phase}_ms"])
        for stat, value in stats.items():
            out[f"{phase}_ms_{stat}"] = value
        if stats["cv"] > NOISY_CV:
            noisy.append(f"{phase} {stats['cv']:.0%}")
    out["noisy"] = noisy
    step_s = out["step_ms_mean"] / 1e3
    tokens = run.batch_size * run.context_length
    flops = common.step_flops(run.model, run.batch_size, run.context_length, run.mode)
    out["tokens_per_s"] = tokens / step_s
    out["step_flops"] = flops
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
    out["mfu"] = out["achieved_tflops"] / peak if peak else None
    return out


# ---- the table ----

COLUMNS = ["size", "d_model", "d_ff", "layers", "heads", "ctx", "dtype", "warmup", "optimizer", "fwd ms", "fwd std",
           "bwd ms", "bwd std", "opt ms", "opt std", "step ms", "step std", "tokens/s", "TFLOP/s", "MFU",
           "peak mem GiB", "status"]


def table_row(run: RunConfig, record: dict[str, Any]) -> dict[str, Any]:
    m = run.model
    row: dict[str, Any] = {"size": run.size, "d_model": m.d_model, "d_ff": m.d_ff, "layers": m.num_layers,
                           "heads": m.num_heads, "ctx": run.context_length,
                           "dtype": run.dtype + (" compiled" if run.compile else ""), "warmup": run.warmup,
                           "status": record["status"]}
    if record["status"] not in ("ok", "noisy"):
        return row
    for phase, short in (("forward", "fwd"), ("backward", "bwd"), ("optimizer", "opt"), ("step", "step")):
        if f"{phase}_ms_mean" in record:
            row[f"{short} ms"] = record[f"{phase}_ms_mean"]
            row[f"{short} std"] = record[f"{phase}_ms_std"]
    row["tokens/s"] = f"{record['tokens_per_s']:,.0f}"
    row["TFLOP/s"] = record["achieved_tflops"]
    row["MFU"] = f"{record['mfu']:.1%}" if record.get("mfu") is not None else None
    if record.get("peak_mem_allocated_bytes") is not None:
        row["peak mem GiB"] = record["peak_mem_allocated_bytes"] / 2**30
    if record["noisy"]:
        row["status"] = "NOISY cv>10%: " + ", ".join(record["noisy"])
    return row


def config_table(runs: list[RunConfig], fmt: str) -> str:
    return common.config_table([(run.size, run.model) for run in runs], HANDOUTS[runs[0].handout], fmt)


# ---- command line ----


def build_parser() -> argparse.ArgumentParser:
    p = common.ArgParser(description=__doc__.split("\n\n")[0],
                         formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--size", nargs="+", default=None, metavar="SIZE",
                   help="model preset(s) of the handout's Table 1 (2026: "
                        f"{', '.join(HANDOUTS['2026'].presets)}; 2025: {', '.join(HANDOUTS['2025'].presets)}), "
                        "or 'all' for its Table 1 (default: tiny, or 'custom' when --d-model, --d-ff, --num-layers "
                        "and --num-heads are all given)")
    common.add_handout_arg(p)
    p.add_argument("--d-model", type=positive_int, help="override d_model")
    p.add_argument("--d-ff", type=positive_int, help="override d_ff")
    p.add_argument("--num-layers", type=positive_int, help="override the number of layers")
    p.add_argument("--num-heads", type=positive_int, help="override the number of heads")
    p.add_argument("--vocab-size", type=positive_int, default=10_000, help="vocabulary size")
    p.add_argument("--context-length", type=positive_int, nargs="+", default=None,
                   help="sequence length(s) (default: the handout's, 512 for 2026 and 128 for 2025)")
    p.add_argument("--batch-size", type=positive_int, default=DEFAULT_BATCH_SIZE, help="batch size")
    p.add_argument("--warmup", type=non_negative_int, nargs="+", default=[5], help="warm-up step count(s)")
    p.add_argument("--steps", type=positive_int, default=10, help="timed steps")
    p.add_argument("--mode", choices=MODES, default="train",
                   help="forward only, forward+backward, or a full training step (forward, backward, AdamW)")
    p.add_argument("--no-grad", action="store_true", help="forward mode only: run under torch.inference_mode()")
    p.add_argument("--dtype", nargs="+", choices=list(DTYPES), default=["fp32"],
                   help="fp32, or bf16/fp16 autocast mixed precision (fp32 master weights; fp16 with a grad scaler)")
    p.add_argument("--compile", action="store_true",
                   help="torch.compile the whole model; compile time is reported apart from the timed steps")
    p.add_argument("--attn", choices=list(ATTENTION), default="naive", help="attention implementation")
    p.add_argument("--optimizer", nargs="+", choices=["ours", "torch"], default=["ours"],
                   help="ours = optim.AdamW; torch = torch.optim.AdamW (fused on CUDA, foreach on CPU); give both "
                        "to compare them in one table (train mode)")
    p.add_argument("--tf32", choices=["on", "off"], default=None,
                   help="CUDA only: allow TF32 tensor cores for fp32 matmuls (default: PyTorch's default, off)")
    p.add_argument("--seed", type=int, default=0, help="random seed for weights and data")
    p.add_argument("--nvtx", action="store_true",
                   help="CUDA only: emit NVTX ranges (warmup, measure, forward, backward, optimizer, attention)")
    p.add_argument("--profile", action="store_true",
                   help="after the warm-up, profile the measured steps with torch.profiler (CPU, and CUDA when "
                        "present), write a Chrome/Perfetto trace under results/profile/ and print kernel tables "
                        "(phases, top kernels, categories, attention); the way to profile without nsys")
    p.add_argument("--peak-tflops", type=positive_float, default=None,
                   help="peak TFLOP/s for MFU, overriding the built-in table (e.g. for an unlisted GPU)")
    common.add_device_args(p)
    p.add_argument("--no-skip", action="store_true",
                   help="after an OOM, still run the larger context lengths of that size and dtype")
    common.add_output_args(p, default_stem="e2e")
    common.add_dry_run_arg(p)
    return p


def parse_args(argv: list[str] | None = None) -> tuple[argparse.Namespace, list[RunConfig]]:
    parser = build_parser()
    args = parser.parse_args(argv)
    handout = common.handout_or_exit(parser, args)
    dims = {"d_model": args.d_model, "d_ff": args.d_ff, "num_layers": args.num_layers, "num_heads": args.num_heads}
    if args.size is None:
        args.size = ["custom"] if all(v is not None for v in dims.values()) else ["tiny"]
    else:
        args.size = common.sizes_or_exit(parser, args, args.size)
    if args.context_length is None:
        args.context_length = [handout.default_context_length]
    if args.no_grad and args.mode != "forward":
        parser.error("--no-grad only applies to --mode forward (backward needs the autograd graph)")
    args.optimizer = list(dict.fromkeys(args.optimizer))
    if len(args.optimizer) > 1 and args.mode != "train":
        parser.error("comparing optimizers needs --mode train (other modes take no optimizer step)")
    device = common.device_or_exit(parser, args.device)
    if device.type != "cuda":
        for flag, given in (("--nvtx", args.nvtx), ("--tf32", args.tf32 is not None)):
            if given:
                parser.error(f"{flag} needs a CUDA device, and this run is on {device}")
    runs = []
    try:
        for size, ctx, dtype, optimizer, warmup in itertools.product(args.size, args.context_length, args.dtype,
                                                                      args.optimizer, args.warmup):
            if size == "custom":
                model = ModelConfig(**dims, vocab_size=args.vocab_size, context_length=ctx)
            else:
                model = get_config(size, args.handout, **dims, vocab_size=args.vocab_size, context_length=ctx)
            runs.append(RunConfig(size=size, handout=args.handout, model=model, batch_size=args.batch_size,
                                  warmup=warmup, steps=args.steps, mode=args.mode, no_grad=args.no_grad, dtype=dtype,
                                  compile=args.compile, attn=args.attn, optimizer=optimizer,
                                  tf32=None if args.tf32 is None else args.tf32 == "on", device=args.device,
                                  seed=args.seed, nvtx=args.nvtx,
                                  profile_results_dir=args.results_dir if args.profile else None))
    except (ValueError, TypeError) as exc:
        parser.error(str(exc))
    return args, runs


# ---- the sweep ----


def run_sweep(runs: list[RunConfig], args: argparse.Namespace, files: ResultFiles) -> tuple[list[dict], bool]:
    """Run every configuration, appending a record as each finishes. Returns (records, interrupted)."""
    records: list[dict[str, Any]] = []
    oom_at: dict[tuple[str, str], int] = {}  # (size, dtype) -> smallest context length that ran out of memory
    isolate = not args.in_process
    for i, run in enumerate(runs, 1):
        key = (run.size, run.dtype)
        base = {"config": dataclasses.asdict(run), "label": run.label()}
        if not args.no_skip and key in oom_at and run.context_length > oom_at[key]:
            record = {**base, "status": f"skipped: OOM at ctx={oom_at[key]}"}
        else:
            try:
                result = run_isolated(run_config, {"run": run}, in_process=not isolate)
            except KeyboardInterrupt:
                progress(f"[{i}/{len(runs)}] {run.label()}: interrupted; keeping {len(records)} finished rows")
                return records, True
            if result["ok"]:
                record = {**base, **result["value"]}
                record.update(derive_figures(run, record, args.peak_tflops))
                record["status"] = "noisy" if record["noisy"] else "ok"
            else:
                record = {**base, "status": result["status"], "traceback": result.get("traceback")}
                if result["status"] == "OOM":
                    oom_at[key] = min(oom_at.get(key, run.context_length), run.context_length)
        records.append(record)
        files.append_record(record)
        if "step_ms_mean" in record:
            progress(f"[{i}/{len(runs)}] {run.label()}: {record['step_ms_mean'] / 1e3:.3f} s/step")
        else:
            progress(f"[{i}/{len(runs)}] {run.label()}: {record['status']}")
    return records, False


def report(runs: list[RunConfig], records: list[dict], args: argparse.Namespace) -> str:
    """Environment header and the results table (plus compile times), as printed after the sweep."""
    env = next((r["environment"] for r in records if "environment" in r), None)
    run0 = runs[0]
    optimizers = list(dict.fromkeys(run.optimizer for run in runs))
    settings = {"sizes from": HANDOUTS[run0.handout].title, "batch": run0.batch_size, "steps": run0.steps,
                "mode": run0.mode + (" no-grad" if run0.no_grad else ""), "attn": run0.attn}
    if run0.mode == "train" and len(optimizers) == 1:
        settings["optimizer"] = optimizers[0]
    lines = [environment_header(env, **settings) if env else f"settings: {settings}", ""]
    rows = [table_row(run, rec) for run, rec in zip(runs, records)]
    if len(optimizers) > 1:  # an optimizer comparison: one column says which row is which
        for run, row in zip(runs, rows):
            row["optimizer"] = run.optimizer
    columns = [c for c in COLUMNS if any(row.get(c) is not None for row in rows) or c in COLUMNS[:8]]
    lines.append(render_table(rows, columns, args.fmt))
    compile_times = [f"{run.label()}: {rec['compile_s']:.1f} s" for run, rec in zip(runs, records) if "compile_s" in rec]
    if compile_times:
        lines += ["", "compile time (first step, not in the timings): " + "; ".join(compile_times)]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args, runs = parse_args(argv)
    configs = config_table(runs, args.fmt)
    if args.dry_run:
        return common.print_dry_run([run.label() for run in runs], preamble=configs)
    files = ResultFiles(args.results_dir, "e2e", args.out, "e2e")
    print(configs + "\n", flush=True)  # people quote the model config first
    records, interrupted = run_sweep(runs, args, files)
    if records:
        results = report(runs[: len(records)], records, args)
        profiles = profile_report(runs[: len(records)], records, args.fmt)
        if profiles:
            results += "\n\n" + profiles
        print(results)
        files.write_markdown(configs + "\n\n" + results)  # the saved file also holds the config table
        print(f"\nwrote {files.markdown} and {files.jsonl}")
    return common.sweep_exit_status(interrupted, len(records), len(runs))


if __name__ == "__main__":
    sys.exit(main())
