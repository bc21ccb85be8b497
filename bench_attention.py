"""Attention alone at scale: the model's hand-written attention, torch.compile of it, PyTorch's fused
scaled_dot_product_attention, and your own kernel (MODULE:CALLABLE), each checked against a float64 reference
before its forward, backward and forward+backward are timed apart, with the memory kept for backward.

Answers the study's attention questions: how do the time and memory of naive attention grow with the sequence
length, at what size does it run out of memory and why; what do torch.compile and the fused kernels buy
(pytorch_attention, torch_compile); and how does your FlashAttention-2 compare with PyTorch (flash_benchmarking).

    python3 bench_attention.py --impl naive                  # the eager table: times, memory, OOM rows
    python3 bench_attention.py --impl naive compiled         # eager vs torch.compile, side by side
    python3 bench_attention.py                               # naive, compiled and sdpa (the study's full grid)
    python3 bench_attention.py --dtype bf16 --d 64 --seq-len 4096 16384
    python3 bench_attention.py --seq-len 64 128 --d 16 32 --iters 5 --warmup 2   # a quick CPU run
    python3 bench_attention.py --grid flash --impl flash_triton:FlashAttention2  # flash_benchmarking, your kernel
    python3 bench_attention.py --grid flash --impl my_attn:attention --seq-len 128 256 --d 16 --dry-run

Inputs are (batch, seq, d): no head dimension, causal masking as in the model. A MODULE:CALLABLE is imported from
the current directory or PYTHONPATH: a function f(q, k, v, is_causal) -> out, or a torch.autograd.Function subclass
(called as .apply(q, k, v, is_causal)). On CUDA the latencies come from triton.testing.do_bench when triton is
importable, CUDA events otherwise; on a CPU from the synchronised timer. The implementations of one shape run in one
child process (an OOM or a crashing kernel cannot poison the next shape; if that child fails, each runs alone), on
the same inputs, and their timed calls alternate in rounds (A B | B A ...: measure_together), so that the speed-ups,
paired by round, carry a 95% interval (--interleave runs: each in its own process). Tables (attention_tables.py, the
code report.py re-renders saved runs with) are printed on stdout and saved, with one JSON record per configuration
(raw samples, the check, the timing method, the pairing and the environment), under results/attention/. See
docs/bench_attention.md and docs/your_code.md. (About 480 lines: four kinds of implementation, each checked, timed
three ways alone or interleaved, with a fit guard and memory figures.)
"""
from __future__ import annotations

import argparse
import dataclasses
import itertools
import sys
import uuid
from dataclasses import dataclass
from typing import Any

import torch

import attention_check
import attention_tables
import cli
import common
import isolation
import kernel_timing
import model_config
import report
import runner
import stats
import sweep
from attention_impls import (BASELINE, IMPLEMENTATIONS, AttentionFn, attention_function, impl_choice,  # noqa: F401
                             naive_attention, sdpa_attention, sdpa_one_head)  # (the tests read them here)
from attention_tables import PHASE_SHORT, PHASES, check_summary
from common import DTYPES, SyncTimer, peak_memory_bytes, reset_peak_memory, resolve_device, saved_tensors, synchronize
from results import ResultFiles, finished, format_bytes

BENCH_DTYPES = ("fp32", "bf16")  # inputs are created in this dtype (no autocast: there are no weights)


# ---- memory: predicted, measured, available ----


def naive_saved_bytes(batch: int, seq: int, d: int, element_bytes: int) -> int:
    """Bytes the naive attention keeps alive for backward, as the study counts them: the scores and the softmax
    output (batch x seq x seq each) plus Q, K, V and the output (batch x seq x d each). The seq x seq terms
    dominate, so memory grows with the square of the sequence length. (The hand-written softmax in fact also
    keeps its exp, a third seq x seq tensor, and the bool causal mask: the measured figure shows it.)"""
    return 2 * batch * seq * seq * element_bytes + 4 * batch * seq * d * element_bytes


def fused_saved_bytes(batch: int, seq: int, d: int, element_bytes: int) -> int:
    """Bytes a fused (flash / memory-efficient) kernel keeps for backward: Q, K, V and the output, plus one fp32
    log-sum-exp per query row; the seq x seq probabilities are recomputed in backward, never stored
    (Dao et al. 2022, "FlashAttention", section 3.1)."""
    return 4 * batch * seq * d * element_bytes + batch * seq * 4


# Peak memory of one forward + backward, in units of one batch x seq x seq tensor of the input dtype: measured as
# peak RSS on torch 2.13 (CPU, batch 8, d 64): naive 7.4 at seq 2048 and 7.1 at 4096, compiled 4.3 at 2048. The hand-written
# softmax keeps three seq x seq tensors alive and backward adds gradients of the same size. The fit guard uses
# these, not the study's formula, which counts two saved tensors and would let a run that needs 3-4x more start
# and thrash the machine.
PEAK_SEQ2_TENSORS = {"naive": 7.5, "compiled": 4.5}


def predicted_need_bytes(impl: str, batch: int, seq: int, d: int, element_bytes: int) -> int:
    """What the fit guard compares with free memory: the predicted peak of one forward + backward. Quadratic
    (PEAK_SEQ2_TENSORS) for naive and compiled; for sdpa, and for your own kernel, a fused kernel's saved set
    (what a FlashAttention keeps: a lower bound for code we cannot see; one that needs more fails as OOM). Plus the
    linear tensors: Q, K, V, output, output gradient and three input gradients."""
    linear = 8 * batch * seq * d * element_bytes
    if impl not in PEAK_SEQ2_TENSORS:
        return fused_saved_bytes(batch, seq, d, element_bytes) + linear
    return int(PEAK_SEQ2_TENSORS[impl] * batch * seq * seq * element_bytes) + linear


def run_need_bytes(run: "AttentionRun") -> int:
    """The fit guard's figure for a configuration: the implementation's peak with the correctness check's
    float64 tensors alive beside it (attention_check.reference_bytes)."""
    return (predicted_need_bytes(run.impl, run.batch_size, run.seq_len, run.d, run.element_bytes)
            + attention_check.reference_bytes(run.batch_size, run.seq_len, run.d))


def mem_available_bytes(meminfo: str = "/proc/meminfo") -> int | None:
    """Linux's estimate of RAM available to a new process without swapping (MemAvailable); None elsewhere."""
    try:
        with open(meminfo) as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024  # the file says kB and means KiB
    except OSError:
        pass
    return None


def free_memory_bytes(device: torch.device) -> int | None:
    """Free device memory (CUDA, after this process's context) or available RAM (CPU); None if unknown.
    Called in the child process that runs the configuration, so the parent never creates a CUDA context."""
    if device.type == "cuda":
        free, _total = torch.cuda.mem_get_info(device)
        return free
    return mem_available_bytes()


def fit_status(need_bytes: int, free_bytes: int | None, force: bool) -> str | None:
    """'skipped: needs X GiB ...' when a configuration cannot fit (and --force is off); None to run it."""
    if force or free_bytes is None or need_bytes <= free_bytes:
        return None
    return f"skipped: needs {format_bytes(need_bytes)}, {format_bytes(free_bytes)} free"


def saved_tensor_bytes(attention: AttentionFn, inputs: tuple[torch.Tensor, ...]) -> int:
    """Bytes autograd keeps for backward after one forward (common.saved_tensors: every storage any op saves,
    once). Works on every device, unlike an allocator counter; it does not count the output unless an op
    saved it."""
    with saved_tensors() as saved:
        out = attention(*inputs)
    total = sum(saved.values())
    del out
    return total


# ---- which sdpa kernel ran ----

# aten op that each SDPA backend dispatches to; prefixes, so the CPU flash kernel (..._for_cpu) counts as flash
SDPA_BACKEND_OPS = (
    ("aten::_scaled_dot_product_flash_attention", "flash"),
    ("aten::_scaled_dot_product_efficient_attention", "efficient"),
    ("aten::_scaled_dot_product_cudnn_attention", "cudnn"),
    ("aten::_scaled_dot_product_attention_math", "math"),
)


def classify_sdpa_backend(op_names: list[str]) -> str:
    """The SDPA backend named by the aten ops of one call: flash, efficient, cudnn, math, or unknown."""
    for prefix, backend in SDPA_BACKEND_OPS:
        if any(name.startswith(prefix) for name in op_names):
            return backend
    return "unknown"


def sdpa_backend(attention: AttentionFn, inputs: tuple[torch.Tensor, ...]) -> str:
    """Run one call under torch.profiler (CPU activity: the aten op names, no CUPTI needed) and classify it.
    What ran, not what a rule predicts: PyTorch picks the kernel per shape, dtype and GPU."""
    with common.quiet_profiler([torch.profiler.ProfilerActivity.CPU]) as prof:
        out = attention(*inputs)
    del out
    return classify_sdpa_backend([event.name for event in prof.events()])


# ---- timing: forward, backward, forward+backward ----



def time_phases(attention: AttentionFn, inputs: tuple[torch.Tensor, ...], grad_out: torch.Tensor,
                method: kernel_timing.TimingMethod) -> dict[str, list[float]]:
    """Milliseconds per call of each phase, by `method` (kernel_timing): the forward (graph built, as in training;
    freed outside the timer), the backward through one retained graph (retain_graph=True, as triton's and
    flash-attention's benchmarks time it: the graph is built once, outside), and a forward with its backward."""
    samples = {"forward": method.samples(lambda: attention(*inputs), label="forward")}
    isolation.phase("building the graph for the backward")
    out = attention(*inputs)
    samples["backward"] = method.samples(lambda: torch.autograd.grad(out, inputs, grad_out, retain_graph=True),
                                         label="backward")
    del out
    samples["forward_backward"] = method.samples(lambda: torch.autograd.grad(attention(*inputs), inputs, grad_out),
                                                 label="forward+backward")
    return samples


def memory_of_one_step(attention: AttentionFn, inputs: tuple[torch.Tensor, ...], grad_out: torch.Tensor,
                       device: torch.device) -> dict[str, int]:
    """CUDA: bytes allocated right after a forward with its graph alive (inputs, output, everything saved) and
    the peak of that forward and its backward; {} on a CPU, which has no allocator counter. Measured apart from
    the timing, whose do_bench allocates its own L2-flush buffer."""
    if device.type != "cuda":
        return {}
    reset_peak_memory(device)
    out = attention(*inputs)
    synchronize(device)
    before_backward = torch.cuda.memory_allocated(device)
    grads = torch.autograd.grad(out, inputs, grad_out)
    del out, grads
    return {"mem_before_backward_bytes": before_backward, **peak_memory_bytes(device)}


# ---- one configuration ----


@dataclass(frozen=True)
class AttentionRun:
    impl: str  # key into IMPLEMENTATIONS, or your MODULE:CALLABLE
    d: int
    seq_len: int
    batch_size: int = 8
    dtype: str = "fp32"
    warmup: int = 10  # untimed calls before each phase's timed ones (sync timer, CUDA events)
    iters: int = 100  # timed calls per phase (sync timer, CUDA events)
    warmup_ms: float = kernel_timing.DO_BENCH_WARMUP_MS  # do_bench's warm-up, in ms of calls
    rep_ms: float = kernel_timing.DO_BENCH_REP_MS  # do_bench's timed repetitions, in ms of calls
    device: str = "auto"
    seed: int = 0
    force: bool = False  # run even when the fit guard says it cannot fit

    @property
    def element_bytes(self) -> int:
        return DTYPES[self.dtype].itemsize

    def label(self) -> str:
        return f"{self.impl} d={self.d} seq={self.seq_len} {self.dtype}"

    def skip_key(self) -> tuple[tuple, str, int]:
        """(group, size name, size) for the sweep's rule: after an OOM, longer sequences of the group are skipped."""
        return (self.impl, self.d, self.batch_size, self.dtype), "seq", self.seq_len

    def fault_fields(self) -> dict[str, Any]:
        """What a BENCH_INJECT_FAULT clause can match on (sweep.injected_fault)."""
        return {"impl": self.impl, "d": self.d, "seq_len": self.seq_len, "dtype": self.dtype,
                "batch_size": self.batch_size}

    def comparison_key(self) -> AttentionRun:
        """This configuration without its implementation: the runs that share it are compared, measured together."""
        return dataclasses.replace(self, impl="")


def make_inputs(run: AttentionRun, device: torch.device) -> tuple[tuple[torch.Tensor, ...], torch.Tensor]:
    """Q, K, V (batch, seq, d), requiring grad, and the output's gradient, from the run's seed."""
    torch.manual_seed(run.seed)
    shape = (run.batch_size, run.seq_len, run.d)
    inputs = tuple(torch.randn(shape, device=device, dtype=DTYPES[run.dtype], requires_grad=True) for _ in range(3))
    return inputs, torch.randn(shape, device=device, dtype=DTYPES[run.dtype])


def prepare(run: AttentionRun, device: torch.device, inputs: tuple[torch.Tensor, ...],
            grad_out: torch.Tensor) -> tuple[AttentionFn, dict[str, Any]] | dict[str, Any]:
    """Fit guard, the implementation (yours imported here, in the child), (compiled) the first forward and backward
    timed apart as compile_s, the check against the reference: (the function to time, its record so far), or the
    record of a configuration the fit guard skips."""
    free = free_memory_bytes(device)
    skipped = fit_status(run_need_bytes(run), free, run.force)
    if skipped:
        return {"status": skipped, "free_mem_bytes": free}
    isolation.phase(f"loading {run.impl}")
    attention = attention_function(run.impl)
    record: dict[str, Any] = {"environment": common.environment(device), "free_mem_bytes": free,
                              "load": {"before": common.machine_load(device)}}
    if run.impl == "compiled":  # the first forward and backward compile both graphs
        isolation.phase("compiling (first forward and backward)")
        _, record["compile_s"] = SyncTimer(device).time(
            lambda: torch.autograd.grad(attention(*inputs), inputs, grad_out))
    isolation.phase("checking against the float64 reference")
    record["check"] = attention_check.check_implementation(attention, inputs, grad_out, run.dtype, run.impl)
    return attention, record


def after_timing(run: AttentionRun, attention: AttentionFn, inputs: tuple[torch.Tensor, ...],
                 grad_out: torch.Tensor, device: torch.device) -> dict[str, Any]:
    """Untimed, after the timed calls: memory before backward and the peak (CUDA), bytes saved for backward,
    (sdpa) the kernel that ran. The callers add the load after."""
    isolation.phase("after the timed steps")
    out = {**memory_of_one_step(attention, inputs, grad_out, device),
           "saved_tensor_bytes": saved_tensor_bytes(attention, inputs)}
    if run.impl == "sdpa":
        out["sdpa_backend"] = sdpa_backend(attention, inputs)
    return out


def run_config(run: AttentionRun) -> dict[str, Any]:
    """One configuration alone (in a child process of the sweep): prepare, then each phase timed by the device's
    method (kernel_timing), then the untimed figures. Failures propagate as exceptions (the sweep turns them into
    rows); a wrong result does not: it is timed and flagged."""
    device = resolve_device(run.device)
    inputs, grad_out = make_inputs(run, device)
    prepared = prepare(run, device, inputs, grad_out)
    if isinstance(prepared, dict):
        return prepared
    attention, record = prepared
    method = kernel_timing.choose_timing(device, run.warmup, run.iters, run.warmup_ms, run.rep_ms)
    record["timing"] = method.describe()
    record.update({f"{phase}_ms": samples
                   for phase, samples in time_phases(attention, inputs, grad_out, method).items()})
    record.update(after_timing(run, attention, inputs, grad_out, device))
    record["load"]["after"] = common.machine_load(device)
    return record


# an interleaved comparison's rounds: each implementation's timed calls are split into this many blocks. 20, not
# 10: the signed-rank interval over 10 rounds reaches into the Walsh averages of one wild round (a recompile, a
# descheduled thread), over 20 only into those of three (stats.py)
ROUNDS = 20


def measure_together(runs: list[AttentionRun], faults: list) -> list[dict[str, Any]]:
    """The implementations of one shape in one process (a child of the sweep), on the same inputs, each prepared
    (and checked) in turn; then their timed calls alternate in rounds, A B | B A | ... (stats.round_order): in each
    round every implementation times its block of each phase (iters / ROUNDS calls, the device's method; one warm-up
    call per phase after the first round, where the switch from another implementation left the caches cold; with
    do_bench, rep_ms / ROUNDS). Each record's `pairing` says which of its samples came from which round, per phase
    (do_bench decides its own counts)."""
    device = resolve_device(runs[0].device)
    inputs, grad_out = make_inputs(runs[0], device)
    prepared = [prepare(run, device, inputs, grad_out) for run in runs]
    timed = [i for i, p in enumerate(prepared) if not isinstance(p, dict)]
    records = [p if isinstance(p, dict) else p[1] for p in prepared]
    if not timed:
        return records
    run0 = runs[timed[0]]
    sizes = stats.block_sizes(run0.iters, -(-run0.iters // min(ROUNDS, run0.iters)))
    rounds: dict[int, dict[str, list[list[int]]]] = {i: {} for i in timed}
    timing = {**kernel_timing.choose_timing(device, run0.warmup, run0.iters, run0.warmup_ms, run0.rep_ms).describe(),
              "interleaved": {"rounds": len(sizes), "calls_per_round": sizes, "warmup_calls_after_round_1": 1,
                              "rep_ms_per_round": run0.rep_ms / len(sizes)}}
    for r, size in enumerate(sizes):
        method = kernel_timing.choose_timing(device, run0.warmup if r == 0 else 1, size, run0.warmup_ms,
                                             run0.rep_ms / len(sizes))
        for position in stats.round_order(len(timed), r):
            i = timed[position]
            with faults[i]:
                samples = time_phases(prepared[i][0], inputs, grad_out, method)
            for phase, values in samples.items():
                kept = records[i].setdefault(f"{phase}_ms", [])
                rounds[i].setdefault(phase, []).append([len(kept), len(kept) + len(values)])
                kept.extend(values)
    group = uuid.uuid4().hex[:12]
    for position, i in enumerate(timed):
        records[i]["timing"] = timing
        records[i].update(after_timing(runs[i], prepared[i][0], inputs, grad_out, device))
        records[i]["load"]["after"] = common.machine_load(device)
        records[i]["pairing"] = {"group": group, "mode": "steps", "position": position, "variants": len(timed),
                                 "rounds": rounds[i]["forward"], "rounds_by_phase": rounds[i]}
    return records


def derive_figures(run: AttentionRun, record: dict[str, Any]) -> dict[str, Any]:
    """Statistics and quantiles (kernel_timing.QUANTILES) of the raw samples of each phase, and the forward's
    achieved TFLOP/s (QK^T and PV, full seq x seq)."""
    phases = tuple(phase for phase in PHASES if f"{phase}_ms" in record)  # records before fwd+bwd was timed
    out = runner.sample_stats(record, phases)
    for phase in phases:
        for q in kernel_timing.QUANTILES:
            out[f"{phase}_ms_p{round(q * 100)}"] = kernel_timing.quantile(record[f"{phase}_ms"], q)
    if out["forward_ms_n"] < 2:
        out["note"] = "1 timed iteration: no std"
    flops = model_config.attention_matmul_flops(run.batch_size, run.seq_len, run.d)
    out["forward_flops"] = flops
    out["forward_tflops"] = flops / (out["forward_ms_mean"] / 1e3) / 1e12
    return out


# ---- the sweep ----


def finish_record(run: AttentionRun, record: dict[str, Any]) -> None:
    """The study's predictions on every row; the statistics and TFLOP/s on a finished one."""
    record["predicted_naive_saved_bytes"] = naive_saved_bytes(run.batch_size, run.seq_len, run.d, run.element_bytes)
    record["predicted_need_bytes"] = run_need_bytes(run)
    if finished(record):
        record.update(derive_figures(run, record))


def progress_summary(record: dict[str, Any]) -> str:
    text = ", ".join(f"{PHASE_SHORT[phase]} {record[f'{phase}_ms_mean']:.3f} ms" for phase in PHASES)
    wrong = check_summary(record["check"])
    return f"{text}{' (' + wrong + ')' if wrong else ''}"


# ---- command line ----

# The study's two grids: the defaults of every flag not given. "attention" is pytorch_attention and torch_compile
# (batch 8, the model's attention against its compiled and fused forms); "flash" is the handout's
# flash_benchmarking (batch 1, causal, seq 2^7..2^16, d 2^4..2^7, bf16 and fp32; your kernel against PyTorch).
GRIDS: dict[str, dict[str, Any]] = {
    "attention": {"impl": list(IMPLEMENTATIONS), "d": [16, 32, 64, 128], "seq_len": [256, 1024, 4096, 8192, 16384],
                  "batch_size": 8, "dtype": ["fp32"]},
    "flash": {"impl": [BASELINE, "sdpa"], "d": [16, 32, 64, 128], "seq_len": [2**i for i in range(7, 17)],
              "batch_size": 1, "dtype": ["bf16", "fp32"]},
}


def build_parser() -> argparse.ArgumentParser:
    p = cli.ArgParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--grid", choices=list(GRIDS), default="attention",
                   help="the study's grid, the defaults of the flags below: attention = pytorch_attention (batch 8, "
                        "naive compiled sdpa, fp32, d 16..128, seq 256..16384); flash = flash_benchmarking (batch 1, "
                        "naive and sdpa or your --impl, bf16 and fp32, d 16..128, seq 128..65536; naive, the "
                        "handout's 'PyTorch', always runs: the speed-ups are over it)")
    p.add_argument("--impl", nargs="+", action="extend", type=impl_choice, default=None, metavar="IMPL",
                   help=f"implementations ({', '.join(IMPLEMENTATIONS)}: the model's naive attention, torch.compile "
                        "of it, fused SDPA), or your own as MODULE:CALLABLE, a function f(q, k, v, is_causal) or a "
                        "torch.autograd.Function subclass, imported from the current directory or PYTHONPATH; "
                        "repeatable (default: the grid's)")
    p.add_argument("--d", nargs="+", type=cli.positive_int, default=None,
                   help="head dimension(s) d (inputs are batch x seq x d, no head axis; default: the grid's)")
    p.add_argument("--seq-len", nargs="+", type=cli.positive_int, default=None,
                   help="sequence length(s) (default: the grid's)")
    p.add_argument("--batch-size", type=cli.positive_int, default=None, help="batch size (default: the grid's)")
    p.add_argument("--iters", type=cli.step_count, default=100,
                   help="timed calls per phase (forward, backward, forward+backward) with the sync timer (CPU) and "
                        "CUDA events; do_bench sizes its own by --rep-ms")
    p.add_argument("--warmup", type=cli.warmup_count, default=10,
                   help="untimed calls before each phase's timed ones (sync timer, CUDA events)")
    p.add_argument("--warmup-ms", type=cli.positive_float, default=kernel_timing.DO_BENCH_WARMUP_MS,
                   help="triton.testing.do_bench's warmup: milliseconds of untimed calls (its default)")
    p.add_argument("--rep-ms", type=cli.positive_float, default=kernel_timing.DO_BENCH_REP_MS,
                   help="triton.testing.do_bench's rep: milliseconds of timed calls (its default)")
    p.add_argument("--dtype", nargs="+", choices=BENCH_DTYPES, default=None,
                   help="dtype(s) of Q, K and V (default: the grid's)")
    p.add_argument("--seed", type=cli.seed_int, default=0, help="random seed for Q, K, V")
    p.add_argument("--force", action="store_true",
                   help="run configurations whose predicted memory exceeds free memory (default: skip them)")
    cli.add_device_args(p)
    sweep.add_sweep_args(p, compares=True)
    cli.add_output_args(p, default_stem="attention")
    report.add_columns_and_plot_args(p, "bench_attention")
    cli.add_dry_run_arg(p)
    return p


def parse_args(argv: list[str] | None = None) -> tuple[argparse.Namespace, list[AttentionRun]]:
    parser = build_parser()
    args = parser.parse_args(argv)
    common.device_or_exit(parser, args.device)
    sweep.check_sweep_args(parser, args)
    report.columns_or_exit(parser, args.columns, attention_tables.TABLE_COLUMNS)
    grid = GRIDS[args.grid]
    for name in ("impl", "d", "seq_len", "batch_size", "dtype"):
        if getattr(args, name) is None:
            setattr(args, name, grid[name])
    # repeated values would only repeat rows; keep the order given
    args.impl, args.d, args.seq_len, args.dtype = (list(dict.fromkeys(v))
                                                   for v in (args.impl, args.d, args.seq_len, args.dtype))
    if args.grid == "flash" and BASELINE not in args.impl:  # the table's speed-ups are over it
        args.impl.insert(0, BASELINE)
    runs = [AttentionRun(impl=impl, d=d, seq_len=seq, batch_size=args.batch_size, dtype=dtype, warmup=args.warmup,
                         iters=args.iters, warmup_ms=args.warmup_ms, rep_ms=args.rep_ms, device=args.device,
                         seed=args.seed, force=args.force)
            for dtype, d, seq, impl in itertools.product(args.dtype, args.d, args.seq_len, args.impl)]
    cli.check_tensor_sizes(parser, {"scores": (args.batch_size, max(args.seq_len), max(args.seq_len)),
                                       "Q": (args.batch_size, max(args.seq_len), max(args.d))})
    return args, runs


def plan_label(run: AttentionRun) -> str:
    """A --dry-run line: the configuration and the memory the fit guard predicts it needs."""
    return f"{run.label()} (predicted need {format_bytes(run_need_bytes(run))})"


def main(argv: list[str] | None = None) -> int:
    args, runs = parse_args(argv)
    if args.dry_run:
        settings = (f"settings: grid {args.grid}, batch {args.batch_size}, {' '.join(args.dtype)}, causal; each "
                    "implementation checked against a float64 reference, then timed (forward, backward, "
                    "forward+backward)")
        return cli.print_dry_run([plan_label(run) for run in runs], preamble=settings)
    files = ResultFiles(args.results_dir, "attention", args.out, "attention")
    live = report.LiveReport("bench_attention", args.columns)  # the .md and --fmt file, rewritten as rows finish
    experiment = sweep.Experiment(name="bench_attention", measure=run_config, measure_together=measure_together,
                                  finish=finish_record, summary=progress_summary, render=live)
    records, code = sweep.run_sweep(experiment, runs, files, resolve_device(args.device), args)
    if records:
        published = report.publish("bench_attention", records, files, args.fmt, args.columns, plot=args.plot,
                                   live=live)
        return code or published  # an interrupted sweep says so first
    return code


if __name__ == "__main__":
    sys.exit(main())
