"""The Transformer-LM workload and how it is measured: what is timed.

- RunConfig: one configuration of the LM (size, context, mode, dtype, compile, attention, optimizer, ...).
- Workload: the model, optimizer and one random batch on a device, and the three phases of a training step.
- run_step: one step, each phase timed on its own (a device synchronisation at every phase boundary).
- measure_steps / measure: one configuration's measurement (compile step apart, warm-up, peak reset, timed steps,
  peaks, the machine's load before and after); measure_interleaved: the variants of one comparison in one process,
  each with its own compile, warm-up and memory figures, their timed steps alternating in rounds.

Running configurations (child processes, failures as rows, time limits, signals) is sweep.py's job; the statistics
of the samples (summaries, paired ratios) stats.py's. Nothing here does work at import time or changes global state
on import.
"""
from __future__ import annotations

import contextlib
import dataclasses
import inspect
import uuid
from dataclasses import dataclass, field
from typing import Any, Callable

import torch
import torch.nn as nn

import parallel
import user_code
from common import (SyncTimer, annotate, environment, machine_load, peak_memory_bytes, precision_context,
                    reset_peak_memory, resolve_device)
from isolation import phase, timed_phase
from model import TransformerLM, cross_entropy
from model_config import DEFAULT_BATCH_SIZE, DEFAULT_HANDOUT, PHASES_BY_MODE, ModelConfig
from optim import AdamW
from parallel import DEFAULT_PG_TIMEOUT_S
from stats import block_sizes, round_order, steps_per_block, summarize

# ---- the Transformer-LM workload (bench_e2e times it, mem_profile measures its memory) ----
# (MODES and PHASES_BY_MODE live in model_config.py, torch-free, where the reports read them too)


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
    # ours = optim.AdamW; torch = torch.optim.AdamW (fused on CUDA, foreach on CPU); yours = MODULE:CLASS
    optimizer: str = "ours"  # (build_optimizer)
    model_factory: str | None = None  # your model as MODULE:CALLABLE (build_model); None = ours, model.TransformerLM
    flops: str = "formula"  # bench_e2e's FLOPs: formula (our architecture), counted (FlopCounterMode) or none
    tf32: bool | None = None  # None = leave PyTorch's default
    device: str = "auto"
    seed: int = 0
    nvtx: bool = False
    checkpoint_every: int = 0
    profile_results_dir: str | None = None  # --profile: torch.profiler trace under <this>/profile/; None = off
    # --parallel (torchrun): each rank runs this configuration on its own batch of batch_size sequences
    parallel: str | None = None  # None = one process; "ddp" or "fsdp" (parallel.shard_model)
    world_size: int = 1  # ranks of the torchrun launch
    fsdp_mixed_precision: str = "off"  # fsdp: "bf16" = MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32)
    reshard_after_forward: bool = True  # fsdp: blocks free their gathered parameters after forward
    pg_timeout_s: float = DEFAULT_PG_TIMEOUT_S  # a collective waiting longer for a peer fails

    @property
    def context_length(self) -> int:
        return self.model.context_length

    def label(self) -> str:
        """The configuration as progress lines, snapshot titles and file names name it; settings at their
        default (no checkpointing, our AdamW, eager) are left out."""
        parts = [self.size, f"ctx={self.context_length}", self.mode + (" no-grad" if self.no_grad else ""),
                 self.dtype, self.model_factory or self.attn, f"warmup={self.warmup}"]
        if self.checkpoint_every:
            parts.append(f"ckpt={self.checkpoint_every}")
        if self.optimizer != "ours":
            parts.append(f"optimizer={self.optimizer}")
        if self.parallel:
            parts.append(f"{self.parallel} x{self.world_size}")
        if self.parallel == "fsdp" and self.fsdp_mixed_precision != "off":
            parts.append(f"{self.fsdp_mixed_precision}-params")
        if self.parallel == "fsdp" and not self.reshard_after_forward:
            parts.append("no-reshard")
        return " ".join(parts + (["compiled"] if self.compile else []))

    def skip_key(self) -> tuple[tuple, str, int]:
        """(group, size name, size) for the sweep's rule: after an OOM, the larger contexts of the same model and
        settings are skipped (they need more memory still)."""
        m = self.model
        group = (self.size, m.d_model, m.d_ff, m.num_layers, m.num_heads, m.vocab_size, self.batch_size, self.mode,
                 self.dtype, self.attn, self.checkpoint_every, self.optimizer, self.compile, self.parallel,
                 self.world_size, self.fsdp_mixed_precision, self.reshard_after_forward, self.model_factory)
        return group, "ctx", self.context_length

    def fault_fields(self) -> dict[str, Any]:
        """What a BENCH_INJECT_FAULT clause can match on (sweep.injected_fault)."""
        return {"size": self.size, "context_length": self.context_length, "dtype": self.dtype, "warmup": self.warmup,
                "parallel": self.parallel, "mode": self.mode, "compile": self.compile, "attn": self.attn,
                "optimizer": self.optimizer, "checkpoint": self.checkpoint_every}

    def comparison_key(self) -> RunConfig | None:
        """This configuration with its variant fields (dtype, compile, attn, optimizer) blanked: the runs that share
        it are the variants of one comparison, which the sweep measures together. None when a variant must run
        alone: under --parallel (each needs its own process group) and with --profile or --nvtx (a profile holds
        one variant)."""
        if self.parallel or self.profile_results_dir is not None or self.nvtx:
            return None
        return dataclasses.replace(self, dtype="", compile=False, attn="", optimizer="")

    def with_context(self, context_length: int) -> RunConfig:
        """The same configuration at another context length (a search's next probe)."""
        return dataclasses.replace(self, model=dataclasses.replace(self.model, context_length=context_length))


# The staff model's constructor keywords (cs336_basics.model.BasicsTransformerLM), each a ModelConfig field: what
# --model MODULE:CALLABLE is called with.
STAFF_MODEL_KEYWORDS = ("vocab_size", "context_length", "d_model", "num_layers", "num_heads", "d_ff", "rope_theta")


def build_model(cfg: ModelConfig, attn: str = "naive", checkpoint_every: int = 0,
                factory: str | None = None) -> nn.Module:
    """Ours (model.TransformerLM, with its attention and checkpointing), or yours: `factory` (MODULE:CALLABLE)
    called with the staff constructor's keywords, so cs336_basics.model:BasicsTransformerLM works unchanged. Built
    on the current default device (Workload: the run's; mem_profile: meta). A factory that cannot take those
    keywords, or returns something that is not an nn.Module, is a LoadError (one line, the row's status)."""
    if factory is None:
        return TransformerLM(cfg, attn=attn, checkpoint_every=checkpoint_every)
    make = user_code.load(factory)
    keywords = {name: getattr(cfg, name) for name in STAFF_MODEL_KEYWORDS}
    try:
        inspect.signature(make).bind(**keywords)
    except TypeError as exc:
        raise user_code.LoadError(f"{factory} cannot be called with the staff model's keywords "
                                  f"({', '.join(STAFF_MODEL_KEYWORDS)}): {exc}") from None
    except ValueError:  # no signature to read (a builtin): let the call say
        pass
    model = make(**keywords)
    if not isinstance(model, nn.Module):
        raise user_code.LoadError(f"{factory} returned a {type(model).__name__}, not a torch.nn.Module")
    return model


def check_logits(logits: Any, run: RunConfig) -> None:
    """Your model must map token ids (batch, seq) to logits (batch, seq, vocab): the loss and every figure assume
    it. A ValueError naming the model otherwise (checked once, on the first forward)."""
    expected = (run.batch_size, run.context_length, run.model.vocab_size)
    if isinstance(logits, torch.Tensor) and tuple(logits.shape) == expected and logits.is_floating_point():
        return
    got = f"{tuple(logits.shape)} {logits.dtype}" if isinstance(logits, torch.Tensor) else f"a {type(logits).__name__}"
    raise ValueError(f"{run.model_factory or 'the model'} returned {got} for token ids {expected[:2]}; expected "
                     f"floating-point logits (batch, seq, vocab) = {expected}")


USER_OPTIMIZER_LR = 1e-3  # what ours and torch's AdamW default to: the step's cost does not depend on it


def build_optimizer(name: str, params: Any, device: torch.device) -> torch.optim.Optimizer:
    """ours = optim.AdamW; torch = torch.optim.AdamW (fused on CUDA, foreach on CPU); else yours, MODULE:CLASS,
    constructed as CLASS(params, lr=1e-3) (or CLASS(params) when it takes no lr)."""
    if name == "ours":
        return AdamW(params)
    if name == "torch":
        return (torch.optim.AdamW(params, fused=True) if device.type == "cuda"
                else torch.optim.AdamW(params, foreach=True))
    make = user_code.load(name)
    try:
        takes_lr = "lr" in inspect.signature(make).parameters
    except (TypeError, ValueError):
        takes_lr = True
    optimizer = make(params, lr=USER_OPTIMIZER_LR) if takes_lr else make(params)
    if not (callable(getattr(optimizer, "step", None)) and callable(getattr(optimizer, "zero_grad", None))):
        raise user_code.LoadError(f"{name} made a {type(optimizer).__name__}, which has no step() and zero_grad()")
    return optimizer


class Workload:
    """Model, optimizer, one random batch and the three phases of a training step, set up on a device.

    forward() is the model call plus the loss; backward() is loss.backward() (through the gradient scaler for
    fp16); optimizer_step() is step() plus zero_grad(set_to_none=True).

    With run.parallel, this process is one rank of a process group already joined (parallel.configuration_group):
    the device is the GPU of its local rank, the model (the same initial weights on every rank) is wrapped in DDP
    or sharded with FSDP2, and the batch is this rank's own, so the global batch is world_size x batch_size."""

    def __init__(self, run: RunConfig):
        phase("building the model")
        self.run = run
        launch = parallel.torchrun_launch() if run.parallel else None
        self.device = parallel.rank_device(resolve_device(run.device), launch)
        if run.tf32 is not None:
            torch.backends.cuda.matmul.allow_tf32 = run.tf32
            torch.backends.cudnn.allow_tf32 = run.tf32
        torch.manual_seed(run.seed)
        with self.device:  # initialise directly on the device: CPU init of a 2.7B model takes minutes
            self.model = build_model(run.model, run.attn, run.checkpoint_every, run.model_factory)
        wrapped = self.model
        if run.parallel:
            wrapped = parallel.shard_model(self.model, run.parallel, self.device, run.fsdp_mixed_precision,
                                           run.reshard_after_forward)
            torch.manual_seed(run.seed + 1 + launch.rank)  # each rank its own batch
        self.callable_model = torch.compile(wrapped) if run.compile else wrapped
        self.tokens = torch.randint(0, run.model.vocab_size, (run.batch_size, run.context_length), device=self.device)
        self.targets = torch.randint(0, run.model.vocab_size, (run.batch_size, run.context_length), device=self.device)
        self.optimizer = (build_optimizer(run.optimizer, self.model.parameters(), self.device)
                          if run.mode == "train" else None)
        self.logits_checked = run.model_factory is None  # ours is known to be right; yours is checked once
        # fp16 gradients underflow without loss scaling; bf16 has fp32's exponent range and needs none
        self.scaler = torch.amp.GradScaler(self.device.type) if run.dtype == "fp16" and run.mode != "forward" else None

    def forward(self, eager: bool = False) -> torch.Tensor:
        """The loss of the batch; `eager`: through the model itself, not torch.compile's or DDP's wrapper."""
        grad_mode = torch.inference_mode() if self.run.no_grad else torch.enable_grad()
        with grad_mode, precision_context(self.device, self.run.dtype):
            logits = (self.model if eager else self.callable_model)(self.tokens)
            if not self.logits_checked:  # a shape and a dtype, no synchronisation
                check_logits(logits, self.run)
                self.logits_checked = True
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
    phase and for the whole step. `on_phase(name)` is called (outside the phases' timers, inside the step's) before
    each phase and with "end" after the last; mem_profile uses it to mark phases in a memory timeline, whose
    steps are not the timings it reports."""
    device = work.device
    times: dict[str, float] = {}
    phases = PHASES_BY_MODE[work.run.mode]
    with SyncTimer(device) as step_timer:
        for name in phases:
            if on_phase:
                on_phase(name)
            with annotate(name), SyncTimer(device) as timer:
                if name == "forward":
                    loss = work.forward()
                elif name == "backward":
                    work.backward(loss)
                else:
                    work.optimizer_step()
            times[name] = timer.elapsed_s
        if on_phase:
            on_phase("end")
    times["step"] = step_timer.elapsed_s
    if work.run.mode == "forward-backward":
        work.zero_grad()
    return times


# ---- one configuration: what is measured ----


@dataclass
class Prepared:
    """A configuration built and ready to be timed (a script's prepare(run) makes it): what measure() and
    measure_interleaved() need of it."""

    step: Callable[[], dict[str, float]]  # one step, timed inside (run_step): seconds per phase and for the step
    device: torch.device
    warmup: int
    steps: int
    compile_first: bool = False  # the first step compiles: timed apart as compile_s
    profiler: contextlib.AbstractContextManager = field(default_factory=contextlib.nullcontext)  # around timed steps
    after: Callable[[dict[str, Any]], dict[str, Any]] | None = None  # untimed, after the timed steps: more fields


def measure_steps(step: Callable[[], dict[str, float]], device: torch.device, warmup: int, steps: int,
                  compile_first: bool = False,
                  profiler: contextlib.AbstractContextManager = contextlib.nullcontext()) -> dict[str, Any]:
    """The measurement every script makes of a configuration whose workload is built: (when compiling) the first
    step timed apart as compile_s, `warmup` untimed steps, the peak counter reset, `steps` timed steps (each
    returns seconds per phase), the peaks read. Returns the record: raw samples as `<phase>_ms` lists, the
    environment, and on CUDA peak allocated / reserved bytes. `profiler` is entered around the timed steps."""
    record: dict[str, Any] = {"environment": environment(device)}
    record.update(compile_and_warm_up(step, device, warmup, compile_first)[0])
    reset_peak_memory(device)
    samples: list[dict[str, float]] = []
    with profiler, annotate("measure"):
        for i in range(steps):
            with timed_phase(f"step {i + 1}/{steps}"):  # no heartbeat runs inside: see isolation.Heartbeat
                samples.append(step())
    phase("after the timed steps")
    record.update(peak_memory_bytes(device))
    record.update(samples_by_phase(samples))
    return record


def compile_and_warm_up(step: Callable[[], dict[str, float]], device: torch.device, warmup: int,
                        compile_first: bool, of: str = "") -> tuple[dict[str, float], float | None]:
    """Untimed but for compile_s: (when compiling) the first step timed apart, its compile, then `warmup` steps.
    Returns ({"compile_s": ...} or {}, the last warm-up step's seconds or None); `of` names a variant in the
    progress phases."""
    compiled = {}
    if compile_first:  # the first call compiles (forward, and backward on the first backward)
        phase(f"compiling (first step){of}")
        _, compiled["compile_s"] = SyncTimer(device).time(step)
    last_s = None
    with annotate("warmup"):
        for i in range(warmup):
            phase(f"warm-up {i + 1}/{warmup}{of}")
            last_s = step()["step"]
    return compiled, last_s


def samples_by_phase(samples: list[dict[str, float]]) -> dict[str, list[float]]:
    """Steps' seconds per phase as the record keeps them: `<phase>_ms` lists of milliseconds, in step order."""
    return {f"{key}_ms": [s[key] * 1e3 for s in samples] for key in samples[0]} if samples else {}


def measure(p: Prepared) -> dict[str, Any]:
    """One configuration alone: measure_steps, the load of the machine before and after it, then the untimed
    `after` fields."""
    load_before = machine_load(p.device)
    record = {**measure_steps(p.step, p.device, p.warmup, p.steps, p.compile_first, p.profiler)}
    record["load"] = {"before": load_before, "after": machine_load(p.device)}
    if p.after is not None:
        record.update(p.after(record))
    return record


# A block of one variant's consecutive timed steps lasts at least this long (unless that leaves fewer than 6
# rounds, stats.MIN_ROUNDS_FOR_INTERVAL): switching to another variant costs cold caches and another graph, and
# each CUDA synchronisation ~10 us.
MIN_BLOCK_S = 0.005


def measure_interleaved(device: torch.device, preparers: list[Callable[[], Prepared]],
                        around: list[contextlib.AbstractContextManager] | None = None) -> list[dict[str, Any]]:
    """The variants of one comparison in this process, so that whatever the machine does meanwhile falls on every
    side alike. Each variant is built (preparers[i]()), compiled (its first step timed apart as compile_s) and
    warmed up in turn, as measure_steps does alone; then the timed steps alternate in rounds, one block of steps
    of every variant per round, in the order stats.round_order gives (A B | B A | ...), blocks as long as
    steps_per_block makes them. Returns one record per variant, in order: its own samples, compile time, load and
    memory figures, and its `pairing` (the group, and which of its samples came from which round).

    On CUDA a variant's peak is the one it would have alone: its own resident bytes (what it holds between steps,
    read after its warm-up) plus the most its steps allocated above the level at each block's start; the reserved
    bytes are shared by the variants and not given. `around[i]` is entered around variant i's timed blocks (the
    sweep's `slow:` fault)."""
    around = around or [contextlib.nullcontext() for _ in preparers]
    records: list[dict[str, Any] | None] = [None] * len(preparers)
    turns: list[tuple[int, Prepared, int]] = []  # (index, prepared, resident bytes), the variants that are timed
    warmup_times: list[float | None] = []  # seconds of each timed variant's last warm-up step
    for i, prepare in enumerate(preparers):
        level = allocated_bytes(device)
        phase(f"building variant {i + 1}/{len(preparers)}")
        p = prepare()
        if not isinstance(p.profiler, contextlib.nullcontext):
            raise ValueError("a profiler holds one variant: profile each variant alone")
        record = {"environment": environment(device), "load": {"before": machine_load(device)}}
        compiled, last_warmup_s = compile_and_warm_up(p.step, device, p.warmup, p.compile_first, f" of variant {i + 1}")
        records[i] = {**record, **compiled}
        turns.append((i, p, allocated_bytes(device) - level))
        warmup_times.append(last_warmup_s)
    steps = turns[0][1].steps
    # the fastest variant sets the block: every variant's block then lasts at least MIN_BLOCK_S
    block = steps_per_block(None if None in warmup_times else min(warmup_times), steps, MIN_BLOCK_S)
    sizes = block_sizes(steps, block)
    samples: list[list[dict[str, float]]] = [[] for _ in turns]
    rounds: list[list[list[int]]] = [[] for _ in turns]
    peaks: list[int | None] = [None for _ in turns]
    with annotate("measure"):
        for r, size in enumerate(sizes):
            for position in round_order(len(turns), r):
                i, p, resident = turns[position]
                start = len(samples[position])
                reset_peak_memory(device)
                level = allocated_bytes(device)
                with around[i]:
                    for s in range(size):
                        with timed_phase(f"round {r + 1}/{len(sizes)}, variant {i + 1}, step {s + 1}/{size}"):
                            samples[position].append(p.step())
                rounds[position].append([start, start + size])
                if device.type == "cuda":  # the block's own peak above its start, plus what this variant holds
                    peak = peak_memory_bytes(device)["peak_mem_allocated_bytes"] - level + resident
                    peaks[position] = max(peaks[position] or 0, peak)
    phase("after the timed steps")
    group = uuid.uuid4().hex[:12]
    for position, (i, p, resident) in enumerate(turns):
        record = records[i]
        record.update(samples_by_phase(samples[position]))
        if peaks[position] is not None:
            record["peak_mem_allocated_bytes"] = peaks[position]
        record["pairing"] = {"group": group, "mode": "steps", "position": position, "variants": len(turns),
                             "steps_per_block": block, "rounds": rounds[position]}
        record["load"]["after"] = machine_load(device)
        if p.after is not None:
            record.update(p.after(record))
    return records


def allocated_bytes(device: torch.device) -> int:
    """Bytes of live tensors on a CUDA device now (a CPU has no allocator counter: 0)."""
    return torch.cuda.memory_allocated(device) if device.type == "cuda" else 0


def sample_stats(record: dict[str, Any], phases: tuple[str, ...]) -> dict[str, Any]:
    """`<phase>_ms_<stat>` (mean, std, median, min, max, cv, n) of each phase's raw samples in a record."""
    return {f"{phase}_ms_{stat}": value for phase in phases for stat, value in summarize(record[f"{phase}_ms"]).items()}


ONE_SAMPLE_NOTE = "1 timed step: no std"
