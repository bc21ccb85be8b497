"""What does data parallelism cost, and is its communication hidden? Every variant trains the same model on the
same batch split over the ranks; after --check-steps steps its weights must equal one process training on the
whole batch (else the row is WRONG, naming the first parameter that differs); then the variants' steps are timed
in rounds (A B C | C B A ...), each rank is profiled, and its communication is split into what the step waits for
(exposed) and what runs behind compute (hidden).

    python3 bench_ddp.py --size tiny --device cpu              # 2 gloo processes on this CPU, every reference
    python3 bench_ddp.py --adapters tests.adapters             # your classes, through the course's adapter functions
    python3 bench_ddp.py --ddp mine=my_ddp:DDP --variants torch nocomm   # one class of yours beside torch's
    python3 bench_ddp.py --adapters tests.adapters --fsdp --variants nocomm   # your get_fsdp beside FSDP2
    torchrun --nproc-per-node 2 bench_ddp.py --size xl --context-length 512 --link-gbps 150   # the handout's run

The references, written plainly below: naive (an all-reduce per gradient after backward), flat (one all-reduce
of all gradients flattened), overlap (an asynchronous all-reduce per parameter as its gradient is ready, waited
for before the optimizer step), bucketed (--bucket-mb), torch (DistributedDataParallel) and nocomm (torch's DDP
with a communication hook that sends nothing: the same step without communication, so each variant's cost of
communicating is a difference measured in the same run); with --fsdp, torch's FSDP2 and your FSDP, checked on
their gathered weights, with memory per rank and each layer's all-gather against its compute. Each row is written
as it ends. docs/bench_ddp.md says how to read the tables.
"""
from __future__ import annotations

import argparse
import contextlib
import datetime
import functools
import gc
import inspect
import json
import math
import os
import re
import statistics
import sys
import tempfile
import traceback
import types
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors
from torch.profiler import record_function

import common
import kernel_tables
import parallel
import report
import results
import runner
from model import build_model, build_optimizer
from results import ModelConfig, progress

REFERENCES = ("naive", "flat", "overlap", "bucketed", "torch", "nocomm")
FSDP_KINDS = ("fsdp2", "fsdp")  # torch's FSDP2 (parallel.shard_model), your get_fsdp
BASELINE = "nocomm"
DEFAULT_BUCKETS_MB = (1.0, 10.0, 100.0, 1000.0)
CHECK_LR = 0.1  # SGD for the check: AdamW's update is blind to a gradient's scale (a sum instead of a mean)
ATOL, RTOL = 1e-6, 1e-4  # fp32 all-reduce sums in another order than one process does: ~1e-7 apart after 3 steps
ADAMW_CHECK_ATOL = 1e-4  # a tenth of AdamW's lr: a rank that skips its shard's update is off by ~lr a step
# the course's adapter functions (tests/adapters.py): 2026 v26.1.1, then 2025's two classes
ADAPTERS = {"ddp": ("get_ddp", "ddp_on_after_backward", None),
            "ddp_individual_parameters": ("get_ddp_individual_parameters",
                                          "ddp_individual_parameters_on_after_backward", None),
            "ddp_bucketed": ("get_ddp_bucketed", "ddp_bucketed_on_after_backward",
                             "ddp_bucketed_on_train_batch_start")}
FSDP_ADAPTERS = ("get_fsdp", "fsdp_on_after_backward", "fsdp_gather_full_params")
STUBS = {*(n for names in ADAPTERS.values() for n in names if n), *FSDP_ADAPTERS, "get_sharded_optimizer"}
NOT_WRITTEN = "not implemented yet"  # a row's status: the course ships each adapter as `raise NotImplementedError`


# --------------------------------------------------------------------------------------------- arguments


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = results.ArgParser(description=__doc__.split("\n\n")[0])
    results.add_size_args(p, "tiny")
    results.add_shape_args(p, "override the preset's {}")
    p.add_argument("--context-length", type=results.positive_int, default=None, help="default: the preset's")
    p.add_argument("--batch-size", type=results.positive_int, default=None,
                   help="the whole batch, split over the ranks (default: 2 sequences per rank)")
    results.add_device_args(p)
    p.add_argument("--world-size", type=results.positive_int, default=2,
                   help="processes this script starts (one per GPU on CUDA); under torchrun, its WORLD_SIZE")
    p.add_argument("--variants", nargs="+", choices=REFERENCES, default=list(REFERENCES),
                   help="the references to run (nocomm is the baseline the others' cost is measured against)")
    p.add_argument("--fsdp", action="store_true",
                   help="also FSDP: torch's FSDP2 (fsdp2) and, with --adapters, your get_fsdp (fsdp), checked on "
                        "the weights fsdp_gather_full_params gathers, with memory per rank against the prediction")
    p.add_argument("--bucket-mb", nargs="+", type=results.positive_float, default=list(DEFAULT_BUCKETS_MB),
                   help="bucket sizes of the bucketed reference and of your get_ddp_bucketed, in MB as torch's "
                        "DDP reads bucket_cap_mb: N x 2^20 bytes")
    p.add_argument("--adapters", metavar="MODULE", help="your tests/adapters.py as a module (tests.adapters), "
                   "imported from the current directory: its get_ddp / ddp_on_after_backward (2026), "
                   "get_ddp_individual_parameters, get_ddp_bucketed (2025) that are implemented")
    p.add_argument("--ddp", nargs="+", default=[], metavar="NAME=MODULE:CALLABLE",
                   type=common.named_or_spec([]), help="a DDP class of yours: CALLABLE(module) wraps the model; "
                   "its finish_gradient_synchronization(), if any, runs after backward")
    p.add_argument("--sharded-optimizer", metavar="[NAME=]MODULE:CALLABLE", type=common.named_or_spec([]),
                   help="your optimizer state sharding, called as CALLABLE(params, torch.optim.AdamW, lr=...) "
                        "(the course's get_sharded_optimizer; --adapters finds it there): memory at three points "
                        "and time per step, with it and with AdamW")
    p.add_argument("--check-steps", type=results.positive_int, default=3,
                   help="steps of the correctness check (SGD, lr 0.1) against one process on the whole batch")
    p.add_argument("--warmup", type=results.warmup_count, default=2, help="untimed steps per variant")
    p.add_argument("--steps", type=results.step_count, default=8, help="timed steps per variant, one per round")
    p.add_argument("--profile-steps", type=results.positive_int, default=2,
                   help="profiled steps per variant (the communication split comes from their traces)")
    p.add_argument("--link-gbps", default=None, metavar="GB_PER_S|measured",
                   help="the link's bus bandwidth in GB/s (gigabytes per second, as bench_comm and nccl-tests "
                        "report it): the floor column is the gradient bytes a rank sends over it; 'measured' (the "
                        "default when there is one): bench_comm's newest all_reduce run in --results-dir for this "
                        "backend and world size, its fit's beta x 2(n-1)/n where the fit is bandwidth-bound, else "
                        "the bus bandwidth of its largest size that took twice as long as every smaller one")
    p.add_argument("--pg-timeout", type=results.positive_float, default=120.0, metavar="SECONDS",
                   help="a collective waiting longer than this for a peer fails its variant")
    p.add_argument("--traces", action="store_true", help="keep every rank's profiler trace beside the results")
    p.add_argument("--plot", action="store_true", help="also draw each variant's profiled step as a timeline "
                   "(compute and communication lanes per rank, from the traces) into <stem>_timeline.png")
    p.add_argument("--seed", type=results.seed_int, default=0)
    results.add_output_args(p, "ddp-<UTC time>")
    args = p.parse_args(argv)
    results.handout_or_exit(p, args)
    size = results.sizes_or_exit(p, args, args.size or ["tiny"])
    results.refuse(p, [(len(size) != 1, "one --size at a time")])
    dims = {k: getattr(args, k) for k in (*results.SHAPE_FLAGS, "context_length")}
    try:
        args.model = results.get_config(size[0], args.handout, **dims)
    except results.ConfigError as exc:
        p.error(str(exc))
    args.size = size[0]
    launch = parallel.torchrun_launch()
    args.world_size = launch.world_size if launch else args.world_size
    args.batch_size = args.batch_size or 2 * args.world_size
    device = common.device_or_exit(p, args.device)
    results.refuse(p, [
        (args.world_size < 2, "data parallelism needs 2 or more ranks (--world-size, or torchrun's)"),
        (args.batch_size % args.world_size, f"--batch-size {args.batch_size} does not split over "
                                            f"{args.world_size} ranks"),
        (device.type == "cuda" and torch.cuda.device_count() < (launch.local_world_size if launch else
                                                                args.world_size),
         f"{args.world_size} ranks need as many GPUs; {torch.cuda.device_count()} visible")])
    args.device = device.type
    args.link_gbps, args.link_source = link_figure(p, args)
    args.variant_specs = variant_specs(p, args)
    if args.sharded_optimizer:
        try:
            common.load(args.sharded_optimizer.rpartition("=")[2])
        except common.LoadError as exc:
            p.error(f"--sharded-optimizer: {exc}")
    elif args.adapters and callable(getattr(sys.modules[args.adapters], "get_sharded_optimizer", None)):
        args.sharded_optimizer = f"{args.adapters}:get_sharded_optimizer"
    return args


@dataclass(frozen=True)
class Spec:
    """A variant by name: a reference of this script, or yours (adapter functions by name, or a class)."""
    name: str
    kind: str  # a reference, "adapter" or "class"
    make: str = ""  # MODULE:CALLABLE: the class, or the adapter function that wraps the model
    after_backward: str = ""
    batch_start: str = ""
    bucket_mb: float | None = None
    gather: str = ""  # fsdp_gather_full_params: your FSDP's full weights, for the check


def variant_specs(p: argparse.ArgumentParser, args: argparse.Namespace) -> list[Spec]:
    """The variants in the order they run: the references, then yours (the adapters that are there)."""
    specs, buckets = [], list(dict.fromkeys(args.bucket_mb))
    for name in dict.fromkeys(args.variants):
        if name == "bucketed":
            specs += [Spec(f"bucketed {mb:g} MB", name, bucket_mb=mb) for mb in buckets]
        else:
            specs.append(Spec(name, name))
    if args.adapters:
        try:
            module = adapters_module(args.adapters)
        except common.LoadError as exc:
            p.error(f"--adapters: {exc}")
        found = [(key, names) for key, names in ADAPTERS.items() if callable(getattr(module, names[0], None))]
        fsdp = args.fsdp and all(callable(getattr(module, name, None)) for name in FSDP_ADAPTERS)
        if not found and not fsdp:
            p.error(f"--adapters {args.adapters} ({module.__file__}) has none of "
                    f"{', '.join(names[0] for names in ADAPTERS.values())}")
        for key, (make, after, start) in found:
            sizes = buckets if key == "ddp_bucketed" else [None]
            start = f"{args.adapters}:{start}" if callable(getattr(module, start or "", None)) else ""
            specs += [Spec(key + (f" {mb:g} MB" if mb else ""), "adapter", f"{args.adapters}:{make}",
                           f"{args.adapters}:{after}", start, mb) for mb in sizes]
    if args.fsdp:
        specs.append(Spec("fsdp2", "fsdp2"))
        if args.adapters and fsdp:
            specs.append(Spec("fsdp", "fsdp", *(f"{args.adapters}:{name}" for name in FSDP_ADAPTERS[:2]),
                              gather=f"{args.adapters}:{FSDP_ADAPTERS[2]}"))
    for spec in args.ddp:
        name, _, target = spec.rpartition("=")
        try:
            common.load(target)
        except common.LoadError as exc:
            p.error(f"--ddp: {exc}")
        specs.append(Spec(name or target, "class", target))
    names = [s.name for s in specs]  # a row, a record and a trace each
    if twice := next((n for n in names if names.count(n) > 1), None):
        p.error(f"two variants named {twice!r}: give yours a name of its own (--ddp mine=MODULE:CALLABLE)")
    if not any(s.name != BASELINE for s in specs):
        p.error("nothing to measure besides the baseline: add --variants, --adapters or --ddp")
    return specs


def adapters_module(name: str) -> Any:
    """The student's adapters module, imported as --model imports (the current directory first)."""
    common.load(f"{name}:__name__")  # imports it, or a one-line LoadError
    return sys.modules[name]


# --------------------------------------------------------------------------------------------- build

# The references: each wraps the model, makes every rank start from rank 0's weights, and leaves the mean of the
# ranks' gradients in .grad once finish_gradient_synchronization() returns.


class Replicated(nn.Module):
    def __init__(self, module: nn.Module):
        super().__init__()
        self.module, self.world = module, dist.get_world_size()
        for tensor in [*module.parameters(), *module.buffers()]:
            dist.broadcast(tensor.data, src=0)

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return self.module(*args, **kwargs)

    def grads(self) -> list[torch.Tensor]:
        return [p.grad for p in self.module.parameters() if p.grad is not None]


class Naive(Replicated):
    """An all-reduce per gradient after backward: one collective per parameter, none overlapped."""

    def finish_gradient_synchronization(self) -> None:
        for grad in self.grads():
            dist.all_reduce(grad)
            grad.div_(self.world)


class Flat(Replicated):
    """One all-reduce of every gradient flattened into a buffer: one collective, none overlapped."""

    def finish_gradient_synchronization(self) -> None:
        grads = self.grads()
        flat = _flatten_dense_tensors(grads)
        dist.all_reduce(flat)
        flat.div_(self.world)
        for grad, reduced in zip(grads, _unflatten_dense_tensors(flat, grads)):
            grad.copy_(reduced)


class Overlap(Replicated):
    """An asynchronous all-reduce per parameter as soon as autograd has accumulated its gradient: the
    communication runs behind the rest of the backward pass; waited for before the optimizer step."""

    def __init__(self, module: nn.Module):
        super().__init__(module)
        self.pending: list[Any] = []
        for p in module.parameters():
            if p.requires_grad:
                p.register_post_accumulate_grad_hook(self._reduce)

    def _reduce(self, p: torch.Tensor) -> None:
        p.grad.div_(self.world)
        self.pending.append(dist.all_reduce(p.grad, async_op=True))

    def finish_gradient_synchronization(self) -> None:
        for work in self.pending:
            work.wait()
        self.pending.clear()


class Bucketed(Replicated):
    """Parameters in reverse order (the order backward reaches them) grouped into buckets of at most bucket_mb;
    a bucket's gradients are flattened and all-reduced asynchronously as soon as the last of them is ready."""

    def __init__(self, module: nn.Module, bucket_mb: float):
        super().__init__(module)
        self.buckets: list[list[nn.Parameter]] = [[]]
        size = 0
        for p in reversed([p for p in module.parameters() if p.requires_grad]):
            nbytes = p.numel() * p.element_size()
            if self.buckets[-1] and size + nbytes > bucket_mb * 2**20:  # as torch's DDP reads bucket_cap_mb
                self.buckets.append([])
                size = 0
            self.buckets[-1].append(p)
            size += nbytes
        self.bucket_of = {id(p): i for i, bucket in enumerate(self.buckets) for p in bucket}
        self.ready = [0] * len(self.buckets)
        self.pending: list[tuple[Any, torch.Tensor, list[torch.Tensor]]] = []
        for p in module.parameters():
            if p.requires_grad:
                p.register_post_accumulate_grad_hook(self._ready)

    def _ready(self, p: torch.Tensor) -> None:
        i = self.bucket_of[id(p)]
        self.ready[i] += 1
        if self.ready[i] == len(self.buckets[i]):
            self._launch(i)

    def _launch(self, i: int) -> None:
        grads = [p.grad for p in self.buckets[i]]
        flat = _flatten_dense_tensors(grads).div_(self.world)
        self.pending.append((dist.all_reduce(flat, async_op=True), flat, grads))

    def finish_gradient_synchronization(self) -> None:
        for i, bucket in enumerate(self.buckets):  # a bucket with a parameter that got no gradient: now
            if 0 < self.ready[i] < len(bucket) and all(p.grad is not None for p in bucket):
                self._launch(i)
        for work, flat, grads in self.pending:
            work.wait()
            for grad, reduced in zip(grads, _unflatten_dense_tensors(flat, grads)):
                grad.copy_(reduced)
        self.pending.clear()
        self.ready = [0] * len(self.buckets)


def no_communication(state, bucket):  # no annotations: DDP checks them, and this file's are strings
    """A DDP communication hook that sends nothing: the bucket's own gradients, at once."""
    future = torch.futures.Future()
    future.set_result(bucket.buffer())
    return future


def torch_ddp(module: nn.Module, device: torch.device, hook: Callable | None = None) -> nn.Module:
    ddp = parallel.shard_model(module, "ddp", device)
    if hook is not None:
        ddp.register_comm_hook(None, hook)
    return ddp


def finish_sync(wrapper: nn.Module, optimizer: Any) -> None:
    """After backward, for a class without adapter functions: its finish_gradient_synchronization(), if any."""
    if callable(finish := getattr(wrapper, "finish_gradient_synchronization", None)):
        finish()


@dataclass
class Variant:
    spec: Spec
    module: nn.Module  # our model inside
    wrapper: nn.Module
    after_backward: Callable[[nn.Module, Any], None]
    batch_start: Callable[[nn.Module, Any], None] | None = None


def build_variant(spec: Spec, cfg: ModelConfig, device: torch.device, seed: int) -> Variant:
    """Rank r's model starts from seed + r: a variant that skips the broadcast from rank 0 fails the check."""
    torch.manual_seed(seed + dist.get_rank())
    with device:
        module = build_model(cfg)
    nothing = lambda wrapper, optimizer: None  # noqa: E731
    if spec.kind in FSDP_KINDS:  # every rank from rank 0's weights: FSDP shards them, it broadcasts nothing
        torch.manual_seed(seed)
        with device:
            module = build_model(cfg)
        if spec.kind == "fsdp2":
            return Variant(spec, module, parallel.shard_model(module, "fsdp", device), nothing)
        make = common.load(spec.make)  # the course's get_fsdp(module, compute_dtype=None): this run computes in fp32
        dtype = {"compute_dtype": torch.float32} if "compute_dtype" in inspect.signature(make).parameters else {}
        return Variant(spec, module, make(module, **dtype), common.load(spec.after_backward))
    if spec.kind == "class":
        return Variant(spec, module, common.load(spec.make)(module), finish_sync)
    if spec.kind == "adapter":
        make = common.load(spec.make)
        wrapper = make(module, spec.bucket_mb) if spec.bucket_mb else make(module)
        start = common.load(spec.batch_start) if spec.batch_start else None
        return Variant(spec, module, wrapper, common.load(spec.after_backward), start)
    if spec.kind in ("torch", "nocomm"):
        return Variant(spec, module, torch_ddp(module, device, no_communication if spec.kind == "nocomm" else None),
                       nothing)
    make = {"naive": Naive, "flat": Flat, "overlap": Overlap}.get(spec.kind)
    wrapper = make(module) if make else Bucketed(module, spec.bucket_mb)
    return Variant(spec, module, wrapper, finish_sync)


# --------------------------------------------------------------------------------------------- measure


def batches(cfg: ModelConfig, batch_size: int, count: int, seed: int) -> list[torch.Tensor]:
    """`count` whole batches of token ids (batch, context + 1), the same on every rank."""
    generator = torch.Generator().manual_seed(seed)
    return [torch.randint(cfg.vocab_size, (batch_size, cfg.context_length + 1), generator=generator)
            for _ in range(count)]


def my_rows(tokens: torch.Tensor, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """This rank's rows of a whole batch, copied (a CPU view would keep every rank's rows): inputs and targets."""
    rows = tokens.chunk(dist.get_world_size())[dist.get_rank()].to(device, copy=True)
    return rows[:, :-1], rows[:, 1:]


def train_step(v: Variant, x: torch.Tensor, y: torch.Tensor, optimizer: torch.optim.Optimizer) -> None:
    """One step as the course's tests run one, each part in a range the trace's tables read."""
    with record_function("step"):
        if v.batch_start is not None:
            v.batch_start(v.wrapper, optimizer)
        optimizer.zero_grad(set_to_none=True)
        with record_function("forward"):
            logits = v.wrapper(x)
            loss = F.cross_entropy(logits.flatten(0, 1), y.flatten())
        with record_function("backward"):
            loss.backward()
        with record_function("gradient sync"):
            v.after_backward(v.wrapper, optimizer)
        with record_function("optimizer"):
            optimizer.step()


def check_sgd(params: Any) -> torch.optim.Optimizer:
    return torch.optim.SGD(params, lr=CHECK_LR)


def reference_weights(cfg: ModelConfig, tokens: list[torch.Tensor], device: torch.device, seed: int,
                      make_optimizer: Callable[[Any], Any] = check_sgd) -> dict[str, torch.Tensor]:
    """One process, the whole batch, rank 0's initial weights, SGD: what every variant must end with."""
    torch.manual_seed(seed)
    with device:
        model = build_model(cfg)
    optimizer = make_optimizer(model.parameters())
    for batch in tokens:
        batch = batch.to(device)
        optimizer.zero_grad()
        F.cross_entropy(model(batch[:, :-1]).flatten(0, 1), batch[:, 1:].flatten()).backward()
        optimizer.step()
    return {name: p.detach().clone() for name, p in model.named_parameters()}


def check(v: Variant, tokens: list[torch.Tensor], reference: dict[str, torch.Tensor], device: torch.device,
          optimizer: Any = None, atol: float = ATOL) -> tuple[str, float]:
    """"ok", or WRONG naming the parameter that differs most from the reference; and by how much (inf: a weight
    missing or misshapen), for agreed() to pick the rank furthest off."""
    optimizer = optimizer or check_sgd(v.wrapper.parameters())
    for batch in tokens:
        train_step(v, *my_rows(batch, device), optimizer)
    weights = full_weights(v)
    worst = (0.0, "")
    for name in reference:
        if name not in weights:
            return f"WRONG: {name} is not among the weights {v.spec.gather or 'the model'} gives", math.inf
        p = weights[name].detach().to(reference[name].dtype)
        if p.shape != reference[name].shape:
            return f"WRONG: {name} has shape {tuple(p.shape)}, one process {tuple(reference[name].shape)}", math.inf
        if not torch.allclose(p, reference[name], rtol=RTOL, atol=atol):
            worst = max(worst, ((p - reference[name]).abs().max().item(), name))
    if not worst[1]:
        return "ok", 0.0
    return (f"WRONG: {worst[1]} differs from one process on the whole batch by up to {worst[0]:.2g} after "
            f"{len(tokens)} steps", worst[0])


def full_weights(v: Variant) -> dict[str, torch.Tensor]:
    """The whole weights by name: your fsdp_gather_full_params, FSDP2's DTensors gathered, else the module's."""
    if v.spec.gather:
        return common.load(v.spec.gather)(v.wrapper)
    return {name: p.full_tensor() if hasattr(p, "full_tensor") else p for name, p in v.module.named_parameters()}


def timed_step(v: Variant, x: torch.Tensor, y: torch.Tensor, optimizer: Any, device: torch.device) -> float:
    """ms of one step, the ranks started together (a barrier, untimed) and the device synchronised."""
    dist.barrier()
    with common.SyncTimer(device) as timer:
        train_step(v, x, y, optimizer)
    return timer.elapsed_s * 1e3


def communication(v: Variant, x: torch.Tensor, y: torch.Tensor, optimizer: Any, device: torch.device,
                  steps: int, keep: Path | None) -> dict[str, Any]:
    """Profiled steps: from this rank's trace, the mean step's communication (kernel_tables' table 5)."""
    activities = [torch.profiler.ProfilerActivity.CPU] + [torch.profiler.ProfilerActivity.CUDA] * (
        device.type == "cuda")
    blocks = list(v.module.layers) if v.spec.kind in FSDP_KINDS else []
    with tempfile.TemporaryDirectory() as scratch, layer_ranges(blocks):
        path = keep or Path(scratch, "trace.json")
        with common.quiet_profiler(activities) as profiler:
            for _ in range(steps):
                dist.barrier()
                train_step(v, x, y, optimizer)
            common.synchronize(device)
        profiler.export_chrome_trace(str(path))
        profile = kernel_tables.load_torch_trace(path)
        rows = kernel_tables.communication_rows(profile)
    mean = {r["phase"]: r for r in rows if r["step"] == "mean"}
    step = mean.get(kernel_tables.WHOLE_STEP, {})
    return {"step_ms": step.get("phase_ms"), "comm_ms": step.get("comm_ms", 0.0),
            "hidden_ms": step.get("hidden_ms", 0.0), "exposed_ms": step.get("exposed_ms", 0.0),
            "by_phase": {phase: {k: r[k] for k in ("comm_ms", "hidden_ms", "exposed_ms")}
                         for phase, r in mean.items() if phase != kernel_tables.WHOLE_STEP},
            "lanes": lanes(profile), **({"layers": layer_slack(profile, len(blocks))} if blocks else {}),
            **({"trace": str(keep)} if keep else {})}


@contextlib.contextmanager
def layer_ranges(blocks: list[nn.Module]) -> Any:
    """A "layer i" range in the trace around each block's forward (hooks added after FSDP's own, so its
    all-gather issued in its pre-forward hook falls before the range)."""
    open_ranges: dict[int, Any] = {}

    def enter(i: int) -> Callable:
        def hook(module: nn.Module, args: Any) -> None:
            open_ranges[i] = record_function(f"layer {i}").__enter__()
        return hook

    def leave(i: int) -> Callable:
        def hook(module: nn.Module, args: Any, output: Any) -> None:
            if (rf := open_ranges.pop(i, None)) is not None:
                rf.__exit__(None, None, None)
        return hook

    handles = [h for i, block in enumerate(blocks) for h in (block.register_forward_pre_hook(enter(i)),
                                                              block.register_forward_hook(leave(i)))]
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()


MATMUL = re.compile(r"gemm|matmul|\bmm\b|aten::mm|aten::addmm|aten::bmm|aten::linear|cutlass", re.I)


def layer_slack(profile: kernel_tables.Profile, layers: int) -> list[dict[str, Any]]:
    """Per block of the first profiled forward: did its weights' all-gather finish before its compute began?
    Its all-gathers are those launched after the previous block's first matmul (the forward's start for block 0)
    and before its own; slack = its first matmul's start - their last end (negative: the compute waited; None: no
    all-gather was launched for it there, its weights came earlier). GPU work is placed by its launch, timed on
    the GPU."""
    forward = min((r for r in profile.ranges if r.name == "forward"), key=lambda r: r.start_ns, default=None)
    if forward is None:
        return []
    gathers = [i for i in profile.intervals if kernel_tables.collective_kind(i.name) == "all-gather"]
    matmuls = sorted((i for i in profile.intervals if not kernel_tables.collective_kind(i.name)
                      and MATMUL.search(i.name)), key=lambda i: i.launch_ns)
    rows, previous = [], forward.start_ns
    for index in range(layers):
        block = min((r for r in profile.ranges if r.name == f"layer {index}" and
                     forward.start_ns <= r.start_ns <= forward.end_ns), key=lambda r: r.start_ns, default=None)
        first = next((m for m in matmuls if block and block.start_ns <= m.launch_ns <= block.end_ns), None)
        if first is None:
            rows.append({"layer": index, "all_gather_ms": None, "slack_ms": None})
            continue
        mine = [g for g in gathers if previous <= g.launch_ns <= first.launch_ns]
        rows.append({"layer": index, "all_gather_ms": sum(g.end_ns - g.start_ns for g in mine) / 1e6 if mine else None,
                     "slack_ms": (first.start_ns - max(g.end_ns for g in mine)) / 1e6 if mine else None})
        previous = first.launch_ns
    return rows


def lanes(profile: kernel_tables.Profile) -> dict[str, Any]:
    """The first profiled step as the timeline figure draws it: ms from its start, when compute ran and when
    communication did (each the union of its intervals), and where its phases began."""
    step = min((r for r in profile.ranges if r.name == "step"), key=lambda r: r.start_ns, default=None)
    if step is None:
        return {}

    def inside(union: list[tuple[float, float]]) -> list[list[float]]:
        return [[(max(a, step.start_ns) - step.start_ns) / 1e6, (min(b, step.end_ns) - step.start_ns) / 1e6]
                for a, b in union if b > step.start_ns and a < step.end_ns]

    comm = [i for i in profile.intervals if kernel_tables.collective_kind(i.name)]
    compute = [i for i in profile.intervals if kernel_tables.work_kind(i.name) == "computation"]
    return {"step_ms": step.duration_ns / 1e6,
            "compute": inside(kernel_tables.merged((i.start_ns, i.end_ns) for i in compute)),
            "comm": inside(kernel_tables.merged((i.start_ns, i.end_ns) for i in comm)),
            "phases": {r.name: (r.start_ns - step.start_ns) / 1e6 for r in profile.ranges
                       if r.name in ("forward", "backward", "gradient sync", "optimizer")
                       and step.start_ns <= r.start_ns <= step.end_ns}}


class Ranks:
    """This rank's exchange with the others through the launch's store: never a collective, so a rank that
    failed or hangs cannot make the others wait longer than the timeout."""

    def __init__(self, store: dist.Store, rank: int, world: int, timeout_s: float):
        self.store, self.rank, self.world = store, rank, world
        self.timeout = datetime.timedelta(seconds=timeout_s)
        self.groups = 0

    def all_say(self, key: str, value: Any) -> list[Any]:
        self.store.set(f"{key}/{self.rank}", json.dumps(value))
        keys = [f"{key}/{r}" for r in range(self.world)]
        self.store.wait(keys, self.timeout)
        return [json.loads(self.store.get(k)) for k in keys]

    def new_group(self, backend: str, timeout_s: float, device: torch.device) -> None:
        """A fresh default process group (after a failure the old one may be stuck mid-collective)."""
        if dist.is_initialized():
            with contextlib.suppress(Exception):
                dist.destroy_process_group()
        self.groups += 1
        dist.init_process_group(backend, store=dist.PrefixStore(f"pg{self.groups}/", self.store), rank=self.rank,
                                world_size=self.world, timeout=datetime.timedelta(seconds=timeout_s),
                                device_id=device if device.type == "cuda" else None)


def failure_status(exc: BaseException) -> str:
    """common.failure_status, but an adapter function whose own `raise NotImplementedError` raised (the course's
    stub, not an operator torch lacks) is work not written yet, not an error: "not implemented yet: write get_fsdp"."""
    frame = traceback.extract_tb(exc.__traceback__)[-1] if exc.__traceback__ else None
    if isinstance(exc, NotImplementedError) and frame and frame.name in STUBS and \
            (frame.line or "").startswith("raise NotImplementedError"):
        return f"{NOT_WRITTEN}: write {frame.name}"
    return common.failure_status(exc)


def agreed(answers: list[dict[str, Any]]) -> str:
    """One row's status from every rank's answer: ok, the first failure as a row says it ("error on rank 1: ..."),
    "not implemented yet" (every rank runs the same stub), or the WRONG of the rank whose weights differ most (a
    rank that never got rank 0's weights is far off, rank 0 itself barely)."""
    statuses = [a["status"] for a in answers]
    failed = [(r, s) for r, s in enumerate(statuses) if s != "ok" and not s.startswith(("WRONG", NOT_WRITTEN))]
    if failed:
        timeouts = [(r, s) for r, s in failed if "timeout" not in s.lower() and "timed out" not in s.lower()]
        rank, status = (timeouts or failed)[0]  # the rank that raised, not the one left waiting for it
        return parallel.on_rank(status, rank)
    if stub := next((s for s in statuses if s.startswith(NOT_WRITTEN)), None):
        return stub
    wrong = [(a.get("difference", 0.0), -r) for r, a in enumerate(answers) if a["status"] != "ok"]
    if not wrong:
        return "ok"
    rank = -max(wrong)[1]  # the largest difference, the first such rank
    return f"WRONG on rank {rank}{statuses[rank].removeprefix('WRONG')} (the most of any rank)"


def rank_main(args: argparse.Namespace, todo: list[int], prefix: str, publish: Callable[[dict], None]) -> None:
    """One rank (started here by parallel.SpawnedRanks, or by torchrun): the variants in `todo` built and checked,
    timed in rounds with the others, each profiled; rank 0 publishes each row as it is done, and what is under
    way (so that a rank's death names the variant it stopped)."""
    launch = parallel.torchrun_launch()
    rank, world = launch.rank, launch.world_size
    say = publish if rank == 0 else (lambda message: None)
    store = dist.PrefixStore(prefix, dist.TCPStore(launch.master_addr, launch.master_port, is_master=False,
                                                   timeout=datetime.timedelta(seconds=args.pg_timeout)))
    ranks = Ranks(store, rank, world, args.pg_timeout * 2 + 60)
    device = torch.device("cuda", launch.local_rank) if args.device == "cuda" else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    else:  # the ranks share this machine's cores: each its part, not all of them each
        torch.set_num_threads(max(1, len(os.sched_getaffinity(0)) // launch.local_world_size))
    backend = "nccl" if device.type == "cuda" else "gloo"
    cfg = args.model
    env = common.environment(device) if rank == 0 else {}
    load_before = common.machine_load(device)
    ranks.new_group(backend, args.pg_timeout, device)
    check_tokens = batches(cfg, args.batch_size, args.check_steps, args.seed)
    x, y = my_rows(batches(cfg, args.batch_size, 1, args.seed + 1)[0], device)
    reference = reference_weights(cfg, check_tokens, device, args.seed)
    nbytes = grad_bytes(reference)
    row = functools.partial(variant_record, args, env, nbytes)
    live: list[tuple[int, Variant, Any]] = []
    variant = None
    checked: dict[int, str] = {}  # ok or WRONG: every rank's the same
    for i in todo:
        spec = args.variant_specs[i]
        say({"ok": True, "stage": "check", "index": i})
        if rank == 0:
            progress(f"[{i + 1}/{len(args.variant_specs)}] {spec.name}: building and checking")
        failure, status, difference = {}, "ok", 0.0
        try:
            variant = build_variant(spec, cfg, device, args.seed)
            if spec.name != BASELINE:  # the baseline sends nothing, so its ranks' weights part: nothing to check
                status, difference = check(variant, check_tokens, reference, device)
        except Exception as exc:  # noqa: BLE001 - a failure is this variant's row
            variant, status = None, failure_status(exc)
            failure = {"traceback": traceback.format_exc()}
        answers = ranks.all_say(f"check/{i}", {"status": status, "difference": difference, **failure})
        status = agreed(answers)
        if status == "ok" or status.startswith("WRONG"):
            live.append((i, variant, build_optimizer("torch", variant.wrapper.parameters(), device)))
            checked[i] = status
            say({"ok": True, "stage": "checked", "index": i, "status": status})
            continue
        say({"ok": True, "stage": "row", "index": i, "record": row(spec, status, answers)})
        # a rank may have been left mid-collective: a fresh group, the variants so far rebuilt in it
        variant = None
        ranks.new_group(backend, args.pg_timeout, device)
        live = [(j, v, build_optimizer("torch", v.wrapper.parameters(), device))
                for j, v in [(j, build_variant(v.spec, cfg, device, args.seed)) for j, v, _ in live]]
    del reference, variant  # the memory breakdown counts every tensor this process holds
    if live:
        say({"ok": True, "stage": "timing", "round": 0})
        if rank == 0:
            progress(f"timing {len(live)} variants, {args.steps} rounds")
        samples, status = time_variants(args, live, x, y, device, say)
        load = {"before": load_before, "after": common.machine_load(device)}
        for i, v, optimizer in live:  # each profiled, its row published as soon as every rank has its split
            say({"ok": True, "stage": "profile", "index": i})
            answer = {"status": status, "samples": samples[i], "load": load}
            if status == "ok":
                keep = None
                if args.traces:
                    keep = Path(args.trace_dir, re.sub(r"[^\w.-]+", "_", v.spec.name) + f"-rank{rank}.json")
                try:
                    answer["communication"] = communication(v, x, y, optimizer, device, args.profile_steps, keep)
                    if v.spec.kind in FSDP_KINDS:  # after a step: this rank's shards, their gradients and state
                        answer["memory"] = memory_breakdown(v.wrapper, optimizer)
                except Exception as exc:  # noqa: BLE001 - the profiled steps broke: this row
                    answer["status"] = parallel.on_rank(common.failure_status(exc), rank)
            answers = ranks.all_say(f"profile/{i}", answer)
            failed = next((a["status"] for a in answers if a["status"] != "ok"), None)
            say({"ok": True, "stage": "row", "index": i,
                 "record": row(v.spec, failed or checked[i], answers)})
    live = v = optimizer = check_tokens = None
    release_variants()  # the sharding run's rest: its batch and buffers, no earlier variant's tensors
    if args.sharded_optimizer:
        say({"ok": True, "stage": "sharding"})
        if rank == 0:
            progress("optimizer state sharding: memory and time, with and without")
        try:
            sharding = sharding_run(args, cfg, device, x, y)
        except _SharingBroken as exc:
            sharding = exc.rows
        except Exception as exc:  # noqa: BLE001 - the timing broke
            sharding = {"AdamW": {"status": common.failure_status(exc)}}
        answers = ranks.all_say("sharding", sharding)
        say({"ok": True, "stage": "rows", "records": memory_records(args, env, answers)})
    say({"ok": True, "stage": "done"})
    ranks.all_say("done", True)
    with contextlib.suppress(Exception):
        dist.destroy_process_group()


def time_variants(args: argparse.Namespace, live: list[tuple[int, Variant, Any]], x: torch.Tensor, y: torch.Tensor,
                  device: torch.device, say: Callable[[dict], None]) -> tuple[dict[int, list[float]], str]:
    """Warm-up, then one timed step of each variant per round (runner.interleave: A B C | C B A ...): each
    variant's samples, and "ok" or the failure (on this rank) that ended the rounds."""
    samples: dict[int, list[float]] = {i: [] for i, _, _ in live}
    try:
        for i, v, optimizer in live:
            for _ in range(args.warmup):
                timed_step(v, x, y, optimizer, device)

        def run_block(position: int, round_index: int) -> None:
            i, v, optimizer = live[position]
            if position == 0 and round_index:
                say({"ok": True, "stage": "timing", "round": round_index})
            samples[i].append(timed_step(v, x, y, optimizer, device))

        runner.interleave(len(live), args.steps, run_block)
    except Exception as exc:  # noqa: BLE001 - the rounds broke: every variant still timing says why
        return samples, parallel.on_rank(common.failure_status(exc), dist.get_rank())
    return samples, "ok"


def grad_bytes(weights: dict[str, torch.Tensor]) -> int:
    return sum(w.numel() * w.element_size() for w in weights.values())


# ---- optimizer state sharding: memory at three points, with and without ----

MEMORY_POINTS = ("after model init", "before optimizer step", "after optimizer step")


def tensors_in(obj: Any, seen: set[int] | None = None, depth: int = 8) -> list[torch.Tensor]:
    """Every tensor an object holds through its attributes, dicts, lists and tuples: an optimizer's state, also
    when it lives in an inner optimizer (a sharded optimizer wrapping AdamW)."""
    seen = set() if seen is None else seen
    if id(obj) in seen or depth < 0:
        return []
    seen.add(id(obj))
    if isinstance(obj, torch.Tensor):
        return [obj]
    if isinstance(obj, dict):
        children = [*obj.keys(), *obj.values()]
    elif isinstance(obj, (list, tuple, set)):
        children = list(obj)
    elif hasattr(obj, "__dict__") and not isinstance(obj, (type, types.ModuleType, nn.Module)) and not callable(obj):
        children = list(vars(obj).values())
    else:
        return []
    return [t for child in children for t in tensors_in(child, seen, depth - 1)]


def storages(tensors: Any) -> dict[int, int]:
    """{storage: bytes}, each storage once however many views share it; a DTensor (FSDP2's) by its local shard."""
    local = [t.to_local() if hasattr(t, "to_local") else t for t in tensors]
    return {common.storage_key(t): t.untyped_storage().nbytes() for t in local if t.device.type != "meta"}


def memory_breakdown(module: nn.Module, optimizer: Any) -> dict[str, int]:
    """Bytes of the variant's own parameters, gradients and optimizer state, each storage counted once."""
    params = storages(module.parameters())
    grads = {k: v for k, v in storages(p.grad for p in module.parameters() if p.grad is not None).items()
             if k not in params}
    state = {k: v for k, v in storages(tensors_in(optimizer)).items() if k not in params and k not in grads}
    return {"params": sum(params.values()), "grads": sum(grads.values()), "optimizer_state": sum(state.values())}


def release_variants() -> None:
    """Every variant no longer referenced freed, with its model, gradients and optimizer. A post-accumulate-grad
    hook is held from C++ (PyFunctionTensorPostAccGradHooks), out of the garbage collector's sight: one bound to a
    wrapper (ours, a student's) would keep it alive for good through its own parameters; clearing them ends that."""
    for t in gc.get_objects():
        if issubclass(type(t), torch.Tensor) and t._post_accumulate_grad_hooks:
            t._post_accumulate_grad_hooks.clear()
    gc.collect()


def memory_point(module: nn.Module, optimizer: Any, device: torch.device) -> dict[str, int]:
    """The breakdown, the rest (every other tensor: the batch, buffers) and the total: on CUDA the allocator's,
    with its peak since the last reset (then reset again); on a CPU every tensor Python holds, and no peak."""
    parts = memory_breakdown(module, optimizer)
    if device.type == "cuda":
        total, peak = torch.cuda.memory_allocated(device), common.peak_memory_bytes(device)
        common.reset_peak_memory(device)
    else:  # by type: isinstance() would read reduce_op's __class__, which warns that it is deprecated
        gc.collect()
        total, peak = sum(storages(o for o in gc.get_objects() if issubclass(type(o), torch.Tensor)).values()), {}
    return {**parts, "rest": max(total - sum(parts.values()), 0), "total": total, **peak}


def make_optimizer(spec: str | None, params: Any) -> Any:
    """torch.optim.AdamW, or yours sharding it: CALLABLE(params, torch.optim.AdamW, **AdamW's settings)."""
    from model import ADAMW_SETTINGS
    if spec is None:
        return torch.optim.AdamW(params, **ADAMW_SETTINGS)
    return common.load(spec.rpartition("=")[2])(params, torch.optim.AdamW, **ADAMW_SETTINGS)


def sharding_run(args: argparse.Namespace, cfg: ModelConfig, device: torch.device, x: torch.Tensor,
                 y: torch.Tensor) -> dict[str, dict[str, Any]]:
    """AdamW and your sharded AdamW, each on a model kept in sync by the flat reference: the breakdown at the
    three points of the second step (the first creates the state), each alone in the process beside the batch
    (x, y); then yours checked against AdamW in one process on the whole batch; then time per step, in rounds."""
    out: dict[str, dict[str, Any]] = {}
    optimizers = {"AdamW": None, "sharded AdamW": args.sharded_optimizer}
    for name, spec in optimizers.items():
        variant = optimizer = None
        gc.collect()
        try:
            if device.type == "cuda":
                torch.cuda.empty_cache()
            common.reset_peak_memory(device)
            variant = build_variant(Spec(name, "flat"), cfg, device, args.seed)
            optimizer = make_optimizer(spec, variant.wrapper.parameters())
            points = {MEMORY_POINTS[0]: memory_point(variant.module, optimizer, device)}
            for step in range(2):
                common.reset_peak_memory(device)  # a point's peak: since the point before it in the second step
                optimizer.zero_grad(set_to_none=True)
                F.cross_entropy(variant.wrapper(x).flatten(0, 1), y.flatten()).backward()
                variant.wrapper.finish_gradient_synchronization()
                if step:
                    points[MEMORY_POINTS[1]] = memory_point(variant.module, optimizer, device)
                optimizer.step()
            points[MEMORY_POINTS[2]] = memory_point(variant.module, optimizer, device)
            out[name] = {"status": "ok", "points": points, "step_ms": []}
        except Exception as exc:  # noqa: BLE001 - a failure is this row
            out[name] = {"status": failure_status(exc), "traceback": traceback.format_exc()}
            raise _SharingBroken(out) from exc
    del variant, optimizer
    live = []
    for name, spec in optimizers.items():
        variant = build_variant(Spec(name, "flat"), cfg, device, args.seed)
        live.append((name, variant, make_optimizer(spec, variant.wrapper.parameters())))
    check_tokens = batches(cfg, args.batch_size, args.check_steps, args.seed)
    reference = reference_weights(cfg, check_tokens, device, args.seed, lambda params: make_optimizer(None, params))
    # AdamW divides by sqrt(v): where a gradient nearly cancels, summation order moves a weight by up to ~1e-5
    out["sharded AdamW"]["status"], out["sharded AdamW"]["difference"] = check(
        live[1][1], check_tokens, reference, device, live[1][2], atol=ADAMW_CHECK_ATOL)
    del reference

    def run_block(position: int, round_index: int) -> None:
        name, variant, optimizer = live[position]
        out[name]["step_ms"].append(timed_step(variant, x, y, optimizer, device))

    runner.interleave(len(live), args.steps, run_block)
    return out


class _SharingBroken(RuntimeError):
    """The sharded run failed: the rows so far, with the failure."""

    def __init__(self, rows: dict[str, dict[str, Any]]):
        super().__init__("sharding run failed")
        self.rows = rows


# --------------------------------------------------------------------------------------------- report


def variant_record(args: argparse.Namespace, env: dict, nbytes: int, spec: Spec, status: str,
                   answers: list[dict]) -> dict[str, Any]:
    """Rank 0: a variant's row from every rank's answer (the check's, or the timing's and profile's)."""
    world, cfg = args.world_size, args.model
    wire = 0 if spec.name == BASELINE else nbytes
    # what a rank sends (nccl-tests' bus bytes): a ring all-reduce of the gradients; FSDP all-gathers the weights
    # before forward and again before backward, and reduce-scatters the gradients
    ops = ("all_gather", "all_gather", "reduce_scatter") if spec.kind in FSDP_KINDS else ("all_reduce",)
    record: dict[str, Any] = {
        "experiment": "bench_ddp", "variant": spec.name, "kind": spec.kind, "status": status,
        "config": {"size": args.size, "model": cfg.__dict__, "batch_size": args.batch_size,
                   "world_size": world, "backend": "nccl" if args.device == "cuda" else "gloo",
                   "check_steps": args.check_steps, "steps": args.steps, "warmup": args.warmup,
                   "bucket_mb": spec.bucket_mb, "handout": args.handout, "command": args.command},
        "environment": env, "load": answers[0].get("load"), "grad_bytes": nbytes,
        "wire_bytes": sum(results.RING_FACTORS[op](world) for op in ops) * wire,
        "link_gbps": args.link_gbps, "link_source": args.link_source}
    per_rank = [a.get("samples", []) for a in answers]
    comm = [a.get("communication") for a in answers]
    if args.steps and all(len(s) == args.steps for s in per_rank):
        record["step_ms"] = [max(step) for step in zip(*per_rank)]  # the slowest rank's: the step's time
        record["ranks"] = [{"rank": r, "step_ms": s, "communication": c} for r, (s, c) in
                           enumerate(zip(per_rank, comm))]
    if all(comm):
        for k in ("comm_ms", "hidden_ms", "exposed_ms"):
            record[k] = statistics.fmean(c[k] for c in comm)
        record["profiled_step_ms"] = statistics.fmean(c["step_ms"] or math.nan for c in comm)
    if args.link_gbps and wire:
        record["floor_ms"] = sum(results.collective_floor_ms(op, nbytes, world, args.link_gbps) for op in ops)
    if all(c and c.get("layers") for c in comm):
        record["layers"] = [c["layers"] for c in comm]
    if all(a.get("memory") for a in answers):
        record["memory"] = [a["memory"] for a in answers]
        record["predicted"] = parallel.state_bytes_per_rank(cfg, "fsdp", world, "train")
    if tb := next((a["traceback"] for a in answers if a.get("traceback")), None):
        record["traceback"] = tb
    return record


def memory_records(args: argparse.Namespace, env: dict, answers: list[dict]) -> list[dict[str, Any]]:
    """Rank 0: the optimizer state sharding rows from every rank's."""
    world, records = args.world_size, []
    for name in answers[0]:
        shard = [a.get(name, {}) for a in answers]
        status = agreed([{"status": "ok", **s} for s in shard])
        state_bytes = 8 / (world if name != "AdamW" else 1)  # AdamW's two moments, fp32, split over the ranks
        record = {"experiment": "bench_ddp", "kind": "memory", "variant": name, "status": status,
                  "optimizer": args.sharded_optimizer if name != "AdamW" else "torch.optim.AdamW",
                  "num_params": args.model.num_params, "world_size": world, "environment": env,
                  "expected_bytes_per_param": {MEMORY_POINTS[0]: 4, MEMORY_POINTS[1]: 8 + state_bytes,
                                               MEMORY_POINTS[2]: 8 + state_bytes},
                  "ranks": [s.get("points") for s in shard],
                  **({} if args.device == "cuda" else {"unmeasured": "peak memory (needs CUDA)"})}
        if all(len(s.get("step_ms", [])) == args.steps for s in shard):
            record["step_ms"] = [max(step) for step in zip(*(s["step_ms"] for s in shard))]
        records.append(record)
    return records


class Collector:
    """The parent's (or torchrun's rank 0's) view of the run: each row written as it arrives (a JSON line, the
    report rewritten), and what is under way, so that a rank's death, Ctrl-C or SIGTERM becomes rows."""

    def __init__(self, args: argparse.Namespace, files: results.ResultFiles):
        self.args, self.files = args, files
        self.records: list[dict[str, Any]] = []
        self.done: set[int] = set()  # variants with their row
        self.checked: dict[int, str] = {}  # checked, not yet timed: their check's verdict
        self.stage, self.under_way = "start", None

    def take(self, message: dict[str, Any]) -> None:
        stage, self.stage = message["stage"], message["stage"]
        if stage in ("check", "profile"):
            self.under_way = message["index"]
        elif stage == "checked":
            self.checked[message["index"]] = message["status"]
        elif stage == "row":
            self.add(message["index"], message["record"])
        elif stage == "rows":
            for record in message["records"]:
                self.add(None, record)

    def add(self, index: int | None, record: dict[str, Any]) -> None:
        self.records.append(record)
        if index is not None:
            self.done.add(index)
            self.checked.pop(index, None)
        self.files.append_record(record)
        self.files.write_report(lambda fmt: report.render("bench_ddp", self.records, fmt), self.args.fmt)
        progress(f"{record['variant']}: {record['status']}")

    def stopped(self, status: str) -> list[int] | None:
        """The ranks stopped (a rank died, went silent, or we were interrupted): the variant under way, or every
        one the rounds left untimed, is a row with `status`; the variants still to run afresh, None if none can."""
        left = [i for i in range(len(self.args.variant_specs)) if i not in self.done]
        if self.stage in ("check", "profile") and self.under_way in left:
            culprits = [self.under_way]
        else:  # the rounds time every checked variant at once; elsewhere no variant is to blame
            culprits = list(self.checked) if self.stage == "timing" else []
        if not culprits:  # before any variant, between them or after them all: a fresh start would fail again
            for i in left:
                self.add(i, self.failed_record(i, status))
            if self.args.sharded_optimizer:
                self.add_memory_failure(status)
            return None
        for i in culprits:
            self.add(i, self.failed_record(i, status))
        return [i for i in left if i not in culprits]

    def interrupted(self, status: str) -> None:
        """Ctrl-C or SIGTERM: the variants checked but not timed are rows with their check's verdict."""
        for i, verdict in list(self.checked.items()):
            self.add(i, self.failed_record(i, f"{status} (check: {verdict})"))

    def failed_record(self, i: int, status: str) -> dict[str, Any]:
        spec = self.args.variant_specs[i]
        return {"experiment": "bench_ddp", "variant": spec.name, "kind": spec.kind, "status": status,
                "config": {"size": self.args.size, "model": self.args.model.__dict__,
                           "batch_size": self.args.batch_size, "world_size": self.args.world_size,
                           "check_steps": self.args.check_steps, "steps": self.args.steps,
                           "bucket_mb": spec.bucket_mb, "command": self.args.command}}

    def add_memory_failure(self, status: str) -> None:
        if not any(r.get("kind") == "memory" for r in self.records):
            self.add(None, {"experiment": "bench_ddp", "kind": "memory", "variant": "sharded AdamW",
                            "status": status, "world_size": self.args.world_size})


# --------------------------------------------------------------------------------------------- launch

START_GRACE_S = 120.0  # more than a collective's own timeout before a silent rank is stopped: each imports torch


def spawn(args: argparse.Namespace, collector: Collector) -> None:
    """Ranks started here (parallel.SpawnedRanks); after a rank died or went silent, the variants left run in
    ranks started afresh."""
    store = dist.TCPStore(parallel.SPAWN_HOST, 0, is_master=True, wait_for_workers=False)
    todo: list[int] | None = list(range(len(args.variant_specs)))
    wait_s = 2 * args.pg_timeout + START_GRACE_S  # the ranks' own timeouts speak first
    while todo is not None:
        prefix = f"ddp/{uuid.uuid4().hex[:12]}/"
        with parallel.SpawnedRanks(rank_main, (args, todo, prefix), args.world_size, store) as ranks:
            while (message := ranks.next_message(wait_s))["ok"] and message["stage"] != "done":
                collector.take(message)
        if message["ok"]:
            return
        progress(f"{message['status']}: the ranks were stopped")
        todo = collector.stopped(message["status"])
        if todo == [] and not args.sharded_optimizer:
            return
        collector.stage, collector.under_way, collector.checked = "start", None, {}


def link_figure(p: argparse.ArgumentParser, args: argparse.Namespace) -> tuple[float | None, str | None]:
    """--link-gbps: a figure (GB/s), or bench_comm's measured bus bandwidth from its newest all_reduce run in the
    results folder for this backend and world size: the fit's beta as busbw where the fit holds and reaches the
    bandwidth regime, else the busbw of the largest size that took twice as long as every smaller one (its bytes,
    not the latency, took most of it, however noisy the small ones). Latency-bound sizes alone give no figure: the
    source then says why. By default, that when there is one."""
    if args.link_gbps not in (None, "measured"):
        try:
            return results.positive_float(args.link_gbps), "--link-gbps"
        except (argparse.ArgumentTypeError, ValueError) as exc:
            p.error(f"--link-gbps: {exc} (a figure in GB/s, or 'measured')")
    backend = "nccl" if args.device == "cuda" else "gloo"
    found = []
    for path in Path(args.results_dir, "comm").glob("*.jsonl"):
        try:
            records = report.read_run(str(path)).values()
        except report.ReportError:
            continue  # not a bench_comm run: not ours to read
        for r in records:
            cfg = r.get("config") or {}
            if (r.get("experiment") == "bench_comm" and r.get("status") == "ok" and r.get("busbw_gbps")
                    and cfg.get("op") == "all_reduce" and cfg.get("backend") == backend
                    and cfg.get("world_size") == args.world_size):
                found.append((path.stat().st_mtime, path.name, r))
    if not found:
        if args.link_gbps == "measured":
            p.error(f"--link-gbps measured: no bench_comm all_reduce record for {backend} on {args.world_size} "
                    f"ranks in {Path(args.results_dir, 'comm')} (run bench_comm.py --world-sizes "
                    f"{args.world_size} first)")
        return None, None
    name = max((m, n) for m, n, _ in found)[1]
    rows = sorted((r for _, n, r in found if n == name), key=lambda r: r["bytes"])
    fit = report.latency_bandwidth_fit([r["bytes"] for r in rows], [r["ms_median"] / 1e3 for r in rows])
    if fit.get("bandwidth_bound"):
        return (fit["beta_bytes_per_s"] / 1e9 * results.RING_FACTORS["all_reduce"](args.world_size),
                f"bench_comm's all_reduce fit over {len(rows)} sizes, beta x 2(n-1)/n, {name}")
    slower = [i and r["ms_median"] >= 2 * max(q["ms_median"] for q in rows[:i]) for i, r in enumerate(rows)]
    if bound := [r for r, ok in zip(rows, slower) if ok]:
        return bound[-1]["busbw_gbps"], (f"bench_comm's measured all_reduce bus bandwidth, "
                                         f"{bound[-1]['config']['size_mb']:g} MB, {name}")
    fit_said = fit.get("refused") or (f"poor fit: {fit['poor']}" if fit.get("poor") else
                                      "every size under alpha x beta")
    why = (f"none: bench_comm's all_reduce sizes in {name} are latency-bound ({fit_said}; none took twice as long as "
           "every smaller size): measure larger sizes")
    if args.link_gbps == "measured":
        p.error(f"--link-gbps measured: {why}")
    return None, why


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    args.command = ["bench_ddp.py", *(sys.argv[1:] if argv is None else argv)]
    args.trace_dir = str(Path(args.results_dir, "ddp", "traces"))
    if args.traces:
        Path(args.trace_dir).mkdir(parents=True, exist_ok=True)
    launch = parallel.torchrun_launch()
    rank0 = parallel.is_rank_zero()
    files = results.ResultFiles(args.results_dir, "ddp", args.out, "ddp") if rank0 else None
    collector = Collector(args, files) if rank0 else None
    code = 0
    with results.sigterm_as_interrupt():
        try:
            if launch is not None:
                attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")  # a restarted launch: fresh keys
                rank_main(args, list(range(len(args.variant_specs))),
                          f"ddp/{os.environ.get('TORCHELASTIC_RUN_ID', 'none')}/{attempt}/",
                          collector.take if rank0 else lambda message: None)
            else:
                spawn(args, collector)
        except KeyboardInterrupt as stop:
            code = 128 + results.signal_number(stop)
            how = "SIGTERM" if code == 143 else "Ctrl-C"
            if collector is not None:
                collector.interrupted(f"interrupted by {how}")
                progress(f"interrupted by {how}: the ranks were stopped; "
                         f"{len(collector.records)} row(s) kept in {files.jsonl}")
    if files is None:
        return code
    if not collector.records:
        files.release()
        return code
    return report.publish("bench_ddp", collector.records, files, args.fmt, plot=args.plot) or code


if __name__ == "__main__":
    sys.exit(main())
