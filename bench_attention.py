"""Attention alone at long sequence lengths: naive, torch.compile of it, PyTorch's fused SDPA and your kernel,
each checked against float64, then forward, backward and both timed apart, with the memory kept for backward.
Answers pytorch_attention, torch_compile (a) and flash_benchmarking (your FlashAttention-2, a table to paste).

    python3 bench_attention.py --impl naive                  # times, memory, OOM rows
    python3 bench_attention.py --impl naive compiled         # eager vs torch.compile
    python3 bench_attention.py                               # naive, compiled and sdpa
    python3 bench_attention.py --seq-len 64 128 --d 16 32 --iters 5 --warmup 2   # a quick CPU run
    python3 bench_attention.py --grid flash --impl flash=my_flash:FlashAttention2  # your kernel
    python3 bench_attention.py --grid leaderboard-2025 --impl flash=my_flash:FlashAttention2  # 2025's leaderboard

Inputs are (batch, seq, d), causal. Each shape runs in a child process; its implementations, each on
inputs of its own, are timed in alternating rounds (A B | B A ...). docs/bench_attention.md says more.
"""
from __future__ import annotations

import argparse
import dataclasses
import functools
import itertools
import math
import re
import statistics
import sys
import uuid
from typing import Any, Callable

import torch

import common
import report
import results
import runner
from common import DTYPES, SyncTimer, resolve_device
from model import naive_attention, sdpa_attention
from report import ATTENTION_COLUMNS, ATTENTION_PHASE_SHORT, BASELINE, check_summary
from results import LEADERBOARD_2025_SHAPE, ResultFiles, finished, format_bytes

Attention = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]  # causal

# --- arguments: the grid (batch, d, seq, dtype) and the implementations ---

# The study's grids, the defaults of every flag not given. leaderboard-2025 = the 2025 handout's leaderboard
# (section 1.3.3): 16 heads (our batch axis) x 16384 x 64, bf16, do_bench(rep=10_000, warmup=1_000) of forward
# then o.sum().backward(), yours through torch.compile.
DO_BENCH_DEFAULTS = {"warmup_ms": 25.0, "rep_ms": 100.0}
GRIDS: dict[str, dict[str, Any]] = {
    "attention": {"impl": ["naive", "compiled", "sdpa"], "d": [16, 32, 64, 128],
                  "seq_len": [256, 1024, 4096, 8192, 16384], "batch_size": 8, "dtype": ["fp32"], **DO_BENCH_DEFAULTS},
    "flash": {"impl": [BASELINE, "sdpa"], "d": [16, 32, 64, 128],
              "seq_len": [2**i for i in range(7, 17)], "batch_size": 1, "dtype": ["bf16", "fp32"],
              **DO_BENCH_DEFAULTS},
    "leaderboard-2025": {"impl": ["naive", "sdpa"], "d": [LEADERBOARD_2025_SHAPE[2]],
                         "seq_len": [LEADERBOARD_2025_SHAPE[1]], "batch_size": LEADERBOARD_2025_SHAPE[0],
                         "dtype": ["bf16"], "warmup_ms": 1000.0, "rep_ms": 10_000.0},
}
# leaderboard-2025 without a GPU: a shape a CPU runs in seconds, and do_bench's ms cut to match
LEADERBOARD_2025_CPU = {"seq_len": [256], "batch_size": 4, "warmup_ms": 20.0, "rep_ms": 100.0}


@dataclasses.dataclass(frozen=True)
class AttentionRun:
    impl: str  # its name in tables and records: ours, or the NAME of yours
    d: int
    seq_len: int
    batch_size: int = 8
    dtype: str = "fp32"  # of Q, K and V as made (no autocast: attention has no weights)
    spec: str | None = None  # yours: MODULE:CALLABLE
    warmup: int = 10  # untimed calls, then timed ones (sync timer, CUDA events)
    iters: int = 100
    warmup_ms: float = 25.0  # do_bench's defaults
    rep_ms: float = 100.0
    device: str = "auto"
    seed: int = 0
    force: bool = False  # run even when the fit guard says it cannot fit
    leaderboard: bool = False  # also time the leaderboard's forward + o.sum().backward() (leaderboard_ms)

    def label(self) -> str:
        return f"{self.impl} d={self.d} seq={self.seq_len} {self.dtype}"

    def skip_key(self) -> tuple[tuple, str, int]:  # after an OOM, longer sequences are skipped
        return (self.impl, self.d, self.batch_size, self.dtype), "seq", self.seq_len

    def comparison_key(self) -> AttentionRun:  # the implementations of one shape are compared
        return dataclasses.replace(self, impl="", spec=None)


def impl_choice(text: str) -> tuple[str, str | None]:
    """--impl: ours by name, yours as [NAME=]MODULE:CALLABLE -> (name, spec)."""
    name, _, spec = text.rpartition("=")
    if text in IMPLEMENTATIONS:
        return text, None
    if common.is_spec(spec) and name not in IMPLEMENTATIONS and re.fullmatch(r"[\w.+-]*", name):
        return name or spec, spec
    raise argparse.ArgumentTypeError(f"invalid choice: {text!r} (choose from naive, compiled, "
                                     "sdpa, or [NAME=]MODULE:CALLABLE for your own)")


def parse_args(argv: list[str] | None = None) -> tuple[argparse.Namespace, list[AttentionRun]]:
    p = results.ArgParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--grid", choices=list(GRIDS), default="attention",
                   help="the defaults of the flags below: attention = pytorch_attention; flash = "
                        "flash_benchmarking (naive first: the baseline); leaderboard-2025 = the 2025 "
                        "leaderboard (16 x 16384 x 64, bf16, yours compiled; scaled down on a CPU)")
    p.add_argument("--impl", nargs="+", action="extend", type=impl_choice, metavar="IMPL",
                   help="naive (the model's), compiled (torch.compile of it), sdpa (fused); or yours as "
                        "[NAME=]MODULE:CALLABLE, f(q, k, v, is_causal) or a torch.autograd.Function, "
                        "imported from the current directory or PYTHONPATH; NAME: its name in tables")
    p.add_argument("--d", nargs="+", type=results.positive_int, help="head dimension(s)")
    p.add_argument("--seq-len", nargs="+", type=results.positive_int, help="sequence length(s)")
    p.add_argument("--batch-size", type=results.positive_int, help="batch size")
    p.add_argument("--dtype", nargs="+", choices=("fp32", "bf16"), help="dtype(s) of Q, K and V")
    p.add_argument("--iters", type=results.step_count, default=100,
                   help="timed calls per phase (sync timer, CUDA events; do_bench sizes its own)")
    p.add_argument("--warmup", type=results.warmup_count, default=10, help="untimed calls before them")
    p.add_argument("--warmup-ms", type=results.positive_float, default=None,
                   help="triton.testing.do_bench's warmup: ms of untimed calls (default: 25; 1000 for "
                        "leaderboard-2025)")
    p.add_argument("--rep-ms", type=results.positive_float, default=None,
                   help="do_bench's rep: ms of timed calls (default: 100; 10000 for leaderboard-2025)")
    p.add_argument("--seed", type=results.seed_int, default=0, help="random seed for Q, K, V")
    p.add_argument("--force", action="store_true",
                   help="run configurations predicted not to fit in free memory (else skipped)")
    results.add_device_args(p)
    runner.add_recalibrate_arg(p)
    runner.add_sweep_args(p, compares=True)
    results.add_output_args(p, default_stem="attention-<UTC time>")
    report.add_columns_and_plot_args(p, "bench_attention")
    results.add_dry_run_arg(p)
    args = p.parse_args(argv)
    device = common.device_or_exit(p, args.device)
    runner.check_sweep_args(p, args)
    report.columns_or_exit(p, args.columns, ATTENTION_COLUMNS)
    args.scaled = args.grid == "leaderboard-2025" and device.type != "cuda"
    grid = {**GRIDS[args.grid], **(LEADERBOARD_2025_CPU if args.scaled else {})}
    for name in ("d", "seq_len", "batch_size", "dtype", "warmup_ms", "rep_ms"):
        setattr(args, name, getattr(args, name) or grid[name])
    # flash: the baseline of the speed-ups first; leaderboard-2025: yours beside naive and sdpa, for scale
    first = {"flash": [BASELINE], "leaderboard-2025": grid["impl"]}.get(args.grid, [])
    args.impl = [(impl, None) for impl in (first if args.impl else grid["impl"])] + (args.impl or [])
    # a repeated value would only repeat rows
    args.impl, args.d, args.seq_len, args.dtype = (list(dict.fromkeys(v)) for v in
                                                   (args.impl, args.d, args.seq_len, args.dtype))
    if len({name for name, _ in args.impl}) < len(args.impl):
        p.error("--impl: two implementations with one name: name them (NAME=MODULE:CALLABLE)")
    results.check_tensor_sizes(p, {"scores": (args.batch_size, max(args.seq_len), max(args.seq_len)),
                               "Q": (args.batch_size, max(args.seq_len), max(args.d))})
    runs = [AttentionRun(impl, d, seq, args.batch_size, dtype, spec, args.warmup, args.iters,
                         args.warmup_ms, args.rep_ms, args.device, args.seed, args.force,
                         args.grid == "leaderboard-2025")
            for dtype, d, seq, (impl, spec) in
            itertools.product(args.dtype, args.d, args.seq_len, args.impl)]
    return args, runs


# --- implementations: each a callable f(q, k, v) -> out on (batch, seq, d) ---


def sdpa_one_head(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """SDPA with a head axis of 1 (a view): on 3-D inputs it silently falls back to the math kernel,
    which keeps seq x seq like the naive code."""
    return sdpa_attention(q.unsqueeze(1), k.unsqueeze(1), v.unsqueeze(1)).squeeze(1)


def compiled_naive_attention() -> Attention:
    torch.compiler.reset()  # every shape compiles fresh: no earlier cache, no recompilation limit
    torch._functorch.config.donated_buffer = False  # forbids retain_graph=True (the timed backward)
    return torch.compile(naive_attention)


IMPLEMENTATIONS: dict[str, Callable[[], Attention]] = {
    "naive": lambda: naive_attention, "compiled": compiled_naive_attention,
    "sdpa": lambda: sdpa_one_head}


def attention_function(impl: str, compiled: bool = False) -> Attention:
    """Ours by name; yours (MODULE:CALLABLE) called as f(q, k, v, True), or .apply(q, k, v, True) for a
    torch.autograd.Function subclass; `compiled`: yours through torch.compile, as the 2025 leaderboard."""
    if impl in IMPLEMENTATIONS:
        return IMPLEMENTATIONS[impl]()
    found = common.load(impl)
    if isinstance(found, type) and issubclass(found, torch.autograd.Function):
        found = found.apply
    elif isinstance(found, type) or not callable(found):
        raise common.LoadError(f"{impl} is {found!r:.60}, not a function f(q, k, v, is_causal) "
                                  "or a torch.autograd.Function subclass")
    found = torch.compile(found) if compiled else found
    return lambda q, k, v: found(q, k, v, True)


# --- the check against float64, before any timing ---

# max |x - ref| / (1 + |ref|) that passes (assert_close with atol = rtol = tol): fp32 1e-2, the
# handout's tests (room for Triton's TF32 tl.dot); bf16 5e-2, since PyTorch's own bf16 attention
# reaches 1.5e-2 (docs/bench_attention.md, the method)
TOLERANCE = {"fp32": 1e-2, "bf16": 5e-2}
TENSORS = ("out", "dq", "dk", "dv")
REFERENCE_BLOCK_BYTES = 256 * 2**20  # one block of the reference: 6 float64 (batch, rows, seq)


class ImplementationError(Exception):
    """The implementation failed or returned what is not attention's; one line naming it."""


def reference_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, grad_out: torch.Tensor,
                        causal: bool = True) -> tuple[torch.Tensor, ...]:
    """(out, dq, dk, dv) of softmax(Q K^T / sqrt(d)) V in float64, a block of queries at a time
    (memory linear in seq: 65536 fits); dk and dv are summed over the blocks."""
    batch, seq, d = q.shape
    q64, k64, v64, g64 = (t.detach().to(torch.float64) for t in (q, k, v, grad_out))
    out, dq, dk, dv = (torch.zeros_like(q64) for _ in range(4))
    rows = max(1, REFERENCE_BLOCK_BYTES // (6 * batch * seq * 8))
    position = torch.arange(seq, device=q.device)
    for start in range(0, seq, rows):
        stop = min(seq, start + rows)
        keys = stop if causal else seq  # query i sees keys 0..i
        qb, kb, vb = (t.detach().requires_grad_() for t in (q64[:, start:stop], k64[:, :keys],
                                                            v64[:, :keys]))
        with torch.enable_grad():
            scores = qb @ kb.transpose(-2, -1) / math.sqrt(d)  # (batch, rows, keys)
            if causal:
                future = position[None, :keys] > position[start:stop, None]
                scores = scores.masked_fill(future, float("-inf"))
            block = torch.softmax(scores, dim=-1) @ vb
            out[:, start:stop] = block.detach()
            dq[:, start:stop], gk, gv = torch.autograd.grad(block, (qb, kb, vb), g64[:, start:stop])
        dk[:, :keys] += gk
        dv[:, :keys] += gv
    return out, dq, dk, dv


def check_implementation(attention: Attention, inputs: tuple[torch.Tensor, ...],
                         grad_out: torch.Tensor, dtype: str, name: str) -> dict[str, Any]:
    """Each tensor's error against causal attention on copies of the inputs made before the kernel ran, and
    what is wrong: inputs written in place, NaN or inf, or (failing) a match with unmasked attention. A kernel
    that fails or returns what is not attention's raises ImplementationError; an OOM stays one (the row: OOM)."""
    def described(t: Any) -> str:
        return (f"{tuple(t.shape)} {str(t.dtype).removeprefix('torch.')} on {t.device}"
                if isinstance(t, torch.Tensor) else type(t).__name__)

    pristine = [t.detach().clone() for t in inputs]
    expected, where = described(inputs[0]), "forward"
    try:
        out = attention(*inputs)
        if described(out) != expected:
            raise ImplementationError(f"{name} returned {described(out)} in forward; "
                                      f"expected {expected}")
        if out.grad_fn is None:
            raise ImplementationError(f"{name}'s output has no autograd graph: no backward")
        where = "backward"
        # autograd itself refuses gradients shaped unlike the inputs
        got = (out.detach(), *torch.autograd.grad(out, inputs, grad_out))
    except Exception as exc:  # noqa: BLE001 - the implementation's failure, its row
        if isinstance(exc, ImplementationError) or common.is_oom(exc):
            raise
        raise ImplementationError(f"{name} raised {common.one_line(exc)} in {where}") from exc
    problems = [f"modifies {n} in place" for n, t, p in zip("qkv", inputs, pristine)
                if not torch.equal(t, p)]
    problems += [f"{n} has {'NaN' if x.isnan().any() else 'inf'}" for n, x in zip(TENSORS, got)
                 if not x.isfinite().all()]

    def errors(causal: bool) -> dict[str, float]:  # max |x - ref| / (1 + |ref|); inf if not finite
        reference = reference_attention(*pristine, grad_out, causal)
        return {n: float(((x.double() - ref).abs() / (1 + ref.abs())).nan_to_num(math.inf, math.inf).max())
                for n, x, ref in zip(TENSORS, got, reference)}

    tolerance, causal = TOLERANCE[dtype], errors(True)
    # a wrong output spoils the gradients, often more: name it first, not the gradient to debug
    worst = "out" if causal["out"] > tolerance else max(causal, key=causal.get)
    if causal[worst] > tolerance and not problems and max(errors(False).values()) <= tolerance:
        problems.append("non-causal (it matches attention without the mask: is_causal ignored?)")
    return {"ok": causal[worst] <= tolerance and not problems, "max_error": causal[worst],
            "worst": worst, "tolerance": tolerance, "errors": causal, "problems": problems}


# --- timing: triton.testing.do_bench on CUDA when triton imports, else CUDA events or SyncTimer ---


def timing_settings(run: AttentionRun, device: torch.device) -> dict[str, Any]:
    if device.type == "cuda" and common.triton_do_bench():
        import triton
        return {"method": "triton.testing.do_bench", "warmup_ms": run.warmup_ms,
                "rep_ms": run.rep_ms, "l2_flush": "before every timed call",
                "triton": triton.__version__}
    why = {"why": "triton is not importable: no L2 flush"} if device.type == "cuda" else {}
    return {"method": "cuda events" if device.type == "cuda" else "sync timer",
            "warmup_calls": run.warmup, "timed_calls": run.iters, **why}


def time_calls(fn: Callable[[], Any], label: str, device: torch.device, warmup: int, iters: int,
               warmup_ms: float, rep_ms: float) -> list[float]:
    """Milliseconds per call of fn(), one sample per timed call."""
    do_bench = common.triton_do_bench() if device.type == "cuda" else None
    with runner.timed_phase(f"timing {label}"):
        if do_bench is not None:  # sized in ms, L2 flushed before each call, CUDA events
            return list(do_bench(fn, warmup=warmup_ms, rep=rep_ms, return_mode="all"))
        for _ in range(warmup):
            fn()
        if device.type != "cuda":
            return common.sync_times(fn, device, iters)
        # CUDA events, read after one final sync: the GPU's time of each call
        events = [[torch.cuda.Event(enable_timing=True) for _ in "se"] for _ in range(iters)]
        torch.cuda.synchronize(device)
        for start, end in events:
            start.record()
            result = fn()
            end.record()
            del result
        torch.cuda.synchronize(device)
        return [start.elapsed_time(end) for start, end in events]


def time_phases(attention: Attention, inputs: tuple[torch.Tensor, ...], grad_out: torch.Tensor,
                time: Callable[[Callable[[], Any], str], list[float]]) -> dict[str, list[float]]:
    """The forward (its graph built, as in training), the backward through one graph built outside
    the clock (retain_graph=True, as triton's and flash-attention's benchmarks do), and both."""
    samples = {"forward": time(lambda: attention(*inputs), "forward")}
    out = attention(*inputs)
    samples["backward"] = time(lambda: torch.autograd.grad(out, inputs, grad_out,
                                                           retain_graph=True), "backward")
    del out
    samples["forward_backward"] = time(lambda: torch.autograd.grad(attention(*inputs), inputs,
                                                                   grad_out), "forward+backward")
    return samples


# --- memory: predicted, free, saved for backward ---


def naive_saved_bytes(batch: int, seq: int, d: int, element_bytes: int) -> int:
    """What model.naive_attention keeps for backward: 2 batch x seq x seq tensors (the softmax's exp and
    probabilities), the bool mask, Q, K, V, the softmax's row sum and its row max's int64 indices."""
    e = element_bytes
    return 2 * batch * seq * seq * e + seq * seq + (3 * d + 1) * batch * seq * e + 8 * batch * seq


# Peak of one forward + backward in batch x seq x seq tensors, measured as peak RSS (CPU, torch
# 2.13, batch 8, d 64): naive 6.1-6.4, compiled 4.3. The saved set would let too large a run start.
PEAK_SEQ2_TENSORS = {"naive": 6.5, "compiled": 4.5}


def predicted_need_bytes(run: AttentionRun) -> int:
    """The fit guard's peak: quadratic for naive and compiled; for sdpa and yours what a fused kernel keeps
    (Q, K, V, output, fp32 log-sum-exp: a lower bound), plus dQ, dK, dV, dO and the check's float64 copies."""
    b, s, d, e = run.batch_size, run.seq_len, run.d, DTYPES[run.dtype].itemsize
    quadratic = PEAK_SEQ2_TENSORS.get(run.impl, 0) * b * s * s * e if run.spec is None else 0
    fused = 0 if quadratic else 4 * b * s * d * e + 4 * b * s
    reference = 8 * b * s * d * 8 + REFERENCE_BLOCK_BYTES  # float64 Q, K, V, dO, 4 results, a block
    return int(quadratic) + fused + 8 * b * s * d * e + reference


def saved_tensor_bytes(attention: Attention, inputs: tuple[torch.Tensor, ...]) -> int:
    """Bytes autograd keeps for backward after one forward (every storage, once), on any device."""
    with common.saved_tensors() as saved:
        attention(*inputs)
    return sum(saved.values())


def sdpa_backend(attention: Attention, inputs: tuple[torch.Tensor, ...]) -> str:
    """The kernel PyTorch picked, from the aten ops of a call (flash, efficient, cudnn or math)."""
    with common.quiet_profiler([torch.profiler.ProfilerActivity.CPU]) as prof:
        attention(*inputs)
    ops = " ".join(event.name for event in prof.events())
    found = re.search(r"aten::_scaled_dot_product_(flash|efficient|cudnn|attention_math)", ops)
    return found.group(1).removeprefix("attention_") if found else "unknown"


# --- one shape: each implementation checked, then all timed in rounds ---

ROUNDS = 20  # not 10: the signed-rank interval then reaches three wild rounds, not one (results.py)


def make_inputs(run: AttentionRun, device: torch.device) -> tuple[tuple[torch.Tensor, ...],
                                                                 torch.Tensor]:
    """Q, K, V (batch, seq, d), requiring grad, and the output's gradient, from the run's seed."""
    torch.manual_seed(run.seed)
    q, k, v, grad_out = (torch.randn(run.batch_size, run.seq_len, run.d, device=device,
                                     dtype=DTYPES[run.dtype]) for _ in range(4))
    return (q.requires_grad_(), k.requires_grad_(), v.requires_grad_()), grad_out


def prepare(run: AttentionRun, device: torch.device) -> tuple[Attention | None, dict[str, Any]]:
    """The fit guard, the implementation (yours imported in the child), compile_s, the check on its own inputs."""
    need, free = predicted_need_bytes(run), common.free_memory_bytes(device)
    if not run.force and free is not None and need > free:
        return None, {"status": f"skipped: needs {format_bytes(need)}, {format_bytes(free)} free",
                      "free_mem_bytes": free}
    record: dict[str, Any] = {"environment": common.environment(device), "free_mem_bytes": free,
                              "load": {"before": common.machine_load(device)}}
    inputs, grad_out = make_inputs(run, device)
    try:  # a kernel that cannot load or run is a row; the others are still timed together
        runner.phase(f"loading {run.impl}")
        attention = attention_function(run.spec or run.impl, run.leaderboard and device.type == "cuda")
        if run.impl == "compiled":
            runner.phase("compiling (first forward and backward)")
            record["compile_s"] = SyncTimer(device).time(
                lambda: torch.autograd.grad(attention(*inputs), inputs, grad_out))[1]
        runner.phase("checking against the float64 reference")
        record["check"] = check_implementation(attention, inputs, grad_out, run.dtype, run.impl)
    except (ImplementationError, common.LoadError) as exc:
        return None, {"status": common.failure_status(exc)}
    return attention, record


def measure_together(runs: list[AttentionRun]) -> list[dict[str, Any]]:
    """One shape's implementations, each prepared, then on fresh inputs of its own (a kernel writing into them
    changes only its own) timed in rounds A B | B A ...: iters / ROUNDS calls (or rep_ms / ROUNDS) per phase."""
    device = resolve_device(runs[0].device)
    prepared = [prepare(run, device) for run in runs]
    records = [record for _, record in prepared]
    timed = [(i, fn, *make_inputs(runs[i], device)) for i, (fn, _) in enumerate(prepared) if fn]
    if not timed:
        return records
    run0 = runs[timed[0][0]]
    rounds = min(ROUNDS, run0.iters) if len(timed) > 1 else 1
    sizes = results.block_sizes(run0.iters, -(-run0.iters // rounds))
    bounds: dict[int, dict[str, list[list[int]]]] = {i: {} for i, *_ in timed}

    def run_block(position: int, r: int) -> None:
        i, attention, inputs, grad_out = timed[position]
        time = functools.partial(time_calls, device=device, warmup=run0.warmup if r == 0 else 1,
                                 iters=sizes[r], warmup_ms=run0.warmup_ms, rep_ms=run0.rep_ms / len(sizes))
        for phase, values in time_phases(attention, inputs, grad_out, time).items():
            kept = records[i].setdefault(f"{phase}_ms", [])
            bounds[i].setdefault(phase, []).append([len(kept), len(kept) + len(values)])
            kept.extend(values)

    runner.interleave(len(timed), len(sizes), run_block)
    group = uuid.uuid4().hex[:12]
    for position, (i, attention, inputs, grad_out) in enumerate(timed):
        runner.phase("after the timed steps")
        record = records[i]
        record.update(timing=timing_settings(run0, device),
                      saved_tensor_bytes=saved_tensor_bytes(attention, inputs))
        if device.type == "cuda":  # allocated with the graph alive, and the peak with the backward
            common.reset_peak_memory(device)
            out = attention(*inputs)
            record["mem_before_backward_bytes"] = torch.cuda.memory_allocated(device)
            torch.autograd.grad(out, inputs, grad_out)
            record.update(common.peak_memory_bytes(device))
            del out
        if runs[i].impl == "sdpa":
            record["sdpa_backend"] = sdpa_backend(attention, inputs)
        if runs[i].leaderboard:  # the 2025 snippet: forward, then o.sum().backward()
            runner.phase("timing the leaderboard's forward + o.sum().backward()")
            record["leaderboard"] = common.leaderboard_time(lambda: attention(*inputs).sum().backward(), device,
                                                            run0.warmup_ms, run0.rep_ms)
        record["load"]["after"] = common.machine_load(device)
        if len(timed) > 1:
            record["timing"]["interleaved"] = {"rounds": len(sizes), "calls_per_round": sizes}
            record["pairing"] = {"group": group, "mode": "steps", "position": position,
                                 "variants": len(timed), "rounds": bounds[i]["forward"],
                                 "rounds_by_phase": bounds[i]}
    return records


def measure(run: AttentionRun) -> dict[str, Any]:
    """One implementation alone (--interleave runs)."""
    return measure_together([run])[0]


def finish_record(run: AttentionRun, record: dict[str, Any], ceiling: dict[str, Any] | None = None) -> None:
    """In the parent: the predictions; on a timed row each phase's statistics, TFLOP/s, floors (`ceiling`: the
    measured one, runner.measured_ceiling), the check's status."""
    e = DTYPES[run.dtype].itemsize
    record["predicted_naive_saved_bytes"] = naive_saved_bytes(run.batch_size, run.seq_len, run.d, e)
    record["predicted_need_bytes"] = predicted_need_bytes(run)
    if not finished(record) or "forward_ms" not in record:
        return
    for phase in ATTENTION_PHASE_SHORT:
        samples = record[f"{phase}_ms"]
        record.update({f"{phase}_ms_{k}": value for k, value in results.summarize(samples).items()})
        if len(samples) > 1:  # do_bench's summary quantiles, interpolated as torch.quantile does
            p20, _, _, p80 = statistics.quantiles(samples, n=5, method="inclusive")
            record.update({f"{phase}_ms_p20": p20, f"{phase}_ms_p80": p80})
    if record["forward_ms_n"] < 2:
        record["note"] = "1 timed call: no std"
    # causal: half of QK^T and PV, as FlashAttention's benchmarks count (the masked half is no useful work)
    record["forward_flops"] = results.attention_matmul_flops(run.batch_size, run.seq_len, run.d) // 2
    record["forward_tflops"] = record["forward_flops"] / record["forward_ms_mean"] / 1e9
    record["floors"] = attention_floors(run, record, ceiling)
    if not record["check"]["ok"]:  # still timed: you see what you are debugging
        record["status"] = check_summary(record["check"])


def attention_floors(run: AttentionRun, record: dict[str, Any], ceiling: dict[str, Any] | None) -> dict[str, Any]:
    """Each phase's floor (results.attention_phase_bytes, _flops): naive, compiled and SDPA's math backend write
    and read the seq x seq scores (their floors come with the fused kernel's beside), the others O(seq x d)."""
    env, (b, s, d, e) = record["environment"], (run.batch_size, run.seq_len, run.d, DTYPES[run.dtype].itemsize)
    roofs = common.roofs(env, common.matmul_precision_key(run.dtype, bool(env.get("tf32_matmul"))), ceiling)
    materialized = (run.spec is None and run.impl in ("naive", "compiled")) or record.get("sdpa_backend") == "math"
    flops = results.attention_phase_flops(b, s, d)

    def floors(quadratic: bool) -> dict[str, dict]:
        nbytes = results.attention_phase_bytes(b, s, d, e, quadratic)
        return {p: results.floor(flops[p], nbytes[p], roofs["tflops"], roofs["gbs"]) for p in ATTENTION_PHASE_SHORT}

    out = {**results.beside_measured(floors(materialized), record, roofs),
           "bytes": "seq x seq materialized" if materialized else "fused"}
    if materialized:
        out["fused_floor_ms"] = {p: f["floor_ms"] for p, f in floors(False).items()}
    return out


# --- the grid and the report ---


def main(argv: list[str] | None = None) -> int:
    args, runs = parse_args(argv)
    if args.scaled:
        print(f"leaderboard-2025 at a scaled-down shape on a CPU: batch (heads) {args.batch_size}, seq "
              f"{args.seq_len[0]}, d 64 (the leaderboard: 16 x 16384 x 64 on one H100)")
    if args.dry_run:
        return results.print_dry_run(
            [f"{run.label()} (predicted need {format_bytes(predicted_need_bytes(run))})"
             for run in runs],
            preamble=f"settings: grid {args.grid}, batch {args.batch_size}, "
                     f"{' '.join(args.dtype)}, causal; each implementation checked against "
                     "float64, then timed")
    ceiling = runner.measured_ceiling(args, resolve_device(args.device))  # before any file: Ctrl-C leaves none
    files = ResultFiles(args.results_dir, "attention", args.out, "attention")
    live = report.LiveReport("bench_attention", args.columns)  # rewritten as rows finish

    def said(r: dict[str, Any]) -> str:
        return ", ".join(f"{ATTENTION_PHASE_SHORT[p]} {r[f'{p}_ms_mean']:.3f} ms" for p in ATTENTION_PHASE_SHORT)

    plan = runner.comparisons(runs, AttentionRun.comparison_key)  # a shape's implementations, interleaved
    records, code = runner.run_configurations(measure, plan, files, args, name="bench_attention",
                                              device=resolve_device(args.device), ceiling=ceiling,
                                              finish=functools.partial(finish_record, ceiling=ceiling),
                                              render=live, summary=said, measure_variants=measure_together)
    if not records:
        return code
    published = report.publish("bench_attention", records, files, args.fmt, args.columns, plot=args.plot)
    return code or published or runner.all_failed(records)  # an interrupted sweep's code comes first


if __name__ == "__main__":
    sys.exit(main())
