"""Attention alone at scale: the model's hand-written attention vs torch.compile of it vs PyTorch's fused
scaled_dot_product_attention, forward and backward timed apart, with the memory kept for backward.

Answers the study's attention questions: how do the time and memory of naive attention grow with the sequence
length, at what size does it run out of memory and why; and what do torch.compile and the fused kernels buy.

    python bench_attention.py --impl naive                  # the eager table: times, memory, OOM rows
    python bench_attention.py --impl naive compiled         # eager vs torch.compile, side by side
    python bench_attention.py                               # naive, compiled and sdpa (the study's full grid)
    python bench_attention.py --dtype bf16 --d 64 --seq-len 4096 16384
    python bench_attention.py --seq-len 64 128 --d 16 32 --iters 5 --warmup 2   # a quick CPU run

Inputs are (batch, seq, d): no head dimension, causal masking as in the model. Every configuration runs in
its own child process (an OOM cannot poison the next one). Tables are printed on stdout and saved, with one
JSON record per configuration (raw samples and the environment), under results/attention/.
"""
from __future__ import annotations

import argparse
import dataclasses
import functools
import itertools
import sys
from dataclasses import dataclass
from typing import Any, Callable

import torch

import cli
import common
import model_config
import report
import runner
import sweep
from common import DTYPES, SyncTimer, resolve_device, saved_tensors, synchronize
from model import naive_attention, sdpa_attention
from results import ResultFiles, environment_header, format_bytes, render_table

AttentionFn = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]
BENCH_DTYPES = ("fp32", "bf16")  # inputs are created in this dtype (no autocast: there are no weights)


# ---- the three implementations ----


def sdpa_one_head(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """model.sdpa_attention on (batch, seq, d) inputs seen as one head. The fused kernels (flash,
    memory-efficient, cuDNN) only take (batch, heads, seq, d): 3-D inputs silently fall back to the math kernel,
    which materialises seq x seq like the naive code (seen with torch.profiler on torch 2.13). The extra
    dimension is a view, no copy."""
    return sdpa_attention(q.unsqueeze(1), k.unsqueeze(1), v.unsqueeze(1)).squeeze(1)


def compiled_naive_attention() -> AttentionFn:
    """torch.compile of the model's naive attention, after a reset: every shape compiles fresh, so no cache from
    an earlier shape helps it and the recompilation limit never kicks in."""
    torch.compiler.reset()
    return torch.compile(naive_attention)


# name -> builder of the attention function (called once per configuration)
IMPLEMENTATIONS: dict[str, Callable[[], AttentionFn]] = {
    "naive": lambda: naive_attention,
    "compiled": compiled_naive_attention,
    "sdpa": lambda: sdpa_one_head,
}


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
    (PEAK_SEQ2_TENSORS) for naive and compiled; for sdpa the fused kernel's saved set. Plus the linear tensors:
    Q, K, V, output, output gradient and three input gradients."""
    linear = 8 * batch * seq * d * element_bytes
    if impl == "sdpa":
        return fused_saved_bytes(batch, seq, d, element_bytes) + linear
    return int(PEAK_SEQ2_TENSORS[impl] * batch * seq * seq * element_bytes) + linear


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


# ---- timing ----


def timed_step(attention: AttentionFn, inputs: tuple[torch.Tensor, ...], grad_out: torch.Tensor,
               timer: SyncTimer) -> dict[str, float]:
    """One forward (graph built, as in training) and its backward, each timed alone: seconds of each. Nothing
    else is inside the timers; the graph is freed after the backward, outside them."""
    with timer:
        out = attention(*inputs)
    forward_s = timer.elapsed_s
    with timer:
        grads = torch.autograd.grad(out, inputs, grad_out)
    del out, grads
    return {"forward": forward_s, "backward": timer.elapsed_s}


def allocated_before_backward(attention: AttentionFn, inputs: tuple[torch.Tensor, ...],
                              device: torch.device) -> int:
    """CUDA bytes allocated right after a forward, with its graph alive: inputs, output and everything saved."""
    out = attention(*inputs)
    synchronize(device)
    allocated = torch.cuda.memory_allocated(device)
    del out
    return allocated


# ---- one configuration ----


@dataclass(frozen=True)
class AttentionRun:
    impl: str  # key into IMPLEMENTATIONS
    d: int
    seq_len: int
    batch_size: int = 8
    dtype: str = "fp32"
    warmup: int = 10
    iters: int = 100
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


def prepare(run: AttentionRun, inputs: tuple[torch.Tensor, ...] | None = None,
            grad_out: torch.Tensor | None = None) -> runner.Prepared | dict[str, Any]:
    """Fit guard, inputs (given: shared by the implementations of one comparison), then the step to time: one
    forward and its backward, timed apart (timed_step). After the timed steps (untimed): memory before backward
    (CUDA), the bytes saved for backward, and (sdpa) the kernel that ran. A configuration the fit guard skips is
    its record at once."""
    device = resolve_device(run.device)
    need = predicted_need_bytes(run.impl, run.batch_size, run.seq_len, run.d, run.element_bytes)
    free = free_memory_bytes(device)
    skipped = fit_status(need, free, run.force)
    if skipped:
        return {"status": skipped, "free_mem_bytes": free}
    if inputs is None:
        inputs, grad_out = make_inputs(run, device)
    attention = IMPLEMENTATIONS[run.impl]()
    timer = SyncTimer(device)

    def after(record: dict[str, Any]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if device.type == "cuda":  # a CPU has no allocator counter; saved_tensor_bytes is measured everywhere
            out["mem_before_backward_bytes"] = allocated_before_backward(attention, inputs, device)
        out["saved_tensor_bytes"] = saved_tensor_bytes(attention, inputs)
        if run.impl == "sdpa":
            out["sdpa_backend"] = sdpa_backend(attention, inputs)
        return out

    # the first forward and backward of "compiled" compile both graphs: timed apart as compile_s
    return runner.Prepared(step=lambda: timed_step(attention, inputs, grad_out, timer), device=device,
                           warmup=run.warmup, steps=run.iters, compile_first=run.impl == "compiled", after=after,
                           record={"free_mem_bytes": free})


def make_inputs(run: AttentionRun, device: torch.device) -> tuple[tuple[torch.Tensor, ...], torch.Tensor]:
    """Q, K, V (batch, seq, d), requiring grad, and the output's gradient, from the run's seed."""
    torch.manual_seed(run.seed)
    shape = (run.batch_size, run.seq_len, run.d)
    inputs = tuple(torch.randn(shape, device=device, dtype=DTYPES[run.dtype], requires_grad=True) for _ in range(3))
    return inputs, torch.randn(shape, device=device, dtype=DTYPES[run.dtype])


def run_config(run: AttentionRun) -> dict[str, Any]:
    """One configuration alone (in a child process of the sweep): its record. Failures propagate as exceptions
    (the sweep turns them into rows)."""
    return runner.measure(prepare(run))


def measure_together(runs: list[AttentionRun], faults: list) -> list[dict[str, Any]]:
    """The implementations of one shape in one process (a child of the sweep), on the same inputs, their timed
    steps interleaved."""
    device = resolve_device(runs[0].device)
    inputs, grad_out = make_inputs(runs[0], device)
    return runner.measure_interleaved(device, [functools.partial(prepare, run, inputs, grad_out) for run in runs],
                                      faults)


def derive_figures(run: AttentionRun, record: dict[str, Any]) -> dict[str, Any]:
    """Statistics of the raw samples and the forward's achieved TFLOP/s (QK^T and PV, full seq x seq)."""
    out = runner.sample_stats(record, ("forward", "backward"))
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
    record["predicted_need_bytes"] = predicted_need_bytes(run.impl, run.batch_size, run.seq_len, run.d,
                                                          run.element_bytes)
    if record["status"] == "ok":
        record.update(derive_figures(run, record))


def progress_summary(record: dict[str, Any]) -> str:
    return f"fwd {record['forward_ms_mean']:.3f} ms, bwd {record['backward_ms_mean']:.3f} ms"


# ---- tables ----


IMPL_COLUMNS = ["d", "seq", "fwd ms", "fwd std", "bwd ms", "bwd std", "fwd TFLOP/s", "mem before bwd",
                "peak mem", "saved (autograd)", "naive predicted", "backend", "compile s", "status"]
ALWAYS_SHOWN = {"d", "seq", "fwd ms", "bwd ms", "naive predicted", "status"}
TABLE_COLUMNS = ["impl"] + IMPL_COLUMNS  # what --columns may name (impl: the heading of each table, or a column)


def impl_row(record: dict[str, Any]) -> dict[str, Any]:
    config = record["config"]
    row = {"impl": config["impl"], "d": config["d"], "seq": config["seq_len"], "status": record["status"],
           "naive predicted": format_bytes(record["predicted_naive_saved_bytes"])}
    if record["status"] != "ok":
        return row
    if record.get("note"):
        row["status"] += f" ({record['note']})"
    row.update({"fwd ms": record["forward_ms_mean"], "fwd std": record["forward_ms_std"],
                "bwd ms": record["backward_ms_mean"], "bwd std": record["backward_ms_std"],
                "fwd TFLOP/s": record["forward_tflops"],
                "mem before bwd": format_bytes(record.get("mem_before_backward_bytes")),
                "peak mem": format_bytes(record.get("peak_mem_allocated_bytes")),
                "saved (autograd)": format_bytes(record["saved_tensor_bytes"]),
                "backend": record.get("sdpa_backend"), "compile s": record.get("compile_s")})
    return row


def impl_table(records: list[dict[str, Any]], fmt: str, columns: list[str] | None = None) -> str:
    rows = [impl_row(r) for r in records]
    shown = [c for c in IMPL_COLUMNS if c in ALWAYS_SHOWN or any(row.get(c) is not None for row in rows)]
    return render_table(rows, report.pick_columns(shown, columns, fmt), fmt, floatfmt=".3f")


def memory_measure(records: list[dict[str, Any]]) -> tuple[str, str]:
    """(record key, column label) of the memory to compare: the allocator's figure where there is one (CUDA),
    else the bytes autograd saved."""
    if any("mem_before_backward_bytes" in r for r in records):
        return "mem_before_backward_bytes", "mem before bwd"
    return "saved_tensor_bytes", "saved"


def comparison_table(records: list[dict[str, Any]], impls: list[str], fmt: str) -> str:
    """One row per (d, seq): each implementation's forward and backward mean and memory, and the speed-up over
    naive (naive time / its time). A failed configuration shows its status in place of its times."""
    mem_key, mem_label = memory_measure(records)
    by_shape: dict[tuple[int, int], dict[str, dict]] = {}
    for r in records:
        by_shape.setdefault((r["config"]["d"], r["config"]["seq_len"]), {})[r["config"]["impl"]] = r
    columns = ["d", "seq"]
    for impl in impls:
        columns += [f"{impl} fwd ms", f"{impl} bwd ms", f"{impl} {mem_label}"]
        if impl != "naive" and "naive" in impls:
            columns += [f"{impl} fwd speed-up", f"{impl} bwd speed-up"]
    rows = []
    for (d, seq), found in by_shape.items():
        row: dict[str, Any] = {"d": d, "seq": seq}
        naive = found.get("naive")
        for impl, r in found.items():
            if r["status"] != "ok":
                row[f"{impl} fwd ms"] = r["status"]
                continue
            row[f"{impl} fwd ms"], row[f"{impl} bwd ms"] = r["forward_ms_mean"], r["backward_ms_mean"]
            row[f"{impl} {mem_label}"] = format_bytes(r.get(mem_key))
            if impl != "naive" and naive and naive["status"] == "ok":
                for phase, short in (("forward", "fwd"), ("backward", "bwd")):
                    row[f"{impl} {short} speed-up"] = f"{naive[f'{phase}_ms_mean'] / r[f'{phase}_ms_mean']:.2f}x"
        rows.append(row)
    return render_table(rows, columns, fmt, floatfmt=".3f")


def render_report(records: list[dict[str, Any]], fmt: str, columns: list[str] | None = None) -> str:
    """Environment header, one table per implementation (with `columns`: report.pick_columns), the comparison
    table and a note on the memory columns, from the JSONL records alone."""
    env = next((r["environment"] for r in records if "device_name" in r.get("environment", {})), None)
    config0 = records[0]["config"]
    settings = {"batch": config0["batch_size"], "dtype": config0["dtype"], "iters": config0["iters"],
                "warmup": config0["warmup"], "causal": "yes"}
    lines = [environment_header(env, **settings) if env else f"settings: {settings}"]
    done = list(dict.fromkeys(r["config"]["impl"] for r in records))
    for impl in done:
        lines += ["", f"### {impl}", "", impl_table([r for r in records if r["config"]["impl"] == impl], fmt, columns)]
    lines += ["", "### comparison", "", comparison_table(records, done, fmt), "",
              "mem before bwd: torch.cuda.memory_allocated after the forward, graph alive (CUDA only); "
              "saved (autograd): bytes the graph keeps for backward, measured with saved-tensor hooks; "
              "naive predicted: 2*batch*seq^2*elem (scores, softmax) + 4*batch*seq*d*elem (Q, K, V, output)."]
    return "\n".join(lines)


# ---- command line ----


def build_parser() -> argparse.ArgumentParser:
    p = cli.ArgParser(description=__doc__.split("\n\n")[0],
                      formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--impl", nargs="+", choices=list(IMPLEMENTATIONS), default=list(IMPLEMENTATIONS),
                   help="implementations: the model's naive attention, torch.compile of it, fused SDPA")
    p.add_argument("--d", nargs="+", type=cli.positive_int, default=[16, 32, 64, 128],
                   help="head dimension(s) d (inputs are batch x seq x d, no head axis)")
    p.add_argument("--seq-len", nargs="+", type=cli.positive_int, default=[256, 1024, 4096, 8192, 16384],
                   help="sequence length(s)")
    p.add_argument("--batch-size", type=cli.positive_int, default=8, help="batch size")
    p.add_argument("--iters", type=cli.step_count, default=100,
                   help="timed forward passes, then as many timed backward passes")
    p.add_argument("--warmup", type=cli.warmup_count, default=10,
                   help="untimed forward+backward passes before timing")
    p.add_argument("--dtype", choices=BENCH_DTYPES, default="fp32", help="dtype of Q, K and V")
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
    report.columns_or_exit(parser, args.columns, TABLE_COLUMNS)
    sweep.check_sweep_args(parser, args)
    # repeated values would only repeat rows; keep the order given
    args.impl, args.d, args.seq_len = (list(dict.fromkeys(v)) for v in (args.impl, args.d, args.seq_len))
    runs = [AttentionRun(impl=impl, d=d, seq_len=seq, batch_size=args.batch_size, dtype=args.dtype,
                         warmup=args.warmup, iters=args.iters, device=args.device, seed=args.seed, force=args.force)
            for d, seq, impl in itertools.product(args.d, args.seq_len, args.impl)]
    cli.check_tensor_sizes(parser, {"scores": (args.batch_size, max(args.seq_len), max(args.seq_len)),
                                       "Q": (args.batch_size, max(args.seq_len), max(args.d))})
    return args, runs


def plan_label(run: AttentionRun) -> str:
    """A --dry-run line: the configuration and the memory the fit guard predicts it needs."""
    need = predicted_need_bytes(run.impl, run.batch_size, run.seq_len, run.d, run.element_bytes)
    return f"{run.label()} (predicted need {format_bytes(need)})"


def main(argv: list[str] | None = None) -> int:
    args, runs = parse_args(argv)
    if args.dry_run:
        settings = (f"settings: batch {args.batch_size}, {args.dtype}, {args.warmup} warm-up, {args.iters} "
                    "iterations, causal")
        return cli.print_dry_run([plan_label(run) for run in runs], preamble=settings)
    files = ResultFiles(args.results_dir, "attention", args.out, "attention")
    experiment = sweep.Experiment(name="bench_attention", measure=run_config, measure_together=measure_together,
                                  finish=finish_record, summary=progress_summary,
                                  render=lambda records, fmt: render_report(records, fmt, args.columns))
    records, code = sweep.run_sweep(experiment, runs, files, resolve_device(args.device), args)
    if records:  # (the sweep saved the report after each row: the figures come after it)
        figures = report.figures_after_run("bench_attention", records, files) if args.plot else []
        files.publish(lambda fmt: render_report(records, fmt, args.columns), args.fmt, figures)
    return code


if __name__ == "__main__":
    sys.exit(main())
