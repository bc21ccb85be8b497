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
    python3 bench_e2e.py --leaderboard --model mine=my_lm:make_model   # the 2026 leaderboard's step, checked first
    torchrun --nproc-per-node 2 bench_e2e.py --leaderboard --parallel fsdp   # ... spread over 2 GPUs
    python3 bench_e2e.py --leaderboard full --dry-run --parallel fsdp --world-size 2   # the state per device

Method (the `measure` section): the compile step (compile_s) and --warmup steps run untimed; the peak-memory
counter is reset; then --steps timed steps, each phase (forward with the loss, backward, optimizer step) and the
whole step between two device synchronisations. Variants are built in one process and timed A B | B A | ...; each
configuration runs in a child process (runner.py), so an OOM is a row. Manual: docs/bench_e2e.md.
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import functools
import importlib.util
import itertools
import json
import math
import os
import re
import sys
import tempfile
import textwrap
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable
from unittest import mock

import torch

import bench_attention
import common
import kernel_tables
import parallel
import report
import results
import runner
from common import (DTYPES, SyncTimer, annotate, environment, machine_load, matmul_precision_key, peak_memory_bytes,
                    peak_tflops, precision_context, reset_peak_memory, resolve_device, set_ranges)
from model import ADAMW_SETTINGS, ATTENTION, build_model, build_optimizer, check_logits, cross_entropy
from parallel import DEFAULT_PG_TIMEOUT_S
from report import E2E_COLUMNS, SEARCH_START, config_key, context_searches, probe_contexts, sizes_table, variants
from results import (DEFAULT_BATCH_SIZE, DEFAULT_HANDOUT, GIB, LEADERBOARD, LEADERBOARD_BATCH, MODES,
                     PHASES_BY_MODE, ModelConfig, ResultFiles, block_sizes, finished, get_config, positive_float,
                     positive_int, steps_per_block, summarize)
from runner import PROBE_BUDGET, RESOLUTION, phase, timed_phase

NOISY_CV = 0.10  # a phase whose std/mean is above this is flagged: don't quote it without a second look
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


def named_model(text: str) -> tuple[str | None, str]:
    """--model: ours, MODULE:CALLABLE, or NAME=either -> (NAME or None, the model)."""
    name, _, spec = text.rpartition("=")
    if name and not re.fullmatch(r"[A-Za-z0-9_.+-]+", name):  # a short name for tables and records
        raise argparse.ArgumentTypeError(f"model name {name!r}: letters, digits and _ . + - only")
    return name or None, common.named_or_spec([common.OURS])(spec)


def parse_args(argv: list[str] | None = None) -> tuple[argparse.Namespace, list[RunConfig]]:
    p = results.ArgParser(description=__doc__.split("\n\n")[0])
    results.add_size_args(p, "tiny, or 'custom' when --d-model, --d-ff, --num-layers and --num-heads are all given")
    for flag, what in (("--d-model", "d_model"), ("--d-ff", "d_ff"), ("--num-layers", "the number of layers"),
                       ("--num-heads", "the number of heads")):
        p.add_argument(flag, type=positive_int, help=f"override {what}")
    p.add_argument("--vocab-size", type=positive_int, default=None, help="vocabulary size (default: 10000)")
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
                   help=f"batch size (default: {DEFAULT_BATCH_SIZE}; --leaderboard: 2, over all ranks)")
    results.add_workload_args(p, MODES, DTYPES, ATTENTION, several_modes=False, several_warmups=True, warmup=5,
                          steps=10)
    p.add_argument("--no-grad", action="store_true", help="forward mode only: run under torch.inference_mode()")
    p.add_argument("--compile", nargs="*", choices=["off", "on"], default=["off"],
                   help="torch.compile the whole model (--compile alone = on; 'off on' compares them); the compile "
                        "step is timed apart")
    common.add_model_args(p, "ours = optim.AdamW; torch = torch.optim.AdamW (fused on CUDA, foreach on CPU); give "
                                "several to compare them in one table (train mode)", flops=True)
    model_flag = next(a for a in p._actions if a.dest == "model")
    model_flag.type = named_model
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
    p.add_argument("--leaderboard", nargs="?", choices=["auto", "full", "scaled"], const="auto", default=None,
                   help="the 2026 leaderboard's training step (d_model 4096, 34 layers, vocab 151936, context 32768, "
                        "batch 2, bf16): your --model checked against the reference, then timed with do_bench; auto "
                        "(--leaderboard alone): full on CUDA, scaled down elsewhere (docs/bench_e2e.md#leaderboard)")
    p.add_argument("--rep-ms", type=positive_float, default=None,
                   help="--leaderboard: do_bench's rep, ms of timed steps (default: 30000 on CUDA, 500 elsewhere)")
    p.add_argument("--warmup-ms", type=positive_float, default=None,
                   help="--leaderboard: do_bench's warmup, ms of untimed steps (default: 10000 on CUDA, 100 elsewhere)")
    p.add_argument("--param-map", type=common.named_or_spec([]), default=None, metavar="MODULE:CALLABLE",
                   help="--leaderboard: CALLABLE(your_model) returns {your parameter name: ours} for the behaviour "
                        "check, where your names differ from the reference's")
    results.add_device_args(p)
    parallel.add_parallel_args(p)
    runner.add_sweep_args(p, compares=True)
    results.add_output_args(p, default_stem="e2e-<UTC time>")
    report.add_columns_and_plot_args(p, "bench_e2e")
    results.add_dry_run_arg(p)
    args = p.parse_args(argv)
    if args.leaderboard:
        return args, [leaderboard_run(p, args)]
    results.refuse(p, [(flag is not None, f"{name} only applies to --leaderboard") for flag, name in
                       ((args.rep_ms, "--rep-ms"), (args.warmup_ms, "--warmup-ms"), (args.param_map, "--param-map"))])
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
    results.refuse(p, [
        (args.no_grad and args.mode != "forward",
         "--no-grad only applies to --mode forward (backward needs the autograd graph)"),
        (len(args.optimizer) > 1 and args.mode != "train",
         "comparing optimizers needs --mode train (other modes take no optimizer step)"),
        (len(set(args.model)) < len(given) or len(set(args.model_names.values())) < len(args.model_names),
         "--model: give each model once, and each NAME to one model")])
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


@dataclass(frozen=True)
class RunConfig:
    """One configuration: what the sweep runs in a child process and what every record keeps as "config"."""

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
    optimizer: str = "ours"  # ours, torch, or yours as MODULE:CLASS (model.build_optimizer)
    model_factory: str | None = None  # yours as MODULE:CALLABLE (model.build_model); None = ours
    model_name: str | None = None  # --model NAME=...: the model's name in tables and records
    flops: str = "formula"  # formula (our architecture), counted (FlopCounterMode) or none
    tf32: bool | None = None  # None = leave PyTorch's default
    device: str = "auto"
    seed: int = 0
    nvtx: bool = False
    checkpoint_every: int = 0  # mem_profile's activation checkpointing
    profile_results_dir: str | None = None  # --profile: torch.profiler trace under <this>/profile/
    parallel: str | None = None  # torchrun: "ddp" or "fsdp" (parallel.shard_model), each rank its own batch
    world_size: int = 1
    fsdp_mixed_precision: str = "off"  # fsdp: "bf16" = MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32)
    reshard_after_forward: bool = True  # fsdp: blocks free their gathered parameters after forward
    pg_timeout_s: float = DEFAULT_PG_TIMEOUT_S  # a collective waiting longer for a peer fails

    @property
    def context_length(self) -> int:
        return self.model.context_length

    def label(self) -> str:
        """The configuration in progress lines and file names; settings at their default are left out."""
        model = [self.model_name or self.model_factory] if self.model_factory else [self.model_name, self.attn]
        optimizer = f"optimizer={self.optimizer}" if self.optimizer != "ours" else None
        parts = [self.size, f"ctx={self.context_length}", self.mode + (" no-grad" if self.no_grad else ""),
                 self.dtype, *model, f"warmup={self.warmup}", optimizer, report.parallel_label(vars(self)),
                 "compiled" if self.compile else None]
        return " ".join(filter(None, parts))

    def skip_key(self) -> tuple[tuple, str, int]:
        """(group, "ctx", context): after an OOM the sweep skips the group's larger contexts."""
        return dataclasses.replace(self.with_context(1), warmup=0, steps=0), "ctx", self.context_length

    def comparison_key(self) -> RunConfig | None:
        """Without the variant fields: runs that share it are measured together, interleaved. None when a variant
        must run alone: under --parallel (its own process group), --profile or --nvtx (a profile holds one)."""
        if self.parallel or self.profile_results_dir is not None or self.nvtx:
            return None
        return dataclasses.replace(self, dtype="", compile=False, attn="", optimizer="", model_factory=None,
                                   model_name=None, flops="")

    def with_context(self, context_length: int) -> RunConfig:  # a search's next probe
        return dataclasses.replace(self, model=dataclasses.replace(self.model, context_length=context_length))


class Workload:
    """Model, optimizer and one random batch on the device, a step's three phases, and what runs untimed around
    the timed steps. Under --parallel this process is one rank of a process group already joined: the model is in
    DDP or FSDP2 and the batch is this rank's."""

    def __init__(self, run: RunConfig):
        phase("building the model")
        self.run = run
        launch = parallel.torchrun_launch() if run.parallel else None
        self.device = parallel.rank_device(resolve_device(run.device), launch)
        set_ranges(nvtx=run.nvtx, profiler=run.profile_results_dir is not None)
        kinds = ["CPU", "CUDA"] if self.device.type == "cuda" else ["CPU"]
        self.profiler = (common.quiet_profiler([getattr(torch.profiler.ProfilerActivity, k) for k in kinds])
                         if run.profile_results_dir is not None else contextlib.nullcontext())  # around timed steps
        if run.tf32 is not None:
            torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = run.tf32
        torch.manual_seed(run.seed)
        with self.device:  # initialise directly on the device: CPU init of a 2.7B model takes minutes
            self.model = build_model(run.model, run.attn, run.checkpoint_every, run.model_factory)
        wrapped = self.model
        if run.parallel:
            wrapped = parallel.shard_model(self.model, run.parallel, self.device, run.fsdp_mixed_precision,
                                           run.reshard_after_forward)
            torch.manual_seed(run.seed + 1 + launch.rank)  # each rank its own batch
        self.callable_model = torch.compile(wrapped) if run.compile else wrapped
        shape = (run.batch_size, run.context_length)
        self.tokens = torch.randint(0, run.model.vocab_size, shape, device=self.device)  # made once, not timed
        self.targets = torch.randint(0, run.model.vocab_size, shape, device=self.device)
        self.optimizer = (build_optimizer(run.optimizer, self.model.parameters(), self.device)
                          if run.mode == "train" else None)
        self.logits_checked = run.model_factory is None  # ours is known to be right; yours is checked once
        # fp16 gradients underflow without loss scaling; bf16 has fp32's exponent range and needs none
        self.scaler = torch.amp.GradScaler(self.device.type, enabled=run.dtype == "fp16" and run.mode != "forward")

    def forward(self, eager: bool = False) -> torch.Tensor:
        """The loss of the batch; `eager`: through the model itself, not torch.compile's or DDP's wrapper."""
        grad_mode = torch.inference_mode() if self.run.no_grad else torch.enable_grad()
        with grad_mode, precision_context(self.device, self.run.dtype):
            logits = (self.model if eager else self.callable_model)(self.tokens)
            if not self.logits_checked:
                check_logits(logits, tuple(self.tokens.shape), self.run.model.vocab_size,
                             self.run.model_name or self.run.model_factory)
                self.logits_checked = True
            return cross_entropy(logits, self.targets)

    def backward(self, loss: torch.Tensor) -> None:  # the scaler is a pass-through but for fp16
        self.scaler.scale(loss).backward()

    def optimizer_step(self) -> None:
        self.scaler.step(self.optimizer)
        self.scaler.update()
        self.optimizer.zero_grad(set_to_none=True)

    def step(self) -> dict[str, float]:
        return run_step(self)

    def untimed_step(self, mark: Callable[[str], None] = lambda phase: None) -> None:
        """run_step's phases with no synchronisation between them (the leaderboard's step, mem_profile's), calling
        mark(phase) before each and mark("end") after."""
        mark("forward")
        loss = self.forward()
        if self.run.mode != "forward":
            mark("backward")
            self.backward(loss)
        if self.run.mode == "train":
            mark("optimizer")
            self.optimizer_step()
        elif self.run.mode == "forward-backward":
            self.model.zero_grad(set_to_none=True)
        mark("end")

    def after(self, record: dict[str, Any]) -> dict[str, Any]:
        """Untimed, after the timed steps: --profile's trace and tables; --flops counted: FlopCounterMode's count of
        one more step through the model itself (matmuls and attention; the counter cannot see into torch.compile)."""
        out = trace_tables(self.run, self.profiler, record) if self.run.profile_results_dir is not None else {}
        if self.run.flops == "counted":
            from torch.utils.flop_counter import FlopCounterMode, sdpa_backward_flop_count, sdpa_flop_count
            phase("counting FLOPs (one untimed step)")
            # the counter knows the CUDA SDPA kernels but not the CPU's: its formulas for them too
            aten = torch.ops.aten
            cpu_sdpa = {aten._scaled_dot_product_flash_attention_for_cpu:
                        lambda q, k, v, *_, **__: sdpa_flop_count(q, k, v),
                        aten._scaled_dot_product_flash_attention_for_cpu_backward:
                        lambda grad, q, k, v, *_, **__: sdpa_backward_flop_count(grad, q, k, v)}
            with FlopCounterMode(display=False, custom_mapping=cpu_sdpa) as counter:
                loss = self.forward(eager=True)
                if self.run.mode != "forward":
                    loss.backward()
            self.model.zero_grad(set_to_none=True)
            out["counted_step_flops"] = counter.get_total_flops()
        return out


# ---------------------------------------------------------------- measure


def run_step(work: Workload) -> dict[str, float]:
    """One step, timed: seconds per phase and for the whole step. SyncTimer synchronises, reads the clock, runs,
    synchronises, reads: each phase is timed to its last kernel, the step timer holds the phases back to back.
    Nothing else runs inside the timers: no data creation, no .item() (a hidden sync), no printing."""
    times: dict[str, float] = {}
    with SyncTimer(work.device) as step:
        for name in PHASES_BY_MODE[work.run.mode]:  # forward[, backward[, optimizer]]
            with annotate(name), SyncTimer(work.device) as timer:  # annotate: an NVTX / profiler range
                if name == "forward":
                    loss = work.forward()
                elif name == "backward":
                    work.backward(loss)
                else:
                    work.optimizer_step()
            times[name] = timer.elapsed_s
    times["step"] = step.elapsed_s
    if work.run.mode == "forward-backward":
        work.model.zero_grad(set_to_none=True)  # untimed: each step starts without gradients, as a train step does
    return times


def warm_up(work: Workload, of: str = "") -> tuple[dict[str, Any], float | None]:
    """Untimed: the compile step (compile_s) and the warm-up steps -> (the record so far, the last warm-up step's s)."""
    record: dict[str, Any] = {"environment": environment(work.device), "load": {"before": machine_load(work.device)},
                              "model_num_params": sum(p.numel() for p in work.model.parameters())}  # as built
    if work.run.compile:  # the first call compiles (forward, and backward on the first backward)
        phase(f"compiling (first step){of}")
        _, record["compile_s"] = SyncTimer(work.device).time(work.step)
    last_s = None
    with annotate("warmup"):
        for i in range(work.run.warmup):
            phase(f"warm-up {i + 1}/{work.run.warmup}{of}")
            last_s = work.step()["step"]
    return record, last_s


def with_samples(work: Workload, record: dict[str, Any], samples: list[dict[str, float]]) -> dict[str, Any]:
    """The record after the timed steps: `<phase>_ms` samples (ms, in step order), the load, the `after` fields."""
    record.update({f"{key}_ms": [s[key] * 1e3 for s in samples] for key in samples[0]})
    record["load"]["after"] = machine_load(work.device)
    return {**record, **work.after(record)}


def measure(work: Workload) -> dict[str, Any]:
    """One configuration: compile step and warm-up (untimed), the peak counter reset, the timed steps, the peaks."""
    record, _ = warm_up(work)
    reset_peak_memory(work.device)
    samples = []
    with work.profiler, annotate("measure"):
        for i in range(work.run.steps):
            with timed_phase(f"step {i + 1}/{work.run.steps}"):  # the progress heartbeat stays quiet inside
                samples.append(work.step())
    phase("after the timed steps")
    return with_samples(work, {**record, **peak_memory_bytes(work.device)}, samples)


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
    return records


def allocated_bytes(device: torch.device) -> int:
    """Bytes of live tensors on a CUDA device now (a CPU has no allocator counter: 0)."""
    return torch.cuda.memory_allocated(device) if device.type == "cuda" else 0


def run_config(run: RunConfig) -> dict[str, Any]:
    """One configuration alone, in a child process of the sweep (which makes a failure its row)."""
    return measure(Workload(run))


def measure_together(runs: list[RunConfig]) -> list[dict[str, Any]]:
    """The variants of one comparison in one child process, their timed steps interleaved."""
    return measure_interleaved(resolve_device(runs[0].device), [functools.partial(Workload, r) for r in runs])


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


def derive_figures(run: RunConfig, record: dict[str, Any], peak_override: float | None = None) -> dict[str, Any]:
    """Statistics per phase, noisy flags, tokens/s, FLOPs, achieved TFLOP/s and MFU of a finished record."""
    phases = PHASES_BY_MODE[run.mode] + ("step",)
    out = {f"{p}_ms_{stat}": value for p in phases for stat, value in summarize(record[f"{p}_ms"]).items()}
    out["noisy"] = [f"{p} {out[f'{p}_ms_cv']:.0%}" for p in phases
                    if out[f"{p}_ms_cv"] is not None and out[f"{p}_ms_cv"] > NOISY_CV]
    if out["step_ms_n"] < 2:
        out["note"] = "1 timed step: no std"
    step_s = out["step_ms_mean"] / 1e3  # under --parallel: the slowest rank's step, what the global step costs
    out["tokens_per_s"] = run.batch_size * run.context_length * run.world_size / step_s  # the global batch
    # FLOPs of one global step: the formula for our architecture, FlopCounterMode's count, or none
    flops = (results.step_flops(run.model, run.batch_size, run.context_length, run.mode) if run.flops == "formula"
             else record["counted_step_flops"] if run.flops == "counted" else None)
    flops = flops and flops * run.world_size
    out.update(step_flops=flops, flops_source=run.flops, achieved_tflops=None, peak_tflops=None, peak_source=None,
               mfu_precision=None, mfu=None)
    if flops is None:  # no FLOPs, so no TFLOP/s and no MFU rather than a formula for another model
        return out
    env = record["environment"]
    precision = matmul_precision_key(run.dtype, bool(env.get("tf32_matmul")))
    peak, label = ((peak_override, "--peak-tflops") if peak_override is not None
                   else peak_tflops(env["device_name"], precision) if env["device"].startswith("cuda")
                   else (None, None))  # a CPU has no entry in the peak table: no MFU rather than a guess
    achieved = flops / step_s / 1e12
    out.update(achieved_tflops=achieved, peak_tflops=peak, peak_source=label, mfu_precision=precision,
               mfu=achieved / (peak * run.world_size) if peak else None)  # N GPUs: N x the peak
    return out


def finish_record(run: RunConfig, record: dict[str, Any], args: argparse.Namespace) -> None:
    """A row's derived figures and status; the predicted state per rank (--parallel); the search's settings."""
    if run.parallel:
        record["predicted"] = parallel.state_bytes_per_rank(run.model, run.parallel, run.world_size, run.mode)
    if finished(record):
        record.update(derive_figures(run, record, args.peak_tflops))
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


# ---------------------------------------------------------------- leaderboard

SCALED = ModelConfig(d_model=128, d_ff=344, num_layers=2, num_heads=2, vocab_size=1024, context_length=128)  # CPU
WALL_LIMIT_S = 600.0  # the leaderboard's run must finish within 10 minutes from empty caches
# The behaviour check: both models at this shape, the reference in fp32, yours under bf16 autocast as timed
CHECK_MODEL = ModelConfig(d_model=128, d_ff=344, num_layers=2, num_heads=2, vocab_size=512, context_length=128)
CHECK_BATCH = 2
# max ||yours - reference|| / ||reference|| per tensor (logits, loss, each gradient) that passes: our own model
# under bf16 autocast reaches 1.3e-2 (the worst gradient) against itself in fp32 at CHECK_MODEL
CHECK_TOLERANCE = 3e-2
# and for the parameters' change in one optimizer step from the same weights and gradients: a missing weight decay
# is 1e-2 off (on the norms' weights), AdamW's moments kept in bf16 about 2e-3
STEP_TOLERANCE = 5e-3
STAFF_MODEL = "cs336_basics.model:BasicsTransformerLM"
# AdamW's first step with its epsilon placed either way: torch's adds it to the bias-corrected sqrt(v); assignment
# 1's Algorithm 1 (the staff cs336_basics.optimizer.AdamW) to sqrt(v), the correction folded into the step size,
# which is torch's with epsilon / sqrt(1 - beta2 ** t), t = 1. Near-zero gradients tell the two apart by ~3%.
STEP_REFERENCES = {
    "torch.optim.AdamW": lambda params: torch.optim.AdamW(params, **ADAMW_SETTINGS),
    "Algorithm 1 of assignment 1": lambda params: torch.optim.AdamW(
        params, **ADAMW_SETTINGS | {"eps": ADAMW_SETTINGS["eps"] / math.sqrt(1 - ADAMW_SETTINGS["betas"][1])}),
}


def leaderboard_run(parser: argparse.ArgumentParser, args: argparse.Namespace) -> RunConfig:
    """--leaderboard: the one configuration (full on CUDA or when asked, else scaled), batch 2 over all ranks,
    bf16 autocast, train; a full shape whose training state cannot fit in the free memory is refused."""
    device = common.device_or_exit(parser, args.device)
    unused = [flag for given, flag in (
        (args.timeout is not None, "--timeout"), (args.in_process, "--in-process"), (args.no_skip, "--no-skip"),
        (args.repeats > 1 or args.interleave != "steps", "--interleave runs, --repeats"), (args.profile, "--profile"),
        (args.nvtx, "--nvtx"), (args.plot, "--plot"), (args.flops not in (None, "formula"), "--flops"),
        (args.no_grad, "--no-grad"), (args.tf32 is not None, "--tf32"), (args.columns is not None, "--columns"),
        (args.max_context is not None, "--max-context")) if given]
    results.refuse(parser, [
        (bool(unused), f"--leaderboard runs one fixed step and report: drop {', '.join(unused)}"),
        (args.size is not None, "--leaderboard fixes the shape: change it with --d-model, --d-ff, --num-layers, "
                                "--num-heads, --vocab-size, --context-length or --batch-size, not --size"),
        (args.mode != "train", "--leaderboard times a training step: drop --mode"),
        (len(args.model) > 1 or len(args.optimizer) > 1 or len(args.warmup) > 1 or len(args.dtype) > 1
         or len(args.context_length or []) > 1 or len(args.compile or []) > 1,
         "--leaderboard times one configuration: give --model, --optimizer, --warmup, --dtype, --context-length "
         "and --compile one value each"),
        (args.dtype != ["fp32"] and args.dtype != ["bf16"], "--leaderboard runs bf16 autocast: drop --dtype"),
        ("max" in (args.context_length or []), "--leaderboard takes a number for --context-length")])
    world_size = parallel.check_parallel_args(parser, args, device)
    full = args.leaderboard == "full" or (args.leaderboard == "auto" and device.type == "cuda")
    args.leaderboard = "full" if full else "scaled"
    dims = {k: getattr(args, k) for k in ("d_model", "d_ff", "num_layers", "num_heads", "vocab_size")}
    dims["context_length"] = (args.context_length or [None])[0]
    try:
        cfg = dataclasses.replace(LEADERBOARD if full else SCALED, **{k: v for k, v in dims.items() if v})
    except results.ConfigError as exc:
        parser.error(str(exc))
    batch = args.batch_size or LEADERBOARD_BATCH
    if batch % world_size:
        parser.error(f"--leaderboard: the batch of {batch} does not split over {world_size} ranks")
    on_cuda = device.type == "cuda"
    args.rep_ms = args.rep_ms or (30_000.0 if on_cuda else 500.0)
    args.warmup_ms = args.warmup_ms or (10_000.0 if on_cuda else 100.0)
    name, spec = args.model[0]
    run = RunConfig(size=f"leaderboard-{args.leaderboard}", model=cfg, batch_size=batch // world_size,
                    warmup=args.warmup[0], steps=args.steps, dtype="bf16", compile=args.compile != ["off"],
                    attn=(args.attn or ["naive"])[0],
                    optimizer=args.optimizer[0], model_factory=common.model_factory(spec), model_name=name,
                    device=args.device, seed=args.seed, parallel=(args.parallel or [None])[0],
                    world_size=world_size, fsdp_mixed_precision=args.fsdp_mixed_precision[0],
                    reshard_after_forward=args.reshard_after_forward[0] == "on", pg_timeout_s=args.pg_timeout)
    if not args.dry_run:
        state = parallel.state_bytes_per_rank(cfg, run.parallel, world_size, "train")["state_bytes"]
        if on_cuda and not run.parallel:  # one process may spread its model over every GPU it sees
            devices = [torch.device("cuda", i) for i in range(torch.cuda.device_count())]
        else:
            devices = [parallel.rank_device(device, parallel.torchrun_launch())]
        free = sum(bench_attention.free_memory_bytes(d) or 0 for d in devices)
        if free and state > free:
            parser.error(f"--leaderboard {args.leaderboard}: the training state alone needs {state / GIB:.1f} GiB per "
                         f"device ({state_counted(cfg)}) and {'+'.join(map(str, devices))} has {free / GIB:.1f} "
                         "GiB free: spread it (torchrun ... --parallel fsdp) or cut --num-layers")
    return run


def state_counted(cfg: ModelConfig) -> str:
    return (f"model.TransformerLM's {cfg.num_params:,} parameters x (4 weights + 4 grads + 8 AdamW) bytes, fp32 "
            "master weights; activations not counted")


def relative_error(x: torch.Tensor | None, reference: torch.Tensor) -> float:
    """||x - reference|| / ||reference|| in float64; inf for a missing or non-finite x."""
    if x is None:
        return math.inf
    diff = (x.detach().double().to(reference.device) - reference.detach().double()).norm()
    return float((diff / reference.detach().double().norm().clamp_min(1e-30)).nan_to_num(math.inf))


def behaviour_check(factory: str | None, param_map: str | None, device: torch.device, seed: int = 0,
                    optimizer: str = "ours") -> dict:
    """Your model against the reference (the staff model when cs336_basics imports, else ours) at CHECK_MODEL:
    your parameters get the reference's values (by name, through param_map when given), both run the same tokens,
    the reference in fp32, yours under bf16 autocast; logits, loss and every gradient are compared. Then your
    optimizer (as build_optimizer makes it) takes one step from the reference's weights and gradients, and each
    parameter's change is compared with AdamW's, its epsilon placed either way (STEP_REFERENCES)."""
    reference_spec = STAFF_MODEL if importlib.util.find_spec("cs336_basics") else None
    torch.manual_seed(seed)
    with device:
        reference = build_model(CHECK_MODEL, factory=reference_spec)
        yours = build_model(CHECK_MODEL, factory=factory)
    out = {"reference": reference_spec or "ours", "tolerance": CHECK_TOLERANCE,
           "shape": dataclasses.asdict(CHECK_MODEL)}
    ref_params, your_params = dict(reference.named_parameters()), dict(yours.named_parameters())
    names = common.load(param_map)(yours) if param_map else {n: n for n in your_params}
    unmatched = [n for n in your_params if names.get(n) not in ref_params]
    uncovered = sorted(set(ref_params) - {names.get(n) for n in your_params})
    misshapen = [n for n in your_params if n not in unmatched and your_params[n].shape != ref_params[names[n]].shape]
    if unmatched or uncovered or misshapen:
        problem = (f"{', '.join(unmatched[:3])} match no reference parameter" if unmatched else
                   f"nothing of yours maps to {', '.join(uncovered[:3])}" if uncovered else
                   f"{misshapen[0]} is {tuple(your_params[misshapen[0]].shape)}, the reference's "
                   f"{tuple(ref_params[names[misshapen[0]]].shape)}")
        return {**out, "ok": False, "problem": f"parameters: {problem} (map your names with --param-map)"}
    with torch.no_grad():
        for n, p in your_params.items():
            p.copy_(ref_params[names[n]])
    tokens, targets = (torch.randint(0, CHECK_MODEL.vocab_size, (CHECK_BATCH, CHECK_MODEL.context_length),
                                     device=device) for _ in range(2))
    ref_logits = reference(tokens)
    ref_loss = cross_entropy(ref_logits, targets)
    ref_loss.backward()
    with precision_context(device, "bf16"):
        logits = yours(tokens)
        loss = cross_entropy(logits.to(device), targets)
    loss.backward()
    errors = {"logits": relative_error(logits, ref_logits), "loss": relative_error(loss, ref_loss)}
    errors.update({f"grad {names[n]}": relative_error(p.grad, ref_params[names[n]].grad)
                   for n, p in your_params.items()})

    def one_step(make: Callable) -> list[torch.Tensor]:
        params = [torch.nn.Parameter(p.detach().clone()) for p in ref_params.values()]
        for p, ref in zip(params, ref_params.values()):
            p.grad = ref.grad.clone()
        make(params).step()
        return [p.detach() - ref.detach() for p, ref in zip(params, ref_params.values())]
    step = one_step(lambda params: build_optimizer(optimizer, params, device))
    steps = {name: {f"step of {n}": relative_error(a, b) for n, a, b in zip(ref_params, step, one_step(make))}
             for name, make in STEP_REFERENCES.items()}
    matched = min(steps, key=lambda name: max(steps[name].values()))
    errors.update(steps[matched])
    tolerance = {k: STEP_TOLERANCE if k.startswith("step of") else CHECK_TOLERANCE for k in errors}
    worst = max(errors, key=lambda k: errors[k] / tolerance[k])
    out.update(ok=errors[worst] <= tolerance[worst], worst=worst, max_error=errors[worst], errors=errors,
               step_tolerance=STEP_TOLERANCE, step_reference=matched)
    # yours is built with the settings it names (model.ADAMW_SETTINGS); others keep its own defaults
    against = (f"AdamW({', '.join(f'{k}={v}' for k, v in ADAMW_SETTINGS.items())}) as {' or as '.join(STEP_REFERENCES)}"
               if worst.startswith("step of") else out["reference"])
    return out if out["ok"] else {**out, "problem": f"{worst} off by {errors[worst]:.1e} (relative; tolerance "
                                                    f"{tolerance[worst]:.0e}) against {against}"}


def leaderboard_measure(args: argparse.Namespace, run: RunConfig, device: torch.device,
                        started: float) -> dict[str, Any]:
    """The check, then do_bench of the leaderboard's step (the headline, and the wall time so far), then --steps
    steps with each phase synchronised apart (the split, peak memory, MFU)."""
    phase("the behaviour check")
    record: dict[str, Any] = {"check": behaviour_check(run.model_factory, args.param_map, device, run.seed,
                                                              run.optimizer)}
    if not record["check"]["ok"]:
        return {**record, "status": f"WRONG: {record['check']['problem']}"}
    work = Workload(run)

    def agree(n: int) -> int:  # under torchrun: the ranks' largest call count, so all run as many collectives
        count = torch.tensor([n], device=device)
        torch.distributed.all_reduce(count, op=torch.distributed.ReduceOp.MAX)
        return int(count.item())

    cuda = [torch.device("cuda", i) for i in range(torch.cuda.device_count())] if device.type == "cuda" else []
    for d in cuda:
        torch.cuda.reset_peak_memory_stats(d)
    phase(f"do_bench (warmup {args.warmup_ms:g} ms, rep {args.rep_ms:g} ms)")
    record["leaderboard"] = bench_attention.leaderboard_time(work.untimed_step, device, args.warmup_ms, args.rep_ms,
                                                             agree=agree if run.parallel else None)
    record["wall_s"] = time.perf_counter() - started
    record["over_10_min"] = record["wall_s"] > WALL_LIMIT_S
    record["peak_mem_by_device"] = {str(d): torch.cuda.max_memory_allocated(d) for d in cuda
                                    if torch.cuda.max_memory_allocated(d)}
    record.update(measure(work))
    record.update(derive_figures(run, record, args.peak_tflops))
    if record["mfu"]:  # MFU on do_bench's step time rather than the split's
        record["leaderboard"]["mfu"] = record["mfu"] * record["step_ms_mean"] / record["leaderboard"]["ms"]
    return {**record, "status": "noisy" if record["noisy"] else "ok"}


def leaderboard(args: argparse.Namespace, run: RunConfig, started: float) -> int:
    """--leaderboard in this process (every rank under torchrun, in one process group): 1 when WRONG or failed."""
    if args.dry_run:  # the shape, and the predicted training state per device: this layout, and one or two GPUs
        layouts = [(run.parallel, run.world_size), (None, 1), ("ddp", 2), ("fsdp", 2)]
        rows = [{"layout": f"{p} x{w}" if p else "one process", "state per device GiB":
                 parallel.state_bytes_per_rank(run.model, p, w, "train")["state_bytes"] / GIB}
                for p, w in dict.fromkeys(layouts)]
        if parallel.is_rank_zero():
            print(f"{report.leaderboard_header(dataclasses.asdict(run))}\n\n"
                  f"predicted training state per device ({state_counted(run.model)}):\n\n"
                  f"{results.render_table(rows, ['layout', 'state per device GiB'], args.fmt)}\n\n"
                  "nothing was built, run or written (drop --dry-run to run it)")
        return 0
    device = parallel.rank_device(resolve_device(run.device), parallel.torchrun_launch() if run.parallel else None)
    group = (parallel.configuration_group("leaderboard/", device, run.pg_timeout_s) if run.parallel
             else contextlib.nullcontext())
    record = {"experiment": "leaderboard-2026", "config": dataclasses.asdict(run), "label": run.label(),
              "environment": environment(device)}
    caches = tempfile.TemporaryDirectory(prefix="leaderboard-cache-", ignore_cleanup_errors=True)
    cold = {name: os.path.join(caches.name, name.split("_")[0].lower())  # empty, as in the leaderboard's run
            for name in ("TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR")}
    try:
        with caches, mock.patch.dict(os.environ, cold), group:
            record.update(leaderboard_measure(args, run, device, started))
    except (Exception, SystemExit) as exc:  # noqa: BLE001 - an OOM or your model's error (or exit) is the row
        record["status"] = common.failure_status(exc)
        if run.parallel:  # "OOM on rank 1", not rank 0's broken connection to it
            record["status"] = parallel.first_failure_status("leaderboard/", record["status"])
    if parallel.is_rank_zero():
        files = ResultFiles(args.results_dir, "e2e", args.out, "leaderboard")
        if published := report.publish("leaderboard-2026", [record], files, args.fmt, append=[record]):
            return published  # 130: Ctrl-C while the report was written
    return 0 if finished(record) else 1


def main(argv: list[str] | None = None) -> int:
    started = time.perf_counter()
    args, runs = parse_args(argv)
    if args.leaderboard:
        return leaderboard(args, runs[0], started)
    rank_zero = parallel.is_rank_zero()  # under torchrun only rank 0 prints and writes files
    if args.dry_run:
        if not rank_zero:
            return 0
        states = [parallel.state_bytes_per_rank(r.model, r.parallel, r.world_size, r.mode)["state_bytes"] for r in runs]
        labels = [f"{run.label()} (predicted state {state / GIB:.2f} GiB per rank, activations aside)"
                  for run, state in zip(runs, states)]
        return results.print_dry_run(labels, preamble=sizes_table([dataclasses.asdict(run) for run in runs], args.fmt),
                                 notes=plan_notes(runs, args), at_most=args.context_search)
    files = ResultFiles(args.results_dir, "e2e", args.out, "e2e") if rank_zero else None
    live = report.LiveReport("bench_e2e", args.columns)  # the .md and --fmt file, rewritten as rows finish
    plan = runs if args.context_search else runner.comparisons(runs, RunConfig.comparison_key)
    records, code = runner.run_configurations(
        run_config, plan, files, args, name="bench_e2e", device=resolve_device(args.device),
        finish=lambda run, record: finish_record(run, record, args), render=live,
        summary=lambda record: f"{record['step_ms_mean'] / 1e3:.3f} s/step",
        measure_variants=measure_together, resize=RunConfig.with_context, search=args.context_search)
    if records and rank_zero:  # each search's answer as a record after its probes, then the report and figures
        published = report.publish("bench_e2e", records, files, args.fmt, args.columns, plot=args.plot,
                                   append=context_searches(records))
        return code or published or runner.all_failed(records)  # an interrupted sweep says so first
    return code


if __name__ == "__main__":
    sys.exit(main())
