"""Memory of the Transformer LM (memory_profiling, gradient_checkpointing): the peak of a forward pass and of
a training step per context length, fp32 and bf16; one residual-stream tensor; the largest allocations and the
line that made them; what autograd keeps for backward, per block and for the handout's compiled block (§3.2);
what activation checkpointing buys (single-level every K blocks, and nested).

    python3 mem_profile.py --dtype fp32 bf16                 # the handout's question: 2026 xl, ctx 128, 2048
    python3 mem_profile.py --handout 2025 --dtype fp32 bf16  # the 2025 one: 2.7B at ctx 128, 256, 512
    python3 mem_profile.py --size xl --context-length 128 --mode train --dtype bf16 --snapshot   # + PNG, HTML
    python3 mem_profile.py --mode train --checkpoint 0 1 2 4 8   # checkpointing: 2026's xl, batch 4, ctx 2048
    python3 mem_profile.py --size xl --num-heads 16 --context-length 2048 --mode forward --compile   # §3.2
    python3 mem_profile.py --analyze results/memory/<run>_<config>.pickle      # re-read anyone's snapshot
    python3 mem_profile.py --model cs336_basics.model:BasicsTransformerLM --snapshot   # the staff model

Measured peaks and snapshots need CUDA; the rest runs on any device. Each configuration runs in a child
process: an OOM or a crash is a row. docs/mem_profile.md explains the tables.
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import functools
import itertools
import json
import math
import pickle
import re
import sys
import time
import traceback
import weakref
from collections import Counter
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any, Callable

import torch
import torch.nn as nn
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.utils import _pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode

import common
import report
import results
import runner
from common import DTYPES, SyncTimer, precision_context, resolve_device, saved_tensors, storage_key
from model import ATTENTION, build_model, check_logits, cross_entropy
from report import MEMORY_PEAK_COLUMNS, sizes_table
from results import DEFAULT_BATCH_SIZE, MODES, ModelConfig, ResultFiles, emit, format_bytes, get_config
from runner import RunConfig, Workload

FP32_BYTES = 4
PROJECT_ROOT = Path(__file__).resolve().parent

# --- arguments ---


@dataclass(frozen=True)
class MemConfig:
    """One configuration; its fields are the record's `config`."""

    size: str
    model: ModelConfig  # its context_length is the measured sequence length
    handout: str = results.DEFAULT_HANDOUT
    batch_size: int = DEFAULT_BATCH_SIZE
    warmup: int = 3
    steps: int = 5
    mode: str = "train"
    dtype: str = "fp32"
    attn: str = "naive"
    checkpoint_every: int = 0
    compile: bool = False
    model_factory: str | None = None  # yours, MODULE:CALLABLE; None = ours
    optimizer: str = common.OURS
    device: str = "auto"
    seed: int = 0

    @property
    def context_length(self) -> int:
        return self.model.context_length

    def label(self) -> str:
        parts = [self.size, f"ctx={self.context_length}", self.mode, self.dtype,
                 self.model_factory or self.attn]
        parts += [f"ckpt={self.checkpoint_every}"] * bool(self.checkpoint_every)
        parts += [f"optimizer={self.optimizer}"] * (self.optimizer != common.OURS)
        return " ".join(parts + ["compiled"] * self.compile)

    def skip_key(self) -> tuple[tuple, str, int]:
        """After an OOM, the longer contexts of the same settings are skipped (runner.run_configurations)."""
        return (dataclasses.replace(self, model=dataclasses.replace(self.model, context_length=1)), "ctx",
                self.context_length)


def parse_args(argv: list[str] | None = None) -> tuple[argparse.Namespace, list[MemConfig]]:
    p = results.ArgParser(description=__doc__.split("\n\n")[0])
    results.add_size_args(p, "the handout's memory_profiling size, 2026: xl, 2025: 2.7B")
    p.add_argument("--context-length", type=results.positive_int, nargs="+", default=None,
                   help="sequence length(s) (default: the handout's memory_profiling contexts, 2026: 128 "
                        "2048, 2025: 128 256 512; with --checkpoint K > 0, gradient_checkpointing's 2048)")
    results.add_workload_args(p, MODES, DTYPES, ATTENTION, several_modes=True, several_warmups=False,
                              warmup=3, steps=5)
    common.add_model_args(p, "ours = optim.AdamW; torch = torch.optim.AdamW in a training step; several to "
                             "compare their peaks", flops=False)
    p.add_argument("--checkpoint", type=results.non_negative_int, nargs="+", default=[0], metavar="K",
                   help="activation checkpointing every K blocks (0 = off): each K's predicted peak (any "
                        "device) beside its measured peak (CUDA), with the nested strategy's")
    p.add_argument("--compile", action="store_true",
                   help="count what torch.compile(block, fullgraph=True) saves for backward, as the 2026 "
                        "handout's §3.2 (real tensors: ~8 GiB at xl, ctx 2048); CUDA's step runs compiled")
    results.add_shape_args(p, "override the preset's {}",
                           num_heads="number of heads (§3.2 of the 2026 handout builds the xl block with 16)")
    p.add_argument("--batch-size", type=results.positive_int, default=None,
                   help=f"batch size (default {DEFAULT_BATCH_SIZE}; the handout's with --checkpoint K > 0)")
    p.add_argument("--snapshot", action="store_true", help="CUDA: record the allocator's history over one "
                   "more step: pickle, timeline PNG and HTML, largest allocations, the peak check")
    p.add_argument("--max-entries", type=results.positive_int, default=1_000_000,
                   help="allocator events --snapshot keeps (a ring buffer)")
    p.add_argument("--top", type=results.positive_int, default=10,
                   help="rows in the largest-allocations tables")
    p.add_argument("--analyze", metavar="PICKLE", default=None,
                   help="read a saved snapshot (anyone's) instead of running: tables, PNG and HTML; no GPU")
    p.add_argument("--code-root", metavar="DIR", default=None, help="--analyze: the folder whose lines the "
                   "tables name (default: the most common source root of the snapshot's Python frames)")
    results.add_device_args(p)
    runner.add_sweep_args(p)
    results.add_output_args(p, default_stem="memory-<UTC time>")
    report.add_columns_and_plot_args(p, "mem_profile")
    results.add_dry_run_arg(p)
    args = p.parse_args(argv)
    if args.analyze is not None:
        results.refuse(p, [
            (args.dry_run, "--dry-run lists a sweep's configurations; --analyze runs none"),
            (not Path(args.analyze).is_file(), f"--analyze: no such file: {args.analyze}")])
        args.code_root = PurePosixPath(Path(args.code_root).absolute()) if args.code_root else None
        return args, []
    results.refuse(p, [(args.code_root is not None, "--code-root goes with --analyze")])
    common.device_or_exit(p, args.device)
    report.columns_or_exit(p, args.columns, MEMORY_PEAK_COLUMNS)
    handout = results.handout_or_exit(p, args)
    common.models_or_exit(p, args, {"--attn": args.attn is not None,
                                    "--checkpoint": any(args.checkpoint)})
    size, batch, contexts = handout.memory_size, DEFAULT_BATCH_SIZE, handout.memory_contexts
    if any(args.checkpoint) and handout.checkpoint_setup is not None:  # gradient_checkpointing (b)'s setup
        size, batch, *contexts = handout.checkpoint_setup
    sizes = results.sizes_or_exit(p, args, args.size or [size])
    runs, shape = [], {flag: getattr(args, flag) for flag in results.SHAPE_FLAGS}
    try:
        for size, ctx, mode, dtype, model, attn, k, optimizer in itertools.product(
                sizes, args.context_length or contexts, args.mode, args.dtype, args.model,
                args.attn or ["naive"], args.checkpoint, args.optimizer):
            ours = model == common.OURS  # our attention and checkpointing do not multiply your rows
            runs.append(MemConfig(
                size, get_config(size, args.handout, context_length=ctx, **shape),
                args.handout, args.batch_size or batch, args.warmup, args.steps, mode, dtype,
                attn if ours else "naive", k if ours else 0, args.compile, common.model_factory(model),
                optimizer if mode == "train" else common.OURS, args.device, args.seed))
    except results.ConfigError as exc:
        p.error(str(exc))
    runs = list(dict.fromkeys(runs))
    for run in runs:
        results.check_tensor_sizes(p, results.model_tensor_shapes(run.model, run.batch_size))
    return args, runs


# --- build ---


def find_blocks(model: nn.Module) -> tuple[str, list[nn.Module]]:
    """(name, blocks): the nn.ModuleList of one repeated class holding the most parameters; ("", []) if none."""
    lists = [(name, m) for name, m in model.named_modules()
             if isinstance(m, nn.ModuleList) and len(m) and len({type(c) for c in m}) == 1]
    name, blocks = max(lists, key=lambda item: sum(p.numel() for p in item[1].parameters()), default=("", []))
    return name, list(blocks)


def first_block(model: nn.Module, run: MemConfig) -> nn.Module:
    blocks = find_blocks(model)[1]
    if not blocks:
        raise ValueError(f"{run.model_factory or 'the model'} has no nn.ModuleList of repeated blocks")
    return blocks[0]


@contextlib.contextmanager
def fake_model(run: MemConfig, device: torch.device, fake: bool = True) -> Any:
    """The model and token ids on fake tensors (a real run's graph and dtypes, no memory: 2.7B takes seconds)."""
    with torch.device("meta" if fake else device):
        model = build_model(run.model, run.attn, run.checkpoint_every, run.model_factory)
    with FakeTensorMode(allow_non_fake_inputs=True) if fake else contextlib.nullcontext():
        yield (model.to_empty(device=device) if fake else model,  # to_empty: meta weights become fake ones
               torch.randint(0, run.model.vocab_size, (run.batch_size, run.context_length), device=device))


# --- measure: the peak of a step (CUDA) ---


def measure_peak(run: MemConfig, snapshot_path: str | None, max_entries: int) -> dict[str, Any]:
    """The training step (runner.Workload.untimed_step): warm-up steps, the peak counter reset, then `steps` timed
    steps: their peak allocated and reserved."""
    device = resolve_device(run.device)  # CUDA: measure() calls this only there
    step = Workload(RunConfig(**{f.name: getattr(run, f.name) for f in dataclasses.fields(run)})).untimed_step
    for _ in range(run.warmup):  # the first step compiles (--compile) and allocates AdamW's moments
        step()
    common.reset_peak_memory(device)
    timer, times_ms = SyncTimer(device), []
    for _ in range(run.steps):
        with timer:  # synchronised at both ends: the step's kernels are done
            step()
        times_ms.append(timer.elapsed_s * 1e3)
    record = {"environment": common.environment(device), "step_ms": times_ms, **common.peak_memory_bytes(device),
              **{f"step_ms_{k}": v for k, v in results.summarize(times_ms).items()}}
    if snapshot_path:
        record.update(record_snapshot(step, device, snapshot_path, max_entries))
    return record


def snapshot_meta_path(pickle_path: str | Path) -> Path:  # phase marks and the peaks of the recorded step
    return Path(pickle_path).with_name(Path(pickle_path).stem + "_meta.json")


def record_snapshot(step: Callable[..., None], device: torch.device, path: str,
                    max_entries: int) -> dict[str, Any]:
    """One more step with the allocator's history recorded (Python stacks), dumped to `path`; recording stops
    whatever happens. The trace holds requested sizes, as requested_bytes.all.peak does."""
    marks: list[tuple[str, float]] = []
    torch.cuda.reset_peak_memory_stats(device)
    torch.cuda.memory._record_memory_history(enabled="all", stacks="python", max_entries=max_entries)
    try:
        step(lambda phase: marks.append((phase, time.time_ns() / 1e3)))  # µs since the epoch, as the trace
        torch.cuda.synchronize(device)
        torch.cuda.memory._dump_snapshot(path)
    finally:
        torch.cuda.memory._record_memory_history(enabled=None)
    meta = {"phase_marks": marks, "max_memory_allocated_bytes": torch.cuda.max_memory_allocated(device),
            "requested_bytes_peak": torch.cuda.memory_stats(device).get("requested_bytes.all.peak")}
    snapshot_meta_path(path).write_text(json.dumps(meta))
    return {"snapshot_path": path, "snapshot_meta": meta}


# --- measure: what autograd saves for backward (any device) ---


class CreatedIn(TorchDispatchMode):
    """Which module each storage was made in: the innermost one running, through module hooks (the shared
    RoPE cache takes its caller's path). Every tensor made is kept, so no storage key is reused meanwhile."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.paths: dict[int, list[str]] = {}
        for path, module in model.named_modules(remove_duplicate=False):
            self.paths.setdefault(id(module), []).append(path)
        self.stack, self.module_of, self.outputs = [""], {}, []
        self.hooks = [nn.modules.module.register_module_forward_pre_hook(self.enter),
                      nn.modules.module.register_module_forward_hook(self.exit)]

    def enter(self, module: nn.Module, args: Any) -> None:
        paths = self.paths.get(id(module), [type(module).__name__])
        prefix = self.stack[-1] + "." if self.stack[-1] else ""
        self.stack.append(next((p for p in paths if p.startswith(prefix)), paths[0]))

    def exit(self, *_: Any) -> None:  # (a forward hook that returned something would replace the output)
        self.stack.pop()

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        out = func(*args, **(kwargs or {}))
        for t in pytree.tree_leaves(out):
            if isinstance(t, torch.Tensor):
                self.outputs.append(t)
                self.module_of.setdefault(storage_key(t), self.stack[-1])
        return out


def saved_for_backward(run: MemConfig, device: torch.device = torch.device("cpu"), fake: bool = True,
                       backward: bool = False) -> dict[str, Any]:
    """Every storage autograd saves in the forward and loss, once each, with the module that made it (weights
    and buffers left out); the blocks, parameters, a block's gradient bytes, the largest transient."""
    with fake_model(run, device, fake) as (model, tokens):
        prefix, blocks = find_blocks(model)
        resident = {storage_key(t) for t in itertools.chain(model.parameters(), model.buffers())}
        made = CreatedIn(model)

        def describe(t: torch.Tensor) -> dict[str, Any]:
            base = t._base if t._base is not None else t  # a view: the tensor that owns the storage
            op = re.sub(r"Backward\d*$", "", base.grad_fn.name()) if base.grad_fn else "(no grad_fn)"
            return {"bytes": t.untyped_storage().nbytes(), "module": made.module_of.get(storage_key(t), ""),
                    "shape": list(base.shape), "dtype": common.dtype_name(base.dtype), "op": op}
        try:
            with saved_tensors(describe, exclude=resident) as saved, made:
                with torch.enable_grad(), precision_context(device, run.dtype):
                    logits = model(tokens)
                    # before the loss: one line, not a fake-tensor traceback
                    check_logits(logits, (run.batch_size, run.context_length), run.model.vocab_size,
                                 run.model_factory)
                    loss = cross_entropy(logits, tokens)
            if backward:
                with made:
                    loss.backward()
        finally:
            for hook in made.hooks:
                hook.remove()
        grads = {storage_key(p.grad) for p in model.parameters() if p.grad is not None}
        return {"rows": list(saved.values()), "params": sum(p.numel() for p in model.parameters()),
                "blocks": [f"{prefix}.{i}" if prefix else str(i) for i in range(len(blocks))],
                "block_grad_bytes": (sum(p.numel() * p.element_size() for p in blocks[0].parameters())
                                     if blocks else None),
                "transient_bytes": max((t.untyped_storage().nbytes() for t in made.outputs
                                        if storage_key(t) not in resident | set(saved) | grads), default=0)}


def block_of(module: str, block_paths: list[str]) -> str | None:
    """The block whose path `module` (e.g. 'layers.3.ffn.w1') lies under, or None."""
    return next((p for p in block_paths if module == p or module.startswith(p + ".")), None)


def summarize_saved(saved: dict[str, Any], top_block: int = 5, top_outside: int = 3) -> dict[str, Any]:
    """Saved bytes per block (by the block that produced them), outside the blocks (embedding, final norm,
    head, loss) and in all; the largest groups of tensors per block (averaged over blocks) and outside."""
    paths = saved["blocks"]
    per_block = dict.fromkeys(paths, 0)
    groups, counts = Counter(), Counter()  # bytes and tensors by (in a block, module, op, shape, dtype)
    for s in saved["rows"]:
        block = block_of(s["module"], paths)
        if block is not None:
            per_block[block] += s["bytes"]
        inner = (s["module"][len(block) + 1:] or "(block)") if block else (s["module"] or "(model)")
        key = (block is not None, inner, s["op"], "x".join(map(str, s["shape"])), s["dtype"])
        groups[key] += s["bytes"]
        counts[key] += 1
    blocks_total = sum(per_block.values())
    outside = sum(total for key, total in groups.items() if not key[0])
    n = max(len(paths), 1)

    def top(inside: bool, limit: int, per: int, of: int) -> list[dict[str, Any]]:
        rows = [(key, total) for key, total in groups.most_common() if key[0] == inside][:limit]
        return [{"module": key[1], "op": key[2], "shape": key[3], "dtype": key[4], "bytes": total / per,
                 "tensors": counts[key] / per, "share": total / of if of else 0.0} for key, total in rows]
    return {"saved_block_bytes_mean": blocks_total / n,
            "saved_block_bytes_max": max(per_block.values(), default=0),
            "saved_blocks_bytes": blocks_total, "saved_outside_bytes": outside,
            "saved_total_bytes": blocks_total + outside, "saved_storages": len(saved["rows"]),
            "num_blocks": len(paths), "saved_block_top": top(True, top_block, n, blocks_total),
            "saved_outside_top": top(False, top_outside, 1, blocks_total + outside)}


# --- measure: the handout's compiled block (§3.2) ---


def count_saved(fn: Callable[..., Any], *args: Any) -> tuple[int, int, Any]:
    """The handout's count of what fn(*args) saves for backward: every tensor autograd packs, numel x element
    size (a view or a tensor saved twice counts again), nn.Parameters left out. (bytes, tensors, output)."""
    sizes = []

    def pack(t: torch.Tensor) -> torch.Tensor:
        if not isinstance(t, nn.Parameter):
            sizes.append(t.numel() * t.element_size())
        return t
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = fn(*args)
    return sum(sizes), len(sizes), out


def compiled_block_record(run: MemConfig) -> dict[str, Any]:
    """A one-layer model's block under torch.compile(block, fullgraph=True) on a real input, counted as the
    handout counts (inductor recomputes cheap pointwise ops in backward); beside it eager, on fake tensors."""
    device = resolve_device(run.device)
    one = dataclasses.replace(run, model=dataclasses.replace(run.model, num_layers=1), checkpoint_every=0)
    shape = (run.batch_size, run.context_length, run.model.d_model)
    with fake_model(one, device) as (model, _), precision_context(device, run.dtype):
        eager_bytes, eager_tensors, _ = count_saved(first_block(model, run),
                                                    torch.randn(shape, device=device, requires_grad=True))
    torch.manual_seed(run.seed)
    with fake_model(one, device, fake=False) as (model, _), precision_context(device, run.dtype):
        x = torch.randn(shape, device=device, requires_grad=True)
        with SyncTimer(device) as compiling:  # the first call compiles: its time is the compile time
            compiled_bytes, compiled_tensors, _ = count_saved(
                torch.compile(first_block(model, run), fullgraph=True), x)
    return {"block_eager_saved_bytes": eager_bytes, "block_eager_saved_tensors": eager_tensors,
            "block_compiled_saved_bytes": compiled_bytes, "block_compiled_saved_tensors": compiled_tensors,
            "block_compile_s": compiling.elapsed_s}


# --- predict: the peak with activation checkpointing ---


class LiveBytes(TorchDispatchMode):
    """The bytes of the storages ops make, while they live, and their peak: on fake tensors, a real run's memory
    without the memory. (torch's MemTracker refuses a module run twice a step, as our shared RoPE is.)"""

    def __init__(self) -> None:
        super().__init__()
        self.live = self.peak = 0
        self.seen: weakref.WeakSet = weakref.WeakSet()

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        out = func(*args, **(kwargs or {}))
        given = {id(t.untyped_storage()) for t in pytree.tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)}
        for t in pytree.tree_leaves(out):  # an in-place op or a view returns a storage it was given
            if isinstance(t, torch.Tensor) and id(st := t.untyped_storage()) not in given and st not in self.seen:
                self.seen.add(st)
                self.live += st.nbytes()
                self.peak = max(self.peak, self.live)
                weakref.finalize(st, self.free, st.nbytes())
        return out

    def free(self, nbytes: int) -> None:
        self.live -= nbytes


def block_backward_bytes(run: MemConfig, device: torch.device) -> int:
    """How far one block's backward rises above what its forward left (its saved tensors, its output and the
    incoming gradient): the recomputed segment's temporaries, softmax's several score-sized ones among them."""
    one = dataclasses.replace(run, model=dataclasses.replace(run.model, num_layers=1))
    with fake_model(one, device) as (model, _), precision_context(device, run.dtype), LiveBytes() as live:
        x = torch.randn(run.batch_size, run.context_length, run.model.d_model, device=device, requires_grad=True)
        out = first_block(model, run)(x)
        grad_out = torch.ones_like(out)
        start = live.peak = live.live
        out.backward(grad_out)
    return live.peak - start


@functools.lru_cache(maxsize=16)
def activation_figures(run: MemConfig, device: torch.device) -> dict[str, int]:
    """What every K's prediction needs, from `run` without checkpointing (so cached): what a block keeps and
    how far its backward rises above it, what the rest keeps, the largest transient, a block's and the
    embedding's grads."""
    saved = saved_for_backward(run, device, backward=run.mode != "forward")
    summary = summarize_saved(saved)
    return {"block_bytes": int(summary["saved_block_bytes_max"]),
            "outside_bytes": summary["saved_outside_bytes"], "transient_bytes": saved["transient_bytes"],
            "block_transient_bytes": block_backward_bytes(run, device) if run.mode != "forward" else 0,
            "block_grad_bytes": saved["block_grad_bytes"],
            "embedding_grad_bytes": run.model.vocab_size * run.model.d_model * FP32_BYTES}


def static_memory_bytes(cfg: ModelConfig, mode: str, num_params: int | None = None) -> dict[str, int]:
    """fp32 weights (master copies under autocast too), gradients, AdamW's moments; num_params None: ours."""
    weights = (cfg.num_params if num_params is None else num_params) * FP32_BYTES
    return {"weights_bytes": weights, "grads_bytes": weights if mode != "forward" else 0,
            "adamw_state_bytes": 2 * weights if mode == "train" else 0}


def peak_moments(kept: int, recomputed_blocks: int, figures: dict[str, int], static: dict[str, int],
                 mode: str) -> dict[str, int]:
    """Bytes in use when a step's peak can fall: backward's start; the first segment's backward, which runs
    last (its blocks recomputed); backward's end; the optimizer step (+ our AdamW's denominator)."""
    state = static["weights_bytes"] + static["adamw_state_bytes"]
    held = state + kept + figures["outside_bytes"]
    if mode == "forward":
        return {"forward ends": held + figures["transient_bytes"]}
    # backward starts with the loss's gradient (the largest transient), then the last block's backward rises
    moments = {"backward starts": held + max(figures["transient_bytes"], figures["block_transient_bytes"])}
    if recomputed_blocks:
        later_grads = (static["grads_bytes"] - figures["embedding_grad_bytes"]
                       - recomputed_blocks * figures["block_grad_bytes"])
        moments["first segment's backward"] = (state + later_grads + kept + figures["block_transient_bytes"]
                                               + recomputed_blocks * figures["block_bytes"])
    moments["backward ends"] = state + static["grads_bytes"]
    if mode == "train":
        moments["optimizer step"] = moments["backward ends"] + static["weights_bytes"]
    return moments


def checkpoint_prediction(run: MemConfig, kept_bytes: int, figures: dict[str, int]) -> dict[str, Any]:
    """The predicted peak with checkpointing every K blocks, for this K and K = 0..N (ceil(N/K) segment inputs
    kept, K blocks recomputed), and nested (ceil(log2 N) + 1 inputs kept, one block recomputed)."""
    n, static = run.model.num_layers, static_memory_bytes(run.model, run.mode)
    b = run.batch_size * run.context_length * run.model.d_model * FP32_BYTES  # a segment's input

    def peak(kept: int, blocks: int) -> tuple[int, str]:
        moments = peak_moments(kept, blocks, figures, static, run.mode)
        moment = max(moments, key=moments.get)
        return moments[moment], moment

    def single(k: int) -> tuple[int, str]:
        return peak(n * figures["block_bytes"] if k == 0 else -(-n // k) * b, min(k, n))

    predicted, moment = single(run.checkpoint_every)
    curve = [{"k": k, "predicted_peak_bytes": single(k)[0]} for k in range(n + 1)]
    best = min(curve, key=lambda point: point["predicted_peak_bytes"])
    nested_kept = (math.ceil(math.log2(n)) + 1) * b
    return {**figures, "state_bytes": static["weights_bytes"] + static["adamw_state_bytes"],
            "grads_bytes": static["grads_bytes"], "boundary_bytes": b, "kept_bytes": kept_bytes,
            "predicted_peak_bytes": predicted, "peak_moment": moment, "curve": curve, "best_k": best["k"],
            "best_predicted_peak_bytes": best["predicted_peak_bytes"],
            "sqrt_k": math.sqrt(n * b / figures["block_bytes"]) if figures["block_bytes"] else None,
            "nested_kept_bytes": nested_kept, "nested_predicted_peak_bytes": peak(nested_kept, 1)[0]}


# --- the snapshot reader (anyone's, no GPU) ---

BEFORE_RECORDING = "(allocated before recording: weights, optimizer state, ...)"


class DataOnlyUnpickler(pickle.Unpickler):
    """A CUDA snapshot is plain data: any global (a class or function: how a pickle runs code) is refused."""

    def find_class(self, module: str, name: str) -> Any:
        raise pickle.UnpicklingError(f"refused {module}.{name}: a memory snapshot holds only plain data")


def load_snapshot(path: str | Path) -> dict[str, Any]:
    """A pickle written by torch.cuda.memory._dump_snapshot (what torch.cuda.memory._snapshot() returns)."""
    with open(path, "rb") as f:
        snapshot = DataOnlyUnpickler(f).load()
    if not isinstance(snapshot, dict) or not isinstance(snapshot.get("device_traces"), list):
        raise ValueError("not a CUDA memory snapshot (no list of 'device_traces'; record one with "
                         "torch.cuda.memory._record_memory_history)")
    if not any(snapshot["device_traces"]):  # _dump_snapshot without recording: the end state only, no peak
        raise ValueError("the snapshot holds no allocation trace; record one: call torch.cuda.memory."
                         "_record_memory_history(max_entries=1000000) before the step you dump")
    segments = snapshot.get("segments") or []
    for n in itertools.chain((e.get("size", 0) for trace in snapshot["device_traces"] for e in trace),
                             (s.get("total_size", 0) for s in segments),
                             (b.get(k, 0) for s in segments for b in s.get("blocks", [])
                              for k in ("size", "requested_size"))):
        if type(n) is not int or not 0 <= n <= results.INT64_MAX:  # NaN, a string, a negative, past int64
            raise ValueError(f"a size of {n!r}; a snapshot's sizes are whole numbers of bytes, 0 to 2**63 - 1")
    checked: dict[int, list] = {}  # a list of frames shared by many entries is checked once
    for e in (e for trace in snapshot["device_traces"] for e in trace):
        if not isinstance(e, dict) or not isinstance(e.get("action"), str):
            raise ValueError(f"a trace entry {str(e)[:80]}; each is a dict with an 'action'")
        if "time_us" in e and not results.number(e["time_us"]):
            raise ValueError(f"a time_us of {e['time_us']!r}; a snapshot's times are numbers (µs)")
        frames = e.get("frames", NO_FRAMES)
        if id(frames) not in checked and not (isinstance(frames, (list, tuple)) and all(
                isinstance(f, dict) and isinstance(f.get("filename"), str) and type(f.get("line")) is int
                and isinstance(f.get("name"), str) for f in frames)):
            raise ValueError(f"frames {str(frames)[:80]}; each frame has a filename, a line and a name")
        checked[id(frames)] = frames
    return snapshot


def device_trace(snapshot: dict[str, Any]) -> tuple[int, list[dict[str, Any]]]:
    """(device, its trace): the first device with a non-empty trace."""
    traces = snapshot["device_traces"] or [[]]
    device = next((i for i, trace in enumerate(traces) if trace), 0)
    return device, traces[device]


def replay(trace: list[dict[str, Any]]) -> tuple[list[int], list[int], dict[int, dict], int]:
    """Allocated and reserved bytes after each entry, the allocations live at the end, the bytes freed of blocks
    from before recording. Frees count at free_requested, as memory_allocated does; map: expandable segments."""
    live: dict[int, dict] = {}
    pending: set[int] = set()
    level = held = before = 0
    allocated, reserved = [], []
    for entry in trace:
        action, addr, size = entry["action"], entry.get("addr"), entry.get("size", 0)
        if action == "alloc":
            pending.discard(addr)
            live[addr] = entry
            level += size
        elif action == "free_completed" and addr in pending:  # already counted at free_requested
            pending.discard(addr)
        elif action in ("free_requested", "free_completed"):
            pending.add(addr)
            freed = live.pop(addr, None)
            before += size if freed is None else 0  # a block allocated before recording began
            level -= size if freed is None else freed["size"]
        elif action in ("segment_alloc", "segment_map"):
            held += size
        elif action in ("segment_free", "segment_unmap"):
            held -= size
        allocated.append(level)
        reserved.append(held)
    return allocated, reserved, live, before


@dataclass
class Timeline:
    """Allocated and reserved bytes after every trace entry of one device."""

    times_us: list[float] | None  # host clock, µs since the epoch; None if not recorded
    allocated_bytes: list[int]
    reserved_bytes: list[int]  # empty when nothing says what the allocator held
    baseline_bytes: int  # allocated when recording began
    baseline_reserved_bytes: int
    freed_before_recording_bytes: int
    peak_bytes: int
    peak_index: int  # entry after which the peak is first reached; -1 = at the start


def rebuild_timeline(snapshot: dict[str, Any]) -> Timeline:
    """The trace replayed from the level at recording's start: what the segments held at the end less the
    trace's net change, never less than what it frees of blocks it never allocated."""
    device, trace = device_trace(snapshot)
    allocated, reserved, _, before = replay(trace)
    segments = [s for s in snapshot.get("segments", []) if s.get("device", device) == device]
    end_alloc = sum(b.get("requested_size", b["size"]) for s in segments for b in s.get("blocks", [])
                    if b.get("state") == "active_allocated")
    base = max(end_alloc - (allocated[-1] if allocated else 0), before)
    allocated = [a + base for a in allocated]
    base_reserved = 0
    if segments or any(e["action"].startswith("segment_") for e in trace):
        end_reserved = sum(s["total_size"] for s in segments)
        base_reserved = max(end_reserved - (reserved[-1] if reserved else 0), -min(reserved, default=0), base)
        reserved = [r + base_reserved for r in reserved]
    else:
        reserved = []
    peak = max([base] + allocated)
    times = [e["time_us"] for e in trace] if trace and all("time_us" in e for e in trace) else None
    return Timeline(times, allocated, reserved, base, base_reserved, before, peak,
                    allocated.index(peak) if peak > base else -1)


# Frames that are nobody's own code: installed packages and the standard library, wherever they sit.
_LIBRARY = re.compile(r"/(site|dist)-packages/|/lib/python3\.\d+/|^<")
# C++ frames that say nothing about who asked: unwinding, the recorder, the allocator, creation, dispatch.
_CPP_NOISE = re.compile(r"unwind|CapturedTraceback|gather_with_cpp|CachingAllocator|Allocator::|empty_|"
                        r"_empty|TensorImpl|TensorBase|TensorIterator|create_out|set_output|"
                        r"wrap_kernel_functor|c10::impl::|c10::Dispatcher|boxed|redispatch|^\?\?$|^$")


@functools.lru_cache(maxsize=65536)  # a few files hold every frame
def own_file(filename: str, root: PurePosixPath) -> str | None:
    """`filename` relative to `root` when it is the user's own Python file under it (compared as text: a
    snapshot is often read on another machine than the one that recorded it)."""
    if not filename.endswith(".py") or _LIBRARY.search(filename):
        return None
    path = PurePosixPath(filename)
    return str(path.relative_to(root)) if path.is_relative_to(root) else None


def stacks(snapshot: dict[str, Any]) -> dict[int, tuple[list, int]]:
    """The allocations' distinct stacks with how many allocations have each: a pickle keeps one list for the
    allocations that share a stack, so each is read once (the time stays linear in the snapshot's size)."""
    found: dict[int, tuple[list, int]] = {}
    for e in device_trace(snapshot)[1]:
        if e.get("action") == "alloc":
            frames = e.get("frames", NO_FRAMES)
            found[id(frames)] = (frames, found.get(id(frames), (None, 0))[1] + 1)
    return found


def code_root(snapshot: dict[str, Any], near_all: float = 0.9) -> PurePosixPath | None:
    """The source root of the snapshot's own Python frames: the deepest folder below '/' that holds nearly all
    (near_all) of them; None when there is none, or no frame is anyone's own code."""
    files: Counter = Counter()
    for frames, n in stacks(snapshot).values():
        for f in frames:
            if own_file(f["filename"], PurePosixPath("/")):
                files[PurePosixPath(f["filename"]).parts] += n
    held: Counter = Counter()  # frames under each folder, '/' left out
    for parts, n in files.items():
        for i in range(2, len(parts)):
            held[parts[:i]] += n
    deepest = max((p for p, n in held.items() if n >= near_all * files.total()), key=len, default=None)
    return PurePosixPath(*deepest) if deepest else None


def cpp_site(names: list[str]) -> str:
    """A stack without a Python frame (autograd's backward thread, a C++ caller), named by the autograd node
    and the operator that allocated, else by its first frame (function name) that is not plumbing."""
    node = next((m.group(1) for n in names
                 if (m := re.search(r"autograd::(?:generated::)?(\w+)::apply\(", n))), None)
    ops = [m.group(1) for n in names if (m := re.search(r"at::_ops::(\w+)::call\(", n))]
    op = next((op for op in ops if not re.match(r"(new_)?(empty|zeros)(_|$)", op)), ops[0] if ops else None)
    if node:
        return f"{node}{f' > {op}' if op else ''} (no Python frame: autograd's C++ backward)"
    if op:
        return f"{op} (no Python frame: C++ operator)"
    meaningful = next((n for n in names if not _CPP_NOISE.search(n)), None)
    if meaningful:
        return f"{re.sub(r'[(<].*', '', meaningful)} (no Python frame: C++)"
    return "(no Python frame: C++ allocator frames only)"


@functools.lru_cache(maxsize=65536)  # a trace repeats a few stacks millions of times
def _site(frames: tuple[tuple[str, int, str], ...], root: PurePosixPath) -> str:
    for filename, line, name in frames:
        if relative := own_file(filename, root):
            return f"{relative}:{line} {name}"
    for filename, line, name in frames:
        if filename.endswith(".py"):
            return f"{PurePosixPath(filename).name}:{line} {name} (outside the project)"
    return cpp_site([name for _, _, name in frames])


def allocation_site(frames: list[dict[str, Any]], root: PurePosixPath) -> str:
    """'file.py:line function' of the innermost frame under `root`, else of any Python frame, else C++."""
    return _site(tuple((f["filename"], f["line"], f["name"]) for f in frames), root)


NO_FRAMES: tuple = ()


def site_namer(root: PurePosixPath) -> Callable[[dict[str, Any]], str]:
    """allocation_site of an entry's frames, each list of frames (shared by many allocations) named once."""
    named: dict[int, tuple[Any, str]] = {}  # id -> (the frames, kept alive so the id stays theirs; the site)

    def name(entry: dict[str, Any]) -> str:
        frames = entry.get("frames", NO_FRAMES)
        if id(frames) not in named:
            named[id(frames)] = (frames, allocation_site(frames, root))
        return named[id(frames)][1]
    return name


def largest_allocations(snapshot: dict[str, Any], top: int, root: PurePosixPath,
                        spans: list[tuple[str, float, float]] = ()) -> list[dict[str, Any]]:
    """The `top` largest allocation sizes: how many allocations of each, the sites and the phases."""
    by_size: dict[int, tuple[Counter, Counter]] = {}
    site = site_namer(root)
    for e in device_trace(snapshot)[1]:
        if e["action"] == "alloc":
            sites, phases = by_size.setdefault(e["size"], (Counter(), Counter()))
            sites[site(e)] += 1
            phases.update(name for name, begin, end in spans if begin <= e.get("time_us", -1) < end)
    rows = []
    for size in sorted(by_size, reverse=True)[:top]:
        sites, phases = by_size[size]
        count = sites.total()
        named = "; ".join(f"{site} (x{n})" for site, n in sites.most_common(2))
        rows.append({"size_bytes": size, "count": count, "total_bytes": size * count,
                     "sites": named + (f"; +{len(sites) - 2} more" if len(sites) > 2 else ""),
                     "phases": ", ".join(f"{p} x{n}" for p, n in phases.most_common())})
    return rows


def live_at_peak(snapshot: dict[str, Any], timeline: Timeline, top: int, root: PurePosixPath) -> list[dict]:
    """The bytes live at the peak by site, largest first, after a row for what was allocated before recording."""
    live = replay(device_trace(snapshot)[1][: timeline.peak_index + 1])[2]
    sizes, counts, site_of = Counter(), Counter(), site_namer(root)  # by site: bytes, allocations
    for entry in live.values():
        site = site_of(entry)
        sizes[site] += entry["size"]
        counts[site] += 1
    rows = [{"site": BEFORE_RECORDING, "count": None, "bytes": timeline.peak_bytes - sum(sizes.values())}]
    rows += [{"site": site, "count": counts[site], "bytes": n} for site, n in sizes.most_common(top)]
    if rest := sum(sizes.values()) - sum(r["bytes"] for r in rows[1:]):
        rows.append({"site": f"(other sites: {len(sizes) - top})", "count": None, "bytes": rest})
    peak = timeline.peak_bytes
    return [{**row, "share": row["bytes"] / peak if peak else 0.0} for row in rows]


def peak_check(rebuilt: int, requested: int | None, allocated: int | None = None,
               tolerance: float = 0.01) -> dict:
    """The peak rebuilt from the trace against requested_bytes.all.peak, its exact counterpart (both count
    requested sizes); max_memory_allocated (rounded blocks, 2-3% above for large models) shown beside it."""
    row: dict[str, Any] = {"rebuilt_peak_bytes": rebuilt, "requested_peak_bytes": requested,
                           "max_memory_allocated_bytes": allocated}
    if allocated is not None:
        row["allocator_rounding_bytes"] = allocated - rebuilt
    if requested is None:
        return {**row, "status": "no requested_bytes.all.peak recorded with this snapshot"}
    diff = requested - rebuilt
    return {**row, "diff_bytes": diff, "status": "ok (exact)" if not diff else f"ok (within {tolerance:.0%})"
            if abs(diff) <= tolerance * requested else f"MISMATCH (more than {tolerance:.0%} apart)"}


def analyze_snapshot(snapshot: dict[str, Any], meta: dict[str, Any], top: int,
                     root: PurePosixPath | None = None) -> tuple[dict[str, Any], Timeline, list]:
    """The tables' fields (peak check, largest allocations, live at the peak), the timeline and the phases."""
    timeline = rebuild_timeline(snapshot)
    marks = [tuple(m) for m in meta.get("phase_marks") or []]
    spans = [(name, start, end) for (name, start), (_, end) in zip(marks, marks[1:]) if name != "end"]
    root = root or code_root(snapshot) or PurePosixPath(PROJECT_ROOT)
    fields = {"snapshot_peak_check": peak_check(timeline.peak_bytes, meta.get("requested_bytes_peak"),
                                                meta.get("max_memory_allocated_bytes")),
              "snapshot_largest": largest_allocations(snapshot, top, root, spans),
              "snapshot_live_at_peak": live_at_peak(snapshot, timeline, top, root),
              "snapshot_code_root": str(root)}
    return fields, timeline, spans


def write_timeline(snapshot: dict[str, Any], timeline: Timeline, spans: list, stem: Path, title: str) -> dict:
    """<stem>.html: torch's viewer; <stem>.png: allocated and reserved memory, phases shaded, the peak marked."""
    from torch.cuda import _memory_viz
    html = stem.with_suffix(".html")
    html.write_text(_memory_viz.trace_plot(snapshot))
    out: dict[str, Any] = {"snapshot_html": str(html)}
    try:
        from matplotlib.figure import Figure
    except ImportError:
        return {**out, "snapshot_png_note": "the timeline PNG needs matplotlib: pip install matplotlib"}
    unit, scale = ("GiB", 2**30) if timeline.peak_bytes >= 2**30 else ("MiB", 2**20)
    t0 = timeline.times_us[0] if timeline.times_us else 0
    xs = ([(t - t0) / 1e3 for t in timeline.times_us] if timeline.times_us
          else list(range(len(timeline.allocated_bytes))))
    ax = (fig := Figure(figsize=(10, 4.5))).add_subplot()
    ax.step([0] + xs, [b / scale for b in [timeline.baseline_bytes] + timeline.allocated_bytes],
            where="post", color="black", label="allocated (tensors)")
    if timeline.reserved_bytes:
        ax.step([0] + xs, [b / scale for b in [timeline.baseline_reserved_bytes] + timeline.reserved_bytes],
                where="post", color="gray", linestyle="--", label="reserved (allocator segments)")
    for name, begin, end in spans if timeline.times_us else ():
        color = {"forward": "tab:blue", "backward": "tab:orange"}.get(name, "tab:green")
        ax.axvspan((begin - t0) / 1e3, (end - t0) / 1e3, color=color, alpha=0.15, label=name)
    peak_x, peak_y = xs[timeline.peak_index] if timeline.peak_index >= 0 else 0, timeline.peak_bytes / scale
    ax.plot([peak_x], [peak_y], "o", color="tab:red")
    ax.annotate(f"peak {peak_y:.2f} {unit}", (peak_x, peak_y), textcoords="offset points", xytext=(6, 4),
                color="tab:red")
    ax.set(xlabel="ms since recording began (host clock)" if timeline.times_us else "allocator event #",
           ylabel=f"{unit} (2^{30 if unit == 'GiB' else 20} bytes)", title=title,
           ylim=(0, max([timeline.peak_bytes, 1] + timeline.reserved_bytes) / scale * 1.12))
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.14), ncol=5, fontsize="small", frameon=False)
    fig.savefig(stem.with_suffix(".png"), dpi=150, bbox_inches="tight")
    return {**out, "snapshot_png": str(stem.with_suffix(".png"))}


# --- one configuration (in its child process) ---


@contextlib.contextmanager
def stage(record: dict[str, Any], prefix: str) -> Any:
    """`{prefix}status`: ok, or the stage's failure and traceback (a failure is data: the others still run)."""
    try:
        yield
        record[f"{prefix}status"] = "ok"
    except Exception as exc:  # noqa: BLE001
        record.update({f"{prefix}status": common.failure_status(exc), f"{prefix}traceback": traceback.format_exc()})


def measure(run: MemConfig, measure_peaks: bool, snapshot_prefix: str | None,
            max_entries: int) -> dict[str, Any]:
    """Saved for backward and the checkpointing prediction (any device), the compiled block, the peak (CUDA)."""
    device = resolve_device(run.device)
    record: dict[str, Any] = {}
    with stage(record, "saved_"):
        saved = saved_for_backward(run, device)
        record.update(summarize_saved(saved), model_num_params=saved["params"],
                      block_grad_bytes=saved["block_grad_bytes"])
        if run.model_factory is None:
            figures = activation_figures(dataclasses.replace(run, checkpoint_every=0), device)
            record["checkpoint_prediction"] = checkpoint_prediction(run, record["saved_blocks_bytes"], figures)
    if run.compile:
        with stage(record, "compiled_"):
            record.update(compiled_block_record(run))
    if not measure_peaks:  # the row's status is its saved stage's where that failed
        skipped = "skipped: measured peaks need a CUDA device"
        return {**record, "status": skipped if record["saved_status"] == "ok" else record["saved_status"]}
    path = f"{snapshot_prefix}_{re.sub(r'[= ]+', '_', run.label())}.pickle" if snapshot_prefix else None
    with stage(record, ""):
        record.update(measure_peak(run, path, max_entries))
    return record


def finish_record(run: MemConfig, record: dict[str, Any], top: int) -> None:
    """In the parent: the accounting (where the parameters were counted) and the snapshot's analysis."""
    record.setdefault("saved_status", record["status"])  # it died before its stages
    num_params = record.get("model_num_params")
    if num_params is not None or run.model_factory is None:
        cfg, batch, ctx = run.model, run.batch_size, run.context_length
        record.update(static_memory_bytes(cfg, run.mode, num_params))
        record["residual_stream_bytes"] = batch * ctx * cfg.d_model * FP32_BYTES  # fp32 even under autocast
        record["residual_stream_formula"] = f"{batch} x {ctx} x {cfg.d_model} x {FP32_BYTES} B"
        scores_item = DTYPES[run.dtype].itemsize  # the QK^T matmul's dtype
        record["attention_scores_layer_bytes"] = batch * cfg.num_heads * ctx * ctx * scores_item
        record["attention_scores_formula"] = f"{batch} x {cfg.num_heads} x {ctx} x {ctx} x {scores_item} B"
    if "snapshot_path" in record:
        path = Path(record["snapshot_path"])
        try:
            snapshot = load_snapshot(path)
            fields, timeline, spans = analyze_snapshot(snapshot, record["snapshot_meta"], top)
            stem = path.with_name(path.stem + "_timeline")
            record.update(fields, **write_timeline(snapshot, timeline, spans, stem, run.label()))
        except Exception as exc:  # noqa: BLE001 - the measurement stands; the analysis failure is a field
            record["snapshot_status"] = common.failure_status(exc)


# --- main ---


def analyze_main(args: argparse.Namespace, files: ResultFiles) -> int:
    """--analyze: the tables on stdout, then the files (a full disk after the tables: one line, exit 1)."""
    meta_path = snapshot_meta_path(args.analyze)
    try:
        meta = json.loads(meta_path.read_text()) if meta_path.is_file() else {}
        snapshot = load_snapshot(args.analyze)
        fields, timeline, spans = analyze_snapshot(snapshot, meta, args.top, args.code_root)
    except Exception as exc:  # noqa: BLE001 - not a pickle, truncated, a refused global, ...: bad input, exit 2
        print(f"error: cannot analyse {args.analyze}: {type(exc).__name__}: {exc}", file=sys.stderr)
        files.release()
        return 2
    how = ("--code-root" if args.code_root
           else "the most common source root of its Python frames; --code-root DIR")
    print(f"note: the sites name lines of the code under {fields['snapshot_code_root']} ({how})",
          file=sys.stderr)
    record = {"experiment": "mem_profile-analyze", "snapshot_path": args.analyze, **fields}
    emit(report.render(record["experiment"], [record], args.fmt))
    try:
        record.update(write_timeline(snapshot, timeline, spans, files.path("_timeline"),
                                     Path(args.analyze).name))
    except OSError as exc:
        print(f"error: cannot write {exc.filename or files.folder}: {exc.strerror or exc}; the tables above "
              "are complete", file=sys.stderr)
        files.release()
        return 1
    files.append_record(record)
    files.write_report(lambda fmt: report.render(record["experiment"], [record], fmt), args.fmt)
    files.say_written(args.fmt, [record[k] for k in ("snapshot_png", "snapshot_html") if k in record])
    return 0


def main(argv: list[str] | None = None) -> int:
    args, runs = parse_args(argv)
    if args.dry_run:
        configs = [dataclasses.asdict(run) for run in runs]
        return results.print_dry_run([run.label() for run in runs], preamble=sizes_table(configs, args.fmt))
    files = ResultFiles(args.results_dir, "memory", args.out, "memory")
    if args.analyze is not None:
        return analyze_main(args, files)
    device = resolve_device(args.device)
    cuda = device.type == "cuda"
    if not cuda and all(run.model_factory is None for run in runs):
        args.in_process = True  # only our model on fake tensors: nothing to isolate, a child costs more
    live = report.LiveReport("mem_profile", args.columns)  # the .md and --fmt file, rewritten as rows finish
    measure_one = functools.partial(measure, measure_peaks=cuda, max_entries=args.max_entries,
                                    snapshot_prefix=str(files.path("")) if args.snapshot and cuda else None)
    records, code = runner.run_configurations(
        measure_one, runs, files, args, name="mem_profile", device=device, render=live,
        finish=lambda run, record: finish_record(run, record, args.top),
        summary=lambda record: f"peak {format_bytes(record['peak_mem_allocated_bytes'])}")
    if not records:
        return code
    extra = [r[k] for r in records for k in ("snapshot_path", "snapshot_png", "snapshot_html") if k in r]
    published = report.publish("mem_profile", records, files, args.fmt, args.columns, plot=args.plot,
                               extra_paths=extra)  # also after Ctrl-C: the finished rows and their figures
    return code or published or runner.all_failed(records, counted=lambda r: r.get("saved_status") == "ok")


if __name__ == "__main__":
    sys.exit(main())
