"""The whole study in one command: every problem of parts 1 and 2, run by the experiment scripts (each command
recorded beside its result), sized to the machine, resumable, within a budget, ending in writeup.md and writeup.tex.

    python3 study.py                          # the 2026 handout; again after a kill: it continues
    python3 study.py --handout 2025 --quick   # Spring 2025's, every problem at its smallest shape
    python3 study.py --budget 2h --dry-run    # the plan, its estimate and what the budget drops; runs nothing
    python3 study.py --impl my_flash:FlashAttention2 --model my_lm:make_model --optimizer my_opt:AdamW

<results-dir>/study/<stem>/study.jsonl, a line per finished command, is the state (docs/study.md).
"""
import argparse
import contextlib
import datetime
import importlib.util
import json
import math
import os
import re
import shlex
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import textwrap
import time
from dataclasses import dataclass, field
from pathlib import Path

from tabulate import tabulate

import results

TOOLKIT = Path(__file__).resolve().parent
HANDOUTS = tuple(results.HANDOUTS)
SUBDIR = {"bench_e2e.py": "e2e", "mem_profile.py": "memory", "bench_attention.py": "attention",
          "precision_demo.py": "precision", "toy_autocast.py": "precision", "report.py": "report",
          "nsys_run.sh": "nsys", "bench_comm.py": "comm", "bench_ddp.py": "ddp"}
DROP_ORDER = ("when the budget is short, dropped first: the largest model sizes of every sweep (largest "
              "first), then the attention grids' largest head dimensions, then the warm-up study's sizes "
              "past the first")


# ---- arguments and the machine ----

def parse_duration(text: str) -> float:
    """'2h', '90m', '1h30m', '45s' -> seconds."""
    match = re.fullmatch(r"(?:(\d+(?:\.\d+)?)h)?(?:(\d+(?:\.\d+)?)m)?(?:(\d+(?:\.\d+)?)s)?", text.strip())
    seconds = sum(float(g or 0) * unit for g, unit in zip(match.groups(), (3600, 60, 1))) if match else 0
    if not seconds:
        raise argparse.ArgumentTypeError(f"not a duration of more than 0 s: {text!r} (e.g. 2h, 90m, 1h30m)")
    return seconds


def parse_args(argv=None) -> argparse.Namespace:
    parser = results.ArgParser(description=__doc__.split("\n\n")[0])
    results.add_handout_arg(parser)
    parser.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto",
                        help="auto = CUDA when torch sees a GPU")
    parser.add_argument("--quick", action="store_true", help="every problem at its smallest shape")
    parser.add_argument("--budget", type=parse_duration, help=f"plan within this time (2h): {DROP_ORDER}")
    parser.add_argument("--only", nargs="+", metavar="PROBLEM",
                        help="run only these problems (e.g. memory_profiling, torch_compile_b); the writeup "
                        "still has a section for every problem")
    parser.add_argument("--fresh", action="store_true", help="start a new study (the previous one is kept)")
    parser.add_argument("--out", help="the study's stem under <results-dir>/study/ (default: the latest "
                        "study with the same settings, else study-<UTC time>)")
    parser.add_argument("--results-dir", default="results", type=results.results_folder, help="results root")
    parser.add_argument("--model", help="your model, MODULE:CALLABLE, for bench_e2e.py, mem_profile.py, "
                        "nsys_run.sh")
    parser.add_argument("--optimizer", help="your optimizer, MODULE:CLASS, for bench_e2e.py, mem_profile.py")
    parser.add_argument("--impl", help="your attention kernel, MODULE:CALLABLE, for the flash problems")
    parser.add_argument("--adapters", help="your tests/adapters.py as a module (tests.adapters), for part 2: your "
                        "DDP classes beside the references, your sharded optimizer")
    parser.add_argument("--dry-run", action="store_true", help="print the plan and its estimate; run nothing")
    args = parser.parse_args(argv)
    results.handout_or_exit(parser, args)
    for flag in ("model", "optimizer", "impl"):
        if (value := getattr(args, flag)) is not None and not re.fullmatch(r"[\w.]+:[\w.]+", value):
            parser.error(f"--{flag} must be MODULE:CALLABLE, got {value!r}")
    if args.out is not None and not re.fullmatch(r"\w[\w.-]*", args.out):  # not '.', '..' or a flag
        parser.error(f"--out must be a plain name not starting with '.' or '-', got {args.out!r}")
    known = sorted(key for key, *_ in PROBLEM_TEXT)
    for name in args.only or ():
        if not any(selected(k, [name]) for k in known):
            parser.error(f"--only: unknown problem {name!r}; one of: {', '.join(known)}")
    return args


def probe_machine(device: str, handout: str) -> dict:
    """CUDA or CPU (a child asks torch: this script stays torch-free), free GPU memory, nsys, predicted memory."""
    machine = {"device": "cpu", "name": "cpu", "free_bytes": None, "nsys": shutil.which("nsys"), "states": {},
               "gpus": 0}
    if device == "cpu":
        return machine
    code = ("import json, torch; ok = torch.cuda.is_available(); print(json.dumps({'cuda': ok, 'name': "
            "torch.cuda.get_device_name() if ok else None, 'gpus': torch.cuda.device_count(), "
            "'free': torch.cuda.mem_get_info()[0] if ok else 0}))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=TOOLKIT)
    found = json.loads(out.stdout.strip().splitlines()[-1]) if out.returncode == 0 else {"cuda": False}
    if device == "cuda" and not found["cuda"]:
        sys.exit("study.py: error: --device cuda, but torch sees no CUDA device")
    if found["cuda"]:
        machine.update(device="cuda", name=found["name"], free_bytes=found["free"], gpus=found["gpus"],
                       states=predicted_states(handout))
    return machine


STATE_BYTES = {"forward": 4, "forward-backward": 8, "train": 16}  # fp32 per parameter: weights, grads, 2 moments


def predicted_states(handout: str) -> dict:
    """Table 1 size -> (bytes of fp32 AdamW training state, of activations at batch 4 and the handout's
    context): parameters x 16 (weights, grads, two moments); per layer about 16 fp32 tensors of batch x ctx x
    d_model plus the scores and softmax (2 x batch x heads x ctx^2); the logits."""
    h = results.get_handout(handout)
    ctx, batch = h.default_context_length, results.DEFAULT_BATCH_SIZE
    per_token = {size: m.num_layers * (16 * m.d_model + 2 * m.num_heads * ctx) + 2 * m.vocab_size
                 for size, m in h.presets.items() if size in h.table1}  # fp32 numbers kept per token
    return {size: (16 * h.presets[size].num_params, 4 * batch * ctx * n) for size, n in per_token.items()}


# ---- the plan ----

@dataclass
class Command:
    name: str                      # the stem it writes (a numbered suffix when a killed attempt left one)
    script: str
    args: list
    configs: int = 1               # configurations it runs, for the estimate
    per_config_s: float = 10.0
    drop: int = 0                  # budget: higher ranks are dropped first; 0 never
    merge: list = field(default_factory=list)   # report.py: the commands whose records it merges
    skipped: str | None = None     # a row instead of a run (does not fit, dropped, needs --impl)

    def estimate(self) -> float:
        return 0.0 if self.skipped else 5.0 + self.configs * self.per_config_s


@dataclass
class Problem:
    key: str
    title: str
    deliverable: str
    commands: list = field(default_factory=list)
    show: list = field(default_factory=list)     # commands whose tables the section shows (default: its own)
    note: str = ""
    path: str = ""                               # what it exercises, for --quick's verdict
    unmeasured: str = ""                         # what its deliverable asks that this machine cannot measure


PROBLEM_TEXT = [  # key, title, deliverable (paraphrased; per handout where they differ), handouts, what it exercises
    ("benchmarking_script_a", "benchmarking_script (a)", {
        "2025": "A script that builds a model from hyperparameters, makes a random batch, and times w warm-up and n "
                "measured forward (and backward) steps.",
        "2026": "A script that builds a model from hyperparameters, makes a random batch, and times w warm-up and n "
                "measured steps: forward only, forward and backward, or full training steps with the optimizer "
                "step."}, HANDOUTS, "timing"),
    ("benchmarking_script_b", "benchmarking_script (b)", {
        "2025": "Forward and backward time, mean and standard deviation, of every Table 1 size with 5 warm-up and "
                "10 measured steps.",
        "2026": "Forward, backward and optimizer step time, mean and standard deviation, of every Table 1 size "
                "with 5 warm-up and 10 measured steps."}, HANDOUTS, "benchmarking_script_b"),
    ("benchmarking_script_c", "benchmarking_script (c)", "The same without warm-up and with 1 or 2 warm-up "
     "steps.", HANDOUTS, "warm-up sweep"),
    ("nsys_profile", "nsys_profile (a)-(e)", "Profiles of forward, backward and optimizer step: forward time "
     "against the stopwatch, the top kernels and their calls, non-matmul kernels, the matmul share in "
     "inference and in training, softmax against the attention matmuls in time and FLOPs.", HANDOUTS, "profiler"),
    ("mixed_precision_accumulation", "mixed_precision_accumulation", "Sum 0.01 a thousand times with fp32, "
     "fp16 and mixed accumulators and addends; the accuracy of each.", HANDOUTS, "precision"),
    ("benchmarking_mixed_precision_ab", "benchmarking_mixed_precision (a), (b)", "The dtype of each ToyModel "
     "tensor under fp16 autocast; LayerNorm under fp16 and bf16 autocast.", HANDOUTS, "autocast"),
    ("benchmarking_mixed_precision_c", "benchmarking_mixed_precision (c)", "Forward and backward time with "
     "and without bf16 mixed precision, per size.", HANDOUTS, "bf16 autocast"),
    ("memory_profiling_ae", "memory_profiling (a), (e)", "Memory timelines of a forward pass and of a "
     "training step; the largest allocations and where they come from.", HANDOUTS, "memory snapshot"),
    ("memory_profiling_bcd", "memory_profiling (b)-(d)", "Peak memory per context length, forward and "
     "training step; the same under bf16; the size of one residual-stream activation.", HANDOUTS, "peak memory"),
    ("memory_profiling_f", "memory_profiling (f)", "Saved tensors per TransformerBlock from Nsight's memory "
     "tracking and PyTorch's NVTX labels; what the compiled block saves, beside the handout's 3651.31 MiB "
     "(§3.2).", ("2026",), "compiled block, nsys memory"),
    ("gradient_checkpointing", "gradient_checkpointing (a), (b)", "The memory of checkpointing every K "
     "blocks; the best K for xl, batch 4, context 2048, and its neighbours.", ("2026",), "checkpointing"),
    ("pytorch_attention", "pytorch_attention", "Naive attention, batch 8, d 16-128 by sequence 256-16384: "
     "forward and backward time, memory before backward, where it runs out of memory.", HANDOUTS, "attention timing"),
    ("torch_compile_a", "torch_compile (a)", "Compiled against eager attention on the same grid.",
     HANDOUTS, "compiled attention"),
    ("torch_compile_b", "torch_compile (b)", "Compiled against eager whole model, per size.",
     HANDOUTS, "compiled model"),
    ("flash_forward", "flash_forward (a)-(c)", "FlashAttention-2 forward: a PyTorch autograd.Function, the "
     "Triton kernel, the causal flag; each checked against the reference.", HANDOUTS, "kernel check"),
    ("flash_backward", "flash_backward", "FlashAttention-2 backward with recomputation; checked against the "
     "reference.", HANDOUTS, "flash_backward"),
    ("flash_benchmarking", "flash_benchmarking", "Your FlashAttention-2 against PyTorch attention, batch 1, "
     "causal, sequence 128-65536, d 16-128, bf16 and fp32: forward, backward, forward+backward.",
     HANDOUTS, "flash grid"),
    ("distributed_communication_single_node", "distributed_communication_single_node", "All-reduce of float32 "
     "tensors of 1 MB, 10 MB, 100 MB and 1 GB across 2, 4 and 6 processes (gloo on CPU, NCCL on GPUs), 5 warm-up "
     "calls, synchronised timing, every rank's times gathered: a table or plot and a comment on the trends.",
     HANDOUTS, "collectives"),
    ("naive_ddp_benchmarking", "naive_ddp_benchmarking", "Time per training step of naive DDP (an all-reduce per "
     "parameter after backward) on xl, 1 node x 2 GPUs, and the share of it spent communicating gradients.",
     HANDOUTS, "DDP"),
    ("minimal_ddp_flat_benchmarking", "minimal_ddp_flat_benchmarking", "The same with all gradients flattened "
     "into one all-reduce: time per step and communication, against naive.", HANDOUTS, "DDP flat"),
    ("ddp_overlap_individual_parameters_benchmarking", "ddp_overlap_individual_parameters_benchmarking (a), (b)",
     "Overlapping each parameter's all-reduce with the backward pass: time per step against the other variants, "
     "and traces that show the communication overlapped or not.", HANDOUTS, "DDP overlap"),
    ("ddp_bucketed_benchmarking", "ddp_bucketed_benchmarking", "Bucketed DDP with 1, 10, 100 and 1000 MB "
     "buckets: time per step, against no bucketing.", ("2025",), "DDP buckets"),
    ("optimizer_state_sharding_accounting", "optimizer_state_sharding_accounting (a), (b)", "Peak memory after "
     "model initialisation, before and after the optimizer step, with and without optimizer state sharding; "
     "time per step with and without.", HANDOUTS, "optimizer sharding"),
    ("fsdp_accounting", "fsdp_accounting (a), (b)", "Your FSDP beside FSDP2: memory per rank against the "
     "prediction, and per layer whether its weights' all-gather finished before its forward pass began.",
     ("2026",), "FSDP"),
]


def build_plan(args, machine) -> list:
    """Every problem of the handout with its commands, sized to the machine."""
    h, handout = args.handout, results.get_handout(args.handout)
    cpu, quick = machine["device"] == "cpu", args.quick
    small = cpu or quick  # every problem at the tiny size
    dev = ["--device", machine["device"]]
    yours = [a for flag in ("model", "optimizer") if getattr(args, flag)
             for a in (f"--{flag}", getattr(args, flag))]
    lm = ["--handout", h, *dev, *yours]
    ctx = ["--context-length", "64" if quick else "128"] if cpu else []
    steps = ["--warmup", "1", "--steps", "2"] if quick else []
    # the tiny size smaller still: --quick's DDP run, and on a CPU its training steps and memory accounting (bf16
    # has no fast CPU kernels)
    smaller = ["--d-model", "64", "--d-ff", "128", "--num-layers", "2", "--num-heads", "4", "--vocab-size", "512"]
    shrunk = smaller if cpu and quick else []  # every size is tiny then
    plot = ["--plot"] if importlib.util.find_spec("matplotlib") else []  # where a script draws a figure

    def fitting(mode):  # a size runs when its predicted state and activations fit in 90% of the free memory
        if small:
            return ["tiny"], {}
        free, per_param = machine["free_bytes"], STATE_BYTES[mode] / STATE_BYTES["train"]
        too_big = {size: f"skipped: predicted state {state * per_param / results.GIB:.1f} GiB + activations "
                   f"{act / results.GIB:.1f} GiB > 90% of free GPU memory {free / results.GIB:.1f} GiB"
                   for size, (state, act) in machine["states"].items() if state * per_param + act > 0.9 * free}
        return [s for s in machine["states"] if s not in too_big] or ["tiny"], too_big
    sizes, too_big = fitting("train")

    def cost(size, extra_s):  # per configuration: start-up + 15 steps of 6 x params x tokens at 50 TFLOP/s
        flops = 15 * 6 * machine["states"].get(size, (0,))[0] / 16 * 4 * handout.default_context_length
        return (20.0 if cpu else 40.0) + extra_s + flops / 50e12

    def merged(prefix, cmds):  # report.py merges a sweep's commands into the problem's table and figures
        if len(cmds) > 1:
            cmds.append(Command(f"{prefix}_all", "report.py", plot, per_config_s=1,
                                merge=[c.name for c in cmds]))
        elif cmds and "--plot" not in cmds[0].args:  # one command: its own figures
            cmds[0].args += plot
        return cmds

    def per_size(prefix, flags, extra_s=0.0, configs=1, drop=100, mode="train"):  # those too big: skipped rows
        fit, big = fitting(mode)
        flags = [*flags, *(["--mode", mode] if mode != "train" else [])]
        return merged(prefix, [Command(f"{prefix}_{s}", "bench_e2e.py", ["--size", s, *shrunk, *flags, *lm], configs,
                                       cost(s, extra_s), drop=drop + 10 * i if i else 0, skipped=big.get(s))
                               for i, s in enumerate([*fit, *big])])

    def per_d(prefix, flags, per_config_s, configs):
        return merged(prefix, [Command(f"{prefix}_d{d}", "bench_attention.py", [*flags, "--d", str(d), *dev],
                                       configs, per_config_s, drop=50 + i if i else 0)
                               for i, d in enumerate(ds)])

    plan = {key: Problem(key, title, text.get(h) if isinstance(text, dict) else text, path=path)
            for key, title, text, hs, path in PROBLEM_TEXT if h in hs}
    e2e_mode = "forward-backward" if h == "2025" else "train"  # 2025 times forward and backward, no optimizer
    e2e = per_size("e2e", [*ctx, *steps], mode=e2e_mode)  # (a) is the first size's command, (b) the rest, merged
    plan["benchmarking_script_a"].commands = e2e[:1]
    b = plan["benchmarking_script_b"]
    e2e_sizes = fitting(e2e_mode)[0]
    b.commands = e2e[1:] if len(e2e_sizes) > 1 else []
    b.show = ["e2e_all"] if len(e2e_sizes) > 1 else [f"e2e_{e2e_sizes[0]}"]
    warmups = ["0", "1"] if quick else ["0", "1", "2", "5"]
    c = plan["benchmarking_script_c"]
    c.commands = per_size("warmup", [*ctx, "--warmup", *warmups, *(["--steps", "2"] if quick else []), *plot],
                          configs=len(warmups), drop=20, mode=e2e_mode)

    # nsys_profile: the longest context first (2026), then nsys_run.sh, or torch.profiler without nsys
    n = plan["nsys_profile"]
    two = [s for s in ("small", "medium") if s in sizes] or sizes[:1]
    if not small and h == "2026":
        n.commands.append(Command("context_max", "bench_e2e.py", [
            "--size", *two, "--context-length", "max", *lm], 10 * len(two), 30.0))
    if not cpu and machine["nsys"]:  # 2026: each size at its own three contexts, from context_max (Study.contexts)
        runs = ([("nsys", sizes[:1] if quick else sizes, ["256"] if quick else ["128", "256", "512", "1024"])]
                if quick or h == "2025" else [(f"nsys_{s}", [s], [f"CONTEXTS={s}"]) for s in two])
        n.commands += [Command(name, "nsys_run.sh", [
            "--handout", h, "--size", *run_sizes, "--context-length", *contexts, *(["--", *yours] if yours else [])],
            2 * len(run_sizes) * (3 if contexts[0].startswith("CONTEXTS=") else len(contexts)), 60.0)
            for name, run_sizes, contexts in runs]
    else:
        n.note = ("nsys was not found on PATH" if machine["nsys"] is None else "on a CPU nsys has no GPU "
                  "kernels to trace") + (": the torch.profiler path (bench_e2e.py --profile) answers (a)-(e) "
                                         "instead.")
        n.unmeasured = "Nsight Systems profiles (need nsys and a GPU)"
        n.commands = [Command(f"profile_{mode}", "bench_e2e.py", [
            "--size", two[0], *shrunk, *(ctx or ["--context-length", "256"]), "--mode", mode, "--profile", *steps,
            *lm], 1, 20.0 if cpu else 40.0) for mode in ("forward", "train")]

    plan["mixed_precision_accumulation"].commands = [Command("precision_demo", "precision_demo.py", plot, 1, 3)]
    plan["benchmarking_mixed_precision_ab"].commands = [Command("toy_autocast", "toy_autocast.py", dev, 1, 3)]
    plan["benchmarking_mixed_precision_c"].commands = per_size(
        "bf16", [*ctx, *steps, "--dtype", "fp32", "bf16", *plot], configs=2)

    # memory: the handout's size and contexts are mem_profile.py's defaults (one command per context on a GPU)
    if small:
        mem_size, mem_ctxs = ["--size", "tiny", *shrunk], [ctx[1] if ctx else "128"]
    else:
        mem_size = [] if handout.memory_size in sizes else ["--size", sizes[-1]]
        mem_ctxs = [str(c) for c in handout.memory_contexts]
    ae, bcd = plan["memory_profiling_ae"], plan["memory_profiling_bcd"]
    if cpu:
        ae.note = ("--snapshot needs CUDA: on a CPU the accounting and saved-for-backward tables of (b)-(d) "
                   "stand in.")
        ae.unmeasured, bcd.unmeasured = "memory timelines (need CUDA)", "peak memory (needs CUDA)"
        bcd.path = "saved-tensor accounting"
        ae.show = [f"memory_{mem_ctxs[0]}"]
    else:
        ae.commands = [Command(f"snapshot_{c}", "mem_profile.py", [
            *mem_size, "--context-length", c, "--mode", "forward", "train", "--snapshot", *steps, *lm],
            2, 60.0) for c in mem_ctxs]
    bcd.commands = merged("memory", [Command(f"memory_{c}", "mem_profile.py", [
        *mem_size, "--context-length", c, "--mode", "forward", "train", "--dtype", "fp32", "bf16", *steps,
        *lm], 4, 15.0 if cpu else 40.0, drop=40 if i else 0) for i, c in enumerate(mem_ctxs)])
    if "memory_profiling_f" in plan:
        f = plan["memory_profiling_f"]  # §3.2's compiled block: xl, 16 heads, context 2048 (tiny when small)
        block = (["--size", "tiny", "--context-length", mem_ctxs[0]] if small else
                 ["--size", "xl" if "xl" in sizes else sizes[-1], "--context-length", "2048"])
        f.commands = [Command("block_compiled", "mem_profile.py", [
            *block, "--num-heads", "16", "--mode", "forward", "--compile", *steps, *lm],
            1, 30.0 if cpu else 90.0)]
        if not cpu and machine["nsys"]:
            f.commands.append(Command("nsys_memory", "nsys_run.sh", [
                "--handout", h, "--pytorch=autograd-nvtx", "--cuda-memory-usage=true", "--size",
                mem_size[1] if mem_size else "xl", "--context-length", mem_ctxs[0], "--mode", "train"],
                1, 120.0))
        else:
            f.note = ("the Nsight memory view needs nsys and a GPU: the saved-for-backward tables (per "
                      "block, and the compiled block's) are the check.")
            f.path, f.unmeasured = "compiled block", "Nsight memory tracking (needs nsys and a GPU)"
        f.show = [bcd.commands[0].name, *(c.name for c in f.commands)]
    if "gradient_checkpointing" in plan:
        g = plan["gradient_checkpointing"]  # mem_profile.py refuses your model with it, not your optimizer
        ours = ["--handout", h, *dev, *(["--optimizer", args.optimizer] if args.optimizer else [])]
        if args.model:
            g.note = "--checkpoint changes model.TransformerLM only: these commands run our model."
        if cpu:
            g.path, g.unmeasured = "predicted peaks", "the peak memory of each K (needs CUDA)"
        if small:  # at context 256 the activations outweigh the optimizer step's state: K changes the peak
            g.commands = [Command("checkpoint", "mem_profile.py", [
                *mem_size, "--mode", "train", "--context-length", "256", "--checkpoint", "0", "1", "2",
                *steps, *ours, *plot], 3, 15.0)]
        else:  # the handout's setup, also for K = 0
            size, batch, context = handout.checkpoint_setup
            g.commands = merged("checkpoint", [Command(f"checkpoint_k{k}", "mem_profile.py", [
                *(mem_size or ["--size", size]), "--context-length", str(context), "--batch-size", str(batch),
                "--mode", "train", "--checkpoint", k, *ours], 1, 60.0) for k in ("0", "1", "2", "4", "8")])

    # attention: the grids are bench_attention.py's defaults; when small, d 16 at short sequences
    grid = ["--seq-len", "64", "128", "--batch-size", "1"] if cpu else ["--seq-len", "256", "1024"]
    grid, ds, seqs = (grid, [16], 2) if small else ([], [16, 32, 64, 128], 5)
    plan["pytorch_attention"].commands = per_d("attention", ["--impl", "naive", *grid], 5.0, seqs)
    one_seq = ["--seq-len", grid[1], *grid[3:]] if quick and grid else grid  # --quick: each length compiles anew
    plan["torch_compile_a"].commands = per_d("compiled", ["--impl", "naive", "compiled", *one_seq], 20.0,
                                             2 * (1 if quick else seqs))
    plan["torch_compile_b"].commands = per_size(
        "compile", [*ctx, *steps, "--compile", "off", "on", *plot], 40.0, 2)
    flash_grid = ["--seq-len", "64", "128"] if cpu else ["--seq-len", "128", "256"] if quick else []
    impl = ["--impl", args.impl] if args.impl else []
    fb = plan["flash_benchmarking"]
    fb.commands = per_d("flash", ["--grid", "flash", *impl, *flash_grid], 5.0, 4 * (2 if grid else 10))
    if not args.impl:
        fb.note = "no --impl given: PyTorch's fused SDPA stands in for your kernel."
    # the flash problems are the student's kernel: its check against the float64 reference
    plan["flash_forward"].commands = [Command("flash_check", "bench_attention.py", [
        "--impl", args.impl or "MODULE:CALLABLE", "--d", "16", "--seq-len", "128", "--batch-size", "1",
        "--dtype", "fp32", *dev], 1, 10.0, skipped=None if args.impl else
        "skipped: needs your kernel: pass --impl MODULE:CALLABLE")]
    plan["flash_backward"].show = ["flash_check"]
    plan["flash_backward"].note = "the check column of flash_forward's command covers the gradients of Q, K, V."
    if "distributed_communication_single_node" in plan:  # NCCL with a GPU per rank; gloo on the CPU otherwise
        d = plan["distributed_communication_single_node"]
        nccl = machine.get("gpus", 0) >= 2
        if nccl:  # the handout's sizes and world sizes are bench_comm.py's defaults
            shape = ["--sizes-mb", "1", "10", "100", "--world-sizes", "2", "--reps", "5"] if quick else []
        else:
            shape = (["--sizes-mb", "0.01", "0.1", "1", "10", "--world-sizes", "2", "--reps", "5"] if quick else
                     ["--sizes-mb", "0.1", "1", "10", "--world-sizes", "2", "4"])
        d.commands = [Command("comm", "bench_comm.py", ["--backend", "nccl" if nccl else "gloo", *shape, *plot],
                              1, 10.0 if quick else 120.0)]
        if not nccl:
            d.note = (f"{'one GPU' if machine.get('gpus') == 1 else 'no GPU'}: NCCL needs a GPU per rank, so gloo "
                      "between CPU processes stands in, at small sizes; on two or more GPUs the handout's sizes "
                      "and world sizes run on NCCL.")
    # part 2: one bench_ddp.py run answers the DDP problems (NCCL across GPUs, gloo between CPU processes otherwise)
    nccl = machine.get("gpus", 0) >= 2
    ddp_shape = (["--size", "xl" if "xl" in sizes else sizes[-1], "--context-length", "512"] if nccl and not quick
                 else ["--size", "tiny", "--context-length", "64"] if not quick else  # tiny, smaller still
                 ["--size", "tiny", "--context-length", "16", *smaller])
    ddp_quick = ["--check-steps", "1", "--warmup", "0", "--steps", "2", "--profile-steps", "1"] if quick else []
    buckets = ["--bucket-mb", "1"] if quick else []
    theirs = ["--adapters", args.adapters] if args.adapters else []
    fsdp = ["--fsdp"] if "fsdp_accounting" in plan else []
    ddp = Command("ddp", "bench_ddp.py", [*ddp_shape, "--device", "cuda" if nccl else "cpu", *buckets, *ddp_quick,
                                          *fsdp, *theirs, *plot], 8, 3.0 if quick else 60.0)
    plan["naive_ddp_benchmarking"].commands = [ddp]
    for key in ("minimal_ddp_flat_benchmarking", "ddp_overlap_individual_parameters_benchmarking",
                "ddp_bucketed_benchmarking", "optimizer_state_sharding_accounting", "fsdp_accounting"):
        if key in plan:
            plan[key].show = ["ddp"]
    if not nccl:
        plan["naive_ddp_benchmarking"].note = (
            "NCCL needs a GPU per rank: 2 gloo processes on the CPU stand in, at the tiny size; on two or more GPUs "
            "the handout's xl at context 512 runs on NCCL.")
    plan["ddp_overlap_individual_parameters_benchmarking"].note = (
        "the timeline figure is each variant's profiled step as its trace recorded it; on GPUs the table's nsys "
        "command gives Nsight's screenshots.")
    if "fsdp_accounting" in plan and not args.adapters:
        plan["fsdp_accounting"].note = ("torch's FSDP2 only: pass --adapters tests.adapters for your get_fsdp "
                                        "beside it.")
    if not args.adapters:
        plan["optimizer_state_sharding_accounting"].note = ("needs your sharded optimizer: pass --adapters "
                                                            "tests.adapters (its get_sharded_optimizer).")
    for p in plan.values():
        p.show = p.show or [c.name for c in p.commands]
        for c in p.commands if not selected(p.key, args.only) else ():
            c.skipped = c.skipped or "skipped: not in --only"
    return list(plan.values())


def profile_contexts(longest: int) -> list:
    """The 2026 handout's three powers of two > 128, the largest one that trained; fewer where fewer fit (none:
    the largest)."""
    top = 1 << (longest.bit_length() - 1)
    return [c for c in (top // 4, top // 2, top) if c > 128] or [top]


def selected(key: str, only: list | None) -> bool:
    """--only names a problem, or the problems whose keys start with it and '_' (memory_profiling)."""
    return not only or any(key == o or key.startswith(o + "_") for o in only)


def apply_budget(plan, budget, scale) -> list:
    """Drop commands (highest drop rank first) until the estimate fits; returns the dropped names."""
    live = [c for p in plan for c in p.commands if not c.skipped]
    total, dropped = sum(c.estimate() for c in live) * scale, []
    for c in sorted((c for c in live if c.drop), key=lambda c: (-c.drop, -c.estimate())):
        if budget is None or total <= budget:
            break
        total -= c.estimate() * scale
        c.skipped = f"skipped: dropped to fit --budget {budget / 3600:.1f}h"
        dropped.append(c.name)
    return dropped


def hms(seconds: float) -> str:
    return f"{int(seconds // 3600)}:{int(seconds % 3600 // 60):02d}"


# ---- running ----

class Study:
    """One study folder: its ledger (study.jsonl, the state) and the commands it runs."""

    def __init__(self, root: Path):
        self.root, self.ledger = root, {}
        path = root / "study.jsonl"
        try:
            lines = path.read_text(errors="replace").splitlines() if path.is_file() else []
        except OSError as exc:
            results.exit_usage_error(f"cannot read {rel(path)}: {exc.strerror or exc}")
        for n, line in enumerate(lines, 1):
            try:
                entry = json.loads(line)
                problem = self.malformed(entry)
            except (ValueError, RecursionError):  # a line cut short by a kill, or not JSON
                entry, problem = None, "not a JSON line"
            if problem:  # never trusted, never copied into the writeup: its command runs again
                print(f"study: {rel(path)}:{n}: {problem}: ignored (its command runs again)", file=sys.stderr)
            else:
                self.ledger[entry["name"]] = entry

    def malformed(self, entry) -> str | None:
        """Why a ledger line is not one study.py wrote: a field of another type, or a file outside the study's
        folder (absolute, '..', a link that leaves it)."""
        if not isinstance(entry, dict):
            return "not an object"
        kinds = {"name": str, "command": str, "status": str, "seconds": (int, float), "files": dict}
        optional = {"cause": str, "estimate_s": (int, float), "stem": str, "log": str, "inputs": (list, type(None))}
        for key, kind in [*kinds.items(), *((k, v) for k, v in optional.items() if k in entry)]:
            if not isinstance(entry.get(key), kind) or isinstance(entry.get(key), bool):
                kinds_said = " or ".join(k.__name__ for k in (kind if isinstance(kind, tuple) else (kind,)))
                return f"{key} is {str(entry.get(key))[:40]!r}, not {kinds_said}"
        if entry["status"] not in ("ok", "failed") or not math.isfinite(entry["seconds"]):
            return f"status {entry['status'][:40]!r} / seconds {entry['seconds']}: not a finished command's"
        inside = self.root.resolve()
        for key, name in entry["files"].items():
            if not (isinstance(key, str) and isinstance(name, str) and name and not Path(name).is_absolute()
                    and ".." not in Path(name).parts and (inside / name).resolve().is_relative_to(inside)):
                return f"the file {str(name)[:80]!r} is not inside the study folder {rel(inside)}"
        return None

    def scale(self) -> float:
        """How much longer than estimated the commands measured so far took (1 before any)."""
        measured = [e for e in self.ledger.values() if e.get("estimate_s") and e["status"] == "ok"]
        estimated = sum(e["estimate_s"] for e in measured)
        return sum(e["seconds"] for e in measured) / estimated if estimated else 1.0

    def done(self, name) -> bool:
        return self.ledger.get(name, {}).get("status") == "ok" and not self.missing(name)

    def missing(self, name) -> list:
        """The recorded files of `name` that are gone (deleted since)."""
        return [str(p.relative_to(self.root)) for p in self.files(name).values() if not p.is_file()]

    def files(self, name) -> dict:
        return {k: self.root / v for k, v in self.ledger.get(name, {}).get("files", {}).items()}

    def records(self, name) -> list:
        path = self.files(name).get("jsonl")
        try:
            found = results.read_records(path) if path and path.is_file() else []
        except (OSError, ValueError, RecursionError) as exc:  # edited by hand, cut short, too large
            print(f"study: {rel(path)}: not readable as records ({str(exc)[:200]}): its facts are left out",
                  file=sys.stderr)
            return []
        return [r for r in found if isinstance(r, dict)]

    def argv(self, cmd, stem) -> list:
        if cmd.script == "nsys_run.sh":  # --results-dir before its --
            args = [a for arg in cmd.args  # CONTEXTS=SIZE: the contexts context_max found for SIZE
                    for a in (self.contexts(arg[len("CONTEXTS="):]) if arg.startswith("CONTEXTS=") else [arg])]
            return ["bash", script(cmd.script), "--results-dir", rel(self.root), *args]
        merged = [rel(self.files(m)["jsonl"]) for m in cmd.merge if self.done(m)]
        return [sys.executable, script(cmd.script), *merged, *cmd.args, "--results-dir", rel(self.root),
                "--out", stem]

    def contexts(self, size: str) -> list:
        """nsys_profile (2026): the size's longest context that trained (1024 without the search), as contexts."""
        longest = [r["config"]["model"]["context_length"] for r in self.records("context_max")
                   if results.finished(r) and size_of(r) == size] if self.done("context_max") else []
        return [str(c) for c in profile_contexts(max(longest, default=1024))]

    def run(self, cmd) -> dict:
        """Run one command (again once if it fails), its output in logs/<stem>.log; its ledger line."""
        inputs = [self.ledger[m]["stem"] for m in cmd.merge if self.done(m)] if cmd.merge else None
        earlier = self.ledger.get(cmd.name)  # a merge is redone when the commands it merges changed
        if gone := self.missing(cmd.name):
            print(f"    {cmd.name}: recorded, but {', '.join(gone)} missing: running it again", flush=True)
        elif earlier and (not cmd.merge or self.done(cmd.name) and earlier.get("inputs") == inputs):
            return earlier
        if cmd.merge and len(inputs) < 2:
            return {"status": "skipped", "cause": "fewer than two runs to merge"}
        (self.root / "logs").mkdir(parents=True, exist_ok=True)
        for attempt in (1, 2):  # a stem no attempt used before: each leaves its log
            stem = next(s for s in (cmd.name if n == 1 else f"{cmd.name}-{n}" for n in range(1, 10 ** 6))
                        if not (self.root / "logs" / f"{s}.log").exists())
            argv, log, started = self.argv(cmd, stem), self.root / "logs" / f"{stem}.log", time.time()
            with open(log, "w") as out, results.process_group(  # from here: your code
                    argv, stdout=out, stderr=subprocess.STDOUT, env={**os.environ, "PYTHON": sys.executable}) as child:
                try:
                    rc = child.wait()
                except KeyboardInterrupt as stop:
                    results.stop_process_group(child, results.signal_number(stop))
                    raise
            entry = {"name": cmd.name, "stem": stem, "command": display(argv), "rc": rc,
                     "seconds": round(time.time() - started, 1), "estimate_s": cmd.estimate(),
                     "finished_utc": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
                     "files": self.outputs(cmd, stem, started), "log": str(log.relative_to(self.root)),
                     "attempt": attempt,
                     "inputs": inputs, "status": "ok" if rc == 0 else "failed"}
            if rc == 0:
                break
            entry["cause"] = cause(log, rc)
        self.ledger[cmd.name] = entry
        with open(self.root / "study.jsonl", "a") as f:
            f.write(json.dumps(entry) + "\n")
        return entry

    def outputs(self, cmd, stem, started) -> dict:
        folder = self.root / SUBDIR[cmd.script]
        if cmd.script != "nsys_run.sh":
            found = {"md": folder / f"{stem}.md", "jsonl": folder / f"{stem}.jsonl"}
            found.update({p.stem[len(stem) + 1:] + ".png": p for p in sorted(folder.glob(f"{stem}_*.png"))})
        else:  # the .md files it wrote: its summary where there is one
            new = sorted(p for p in folder.glob("*.md") if p.stat().st_mtime >= started - 1)
            summary = [p for p in new if p.name.startswith("summary-")]
            found = {"md": summary[-1]} if summary else {f"md{i}": p for i, p in enumerate(new)}
        return {k: str(v.relative_to(self.root)) for k, v in found.items() if v.is_file()}

    def checks(self, plan) -> list:
        """(problem, verdict, why) per problem whose commands (or, without commands, the commands whose tables it
        reads) all ran: failed by a failed command or by one of its rows that is an error, a timeout or WRONG; not
        implemented yet by a row of an adapter you have not written (the course's stub); else passed."""
        verdicts = []
        for p in plan:
            # a command this run skips (--only, --budget) counts by what an earlier run recorded of it
            names = [c.name for c in p.commands if (c.name in self.ledger or not c.skipped) and not c.merge] \
                if p.commands else p.show
            if p.unmeasured and not p.commands:
                verdicts.append((p, "not measured", ""))
            elif names and all(n in self.ledger for n in names):
                rows = problem_rows(p.key, [r for n in names for r in self.records(n)])
                bad = [(str(r["status"]), r.get("label") or r.get("variant")) for r in rows
                       if str(r.get("status", "")).startswith(("error", "timeout", "WRONG", NOT_WRITTEN))]
                failed = [f"{n}: {self.ledger[n].get('cause', 'failed')}" for n in names if not self.done(n)]
                if not rows and not failed and p.key in DDP_PROBLEMS:  # none of its variants ran: no --adapters
                    continue
                failed += [f"{name}: {status}" for status, name in bad if not status.startswith(NOT_WRITTEN)]
                stubs = [status.removeprefix(NOT_WRITTEN + ": ") for status, _ in bad if status.startswith(NOT_WRITTEN)]
                if failed:
                    verdicts.append((p, "failed", failed[0] + f" (and {len(failed) - 1} more)" * (len(failed) > 1)))
                else:
                    verdicts.append((p, NOT_WRITTEN, "; ".join(dict.fromkeys(stubs))) if stubs else (p, "passed", ""))
        return verdicts


def verdict_text(p, verdict, why) -> str:
    """'memory_profiling (b)-(d) (saved-tensor accounting) passed, not measured: peak memory (needs CUDA)';
    'fsdp_accounting (FSDP) not implemented yet: write get_fsdp'."""
    ran = "" if verdict == "not measured" else f" ({p.path}) {verdict}" + (f": {why}" if why else "")
    return p.title + ran + (f", not measured: {p.unmeasured}" if p.unmeasured else "")


def rel(path) -> str:
    """A path as the commands give it: relative to the folder study.py runs in (and they run in), else whole."""
    path = Path(path).resolve()
    return str(path.relative_to(Path.cwd())) if path.is_relative_to(Path.cwd()) else str(path)


def script(name) -> str:
    return rel(TOOLKIT / name)


def display(argv) -> str:
    return shlex.join(["python3" if a == sys.executable else a for a in argv])


def cause(log: Path, rc: int) -> str:
    lines = [line.strip() for line in log.read_text(errors="replace").splitlines() if line.strip()]
    errors = [line for line in lines if "error" in line.lower()]
    return f"exit {rc}: {(errors or lines or ['no output'])[-1][:300]}"


# ---- measured facts: numbers only, read from the records ----

PHASES = ("forward", "backward", "optimizer", "step")  # bench_e2e.py's; a training step has all four


def ms(r, phase, digits=2) -> str:  # as many digits as the script's table shows
    return f"{r[phase + '_ms_mean']:.{digits}f} ms (std {r[phase + '_ms_std']:.{digits}f})"


def size_of(r) -> str:
    return str(r.get("config", {}).get("size") or r.get("label", "?").split()[0])


class NotMeasured(str):
    """A fact computed from the configuration or predicted: the writeup lists it apart from what was measured."""


def memory_facts(key, r, first: bool) -> list:
    facts = [f"{name} {r[k] / results.GIB:.3f} GiB" for k, name in (("peak_mem_allocated_bytes", "peak allocated"),
             ("peak_mem_reserved_bytes", "peak reserved")) if isinstance(r.get(k), (int, float))]  # the table's
    best = (r.get("checkpoint_prediction") or {}).get("best_k")
    if key == "gradient_checkpointing" and first and best is not None:
        peak = r["checkpoint_prediction"].get("best_predicted_peak_bytes", 0)
        facts.append(NotMeasured(f"predicted best K {best} at {peak / results.GIB:.3f} GiB"))
    if key == "memory_profiling_bcd" and "residual_stream_bytes" in r:
        facts.append(NotMeasured(f"one residual-stream activation {r['residual_stream_bytes']} B "
                                 f"({r.get('residual_stream_formula')})"))
    if key == "memory_profiling_f" and "saved_block_bytes_mean" in r:
        facts.append(f"saved for backward per block {r['saved_block_bytes_mean'] / results.MIB:.2f} MiB")
    if key == "memory_profiling_f" and "block_compiled_saved_bytes" in r:
        facts.append(f"one block at batch {r['config']['batch_size']} saves for backward "
                     f"{r['block_compiled_saved_bytes'] / results.MIB:.2f} MiB in "
                     f"{r['block_compiled_saved_tensors']} tensors compiled, "
                     f"{r['block_eager_saved_bytes'] / results.MIB:.2f} MiB in "
                     f"{r['block_eager_saved_tensors']} eager (the handout's §3.2, xl with 16 heads at "
                     "context 2048, batch 4: 3651.31 MiB compiled)")
    return facts


DDP_PROBLEMS = {  # the problem: (your rows, the references beside them), bench_ddp's variants by their first word
    "naive_ddp_benchmarking": ((), ("naive", "nocomm")),
    "minimal_ddp_flat_benchmarking": ((), ("flat", "naive", "nocomm")),
    "ddp_overlap_individual_parameters_benchmarking": (("ddp", "ddp_individual_parameters"),
                                                       ("overlap", "naive", "torch", "nocomm")),
    "ddp_bucketed_benchmarking": (("ddp_bucketed",), ("bucketed", "overlap", "nocomm")),
    "optimizer_state_sharding_accounting": (("sharded",), ("AdamW",)), "fsdp_accounting": (("fsdp",), ("fsdp2",))}
PART_TWO = ("distributed_communication_single_node", *DDP_PROBLEMS)
MEMORY_PROBLEMS = ("optimizer_state_sharding_accounting", "fsdp_accounting")
NOT_WRITTEN = "not implemented yet"  # bench_ddp's row of an adapter the course ships as `raise NotImplementedError`


def problem_rows(key, records) -> list:
    """The records a problem reads: of part 2's, bench_ddp's rows it asks about, yours first; else all."""
    if key not in DDP_PROBLEMS:
        return records
    named = [r for r in records if isinstance(r.get("variant"), str) and r["variant"].strip()]
    return [r for group in DDP_PROBLEMS[key] for r in named if r["variant"].split()[0] in group]


def ddp_fact(key, r, name) -> str:
    """A bench_ddp row in a line: for the sharding problem the optimizer state on the largest rank; for FSDP its
    state against the prediction and whether each layer's all-gather came in time; else the timed step, and from
    the profiled step (a step of its own) its communication, its share of that step and how much was hidden."""
    ranks = [points for points in r.get("ranks") or [] if points]
    if key == "optimizer_state_sharding_accounting" and r["status"] == "ok" and ranks:
        after = max(ranks, key=lambda points: points["after optimizer step"]["total"])["after optimizer step"]
        line = (f"{name}: optimizer state {after['optimizer_state'] / 1e6:.2f} MB, in all {after['total'] / 1e6:.2f} "
                f"MB after the step on the largest rank (expected "
                f"{r['expected_bytes_per_param']['after optimizer step']:g} bytes per parameter); peak "
                + (f"{after['peak_mem_allocated_bytes'] / 1e6:.2f} MB" if "peak_mem_allocated_bytes" in after
                   else "not measured on this machine (needs CUDA)"))
    elif key == "fsdp_accounting" and r.get("memory"):
        state = max(p["params"] + p["grads"] + p["optimizer_state"] for p in r["memory"])
        slacks = [x["slack_ms"] for rank in r.get("layers") or [] for x in rank if x["slack_ms"] is not None]
        line = (f"{name}: {state / 1e6:.2f} MB of parameters, gradients and optimizer state on the largest rank, "
                f"{state / r['predicted']['state_bytes']:.2f}x the prediction"
                + (f"; every layer's all-gather ended before its compute (least slack {min(slacks):.3f} ms)"
                   if slacks and min(slacks) >= 0 else f"; a layer's compute waited {-min(slacks):.3f} ms for its "
                   "all-gather" if slacks else ""))
    elif key in MEMORY_PROBLEMS or "step_ms" not in r:
        return f"{name}: {r['status']}"
    else:
        line = f"{name}: step {statistics.median(r['step_ms']):.2f} ms (median of the timed rounds)"
    if r.get("comm_ms") and key not in MEMORY_PROBLEMS:
        line += (f"; its profiled step {r['profiled_step_ms']:.2f} ms: communication {r['comm_ms']:.2f} ms "
                 f"({r['comm_ms'] / r['profiled_step_ms']:.0%}), {r['hidden_ms'] / r['comm_ms']:.0%} of it hidden "
                 "behind compute")
    return line + ("" if r["status"] == "ok" else f"; {r['status']}")


def ddp_facts(key, records) -> list:
    """bench_ddp's rows of the problem, yours first, the references beside them; which hide their communication."""
    rows = problem_rows(key, records)
    names = [r["variant"] + " (yours)" * (r["variant"].split()[0] in DDP_PROBLEMS[key][0]) for r in rows]
    facts = [ddp_fact(key, r, name) for r, name in zip(rows, names)]
    hidden = {n: r["hidden_ms"] / r["comm_ms"] for r, n in zip(rows, names) if r.get("comm_ms") and "step_ms" in r}
    if len(hidden) > 1 and key not in MEMORY_PROBLEMS:
        facts.append("; ".join(f"{n} hides {share:.0%} of its communication" if share >= 0.005 else
                               f"{n} hides none" for n, share in hidden.items()))
    no_optimizer = ["no sharded optimizer ran (--adapters)"] if key == "optimizer_state_sharding_accounting" else []
    return facts or no_optimizer


def facts_for(key, records) -> list:
    facts = [f"{r.get('label', '?')}: {r.get('status')}" for r in records if not results.finished(r)
             and not str(r.get("status", "")).startswith("skipped: measured peaks need")]
    done = [r for r in records if results.finished(r)]
    if key in ("benchmarking_script_a", "benchmarking_script_b"):
        facts += [f"{size_of(r)}: " + "".join(f"{p} {ms(r, p)}, " for p in PHASES if f"{p}_ms_mean" in r)
                  + f"backward/forward {r['backward_ms_mean'] / r['forward_ms_mean']:.2f}x"
                  for r in done if "backward_ms_mean" in r]
    elif key == "benchmarking_script_c":
        facts += [f"{size_of(r)}, warm-up {r['config']['warmup']}: forward {ms(r, 'forward')}, backward "
                  f"{ms(r, 'backward')}" for r in done if "backward_ms_mean" in r]
    elif key in ("benchmarking_mixed_precision_c", "torch_compile_b"):  # the speed-ups: its comparison table
        facts += [f"{r.get('label')}: " + ", ".join(f"{phase} {ms(r, phase)}" for phase in PHASES
                                                    if f"{phase}_ms_mean" in r) for r in done]
    elif key == "nsys_profile":
        longest = {}
        for r in (r for r in done if r.get("context_search")):
            longest[size_of(r)] = max(longest.get(size_of(r), 0), r["config"]["model"]["context_length"])
        for s, c in longest.items():
            profiled = profile_contexts(c)
            facts.append(f"longest context that trained: {s} {c}; profiled at {', '.join(map(str, profiled))}"
                         + ("" if len(profiled) == 3 else " (fewer than three powers of two > 128 fit)"))
        facts += [f"{r.get('label')}: forward {ms(r, 'forward')}" for r in done
                  if "forward_ms_mean" in r and not r.get("context_search")]
    elif key == "mixed_precision_accumulation":
        facts += [f"case {r['case']} ({r['accumulator_dtype']} += {r['addend_dtype']}"
                  f"{' converted to float32' if r.get('addend_converted_to_float32') else ''}): "
                  f"{r['result']!r}, error {r['abs_error']!r}" for r in done if "case" in r]
    elif key == "distributed_communication_single_node":
        facts += [f"{r.get('label')}: median {r['ms_median']:.3f} ms, busbw {r['busbw_gbps']:.3f} GB/s"
                  + (f" ({r['of_link_peak']:.0%} of {r['link']})" if r.get("of_link_peak") else "") for r in done]
    elif key in DDP_PROBLEMS:
        facts = ddp_facts(key, records)
    elif key.startswith(("memory_profiling", "gradient_checkpointing")):
        computed = set()  # the same residual stream for every mode and dtype: said once
        for i, r in enumerate(records):
            found = memory_facts(key, r, first=i == 0)
            for kind in (str, NotMeasured):  # each kind on a line of its own
                of_kind = [f for f in found if type(f) is kind and f not in computed]
                computed.update(f for f in of_kind if kind is NotMeasured)
                if of_kind:
                    facts.append(kind(f"{r.get('label')}: " + ", ".join(of_kind)))
    elif key.startswith(("pytorch_attention", "torch_compile_a", "flash")):
        for r in done:
            error = (r.get("check") or {}).get("max_error")
            memory = [f", {name} {results.format_bytes(r[k])}" for name, k in (
                ("memory before backward", "mem_before_backward_bytes"), ("saved", "saved_tensor_bytes")) if r.get(k)]
            facts.append(f"{r.get('label')}: forward {ms(r, 'forward', 3)}, backward {ms(r, 'backward', 3)}"
                         + "".join(memory)
                         + (f", max error {error:.2e}" if error is not None else ""))
    return facts + results.floor_facts(done)


# ---- the writeup: markdown, and the same in LaTeX ----

CODE_WIDTH = 86  # characters of a verbatim line at most, its " \" included: the page holds ~95 at 10 pt


def wrap_code(line: str) -> str:
    """A command continued with ' \\'; a comment as more comment lines: after a '\\' its rest would run."""
    comment = line.startswith("#")
    line = results.ascii_fold(line).replace("\\end{verbatim}", "\\end {verbatim}")  # it would end the verbatim
    parts = textwrap.wrap(line, CODE_WIDTH - 2, subsequent_indent="#   " if comment else " " * 6,
                          break_long_words=False, break_on_hyphens=False)
    return ("\n" if comment else " \\\n").join(parts or [""])


def tex(markdown: str) -> str:
    return results.latex_text(results.md_unescape(markdown))


def md_cells(row: str) -> list:
    """The cells of a markdown table row, what md_cell escaped as it was ('\\|' is a '|' inside a cell)."""
    cells = re.findall(r"((?:\\.|[^|\\])*)\|", row.strip().removeprefix("|"))
    return [results.md_unescape(c.strip()) for c in cells]


FIGURE = re.compile(r"!\[[^\]]*\]\(((?!/)(?!.*\.\.)[\w./-]+\.png)\)")  # the study's own: relative, no '..'


def md_to_tex(markdown: str) -> str:
    """The writeup (each script's .md in it) in LaTeX: pipe tables through tabulate's latex_booktabs, code
    verbatim (long lines wrapped), lists, figures; the first heading a section, each problem a subsection."""
    out, lines, i = [], markdown.splitlines(), 0
    while i < len(lines):
        line, start = lines[i].strip(), i
        if line.startswith("|"):
            rows = []
            while i < len(lines) and lines[i].lstrip().startswith("|"):
                cells = [results.ascii_fold(c) for c in md_cells(lines[i])]
                if not all(re.fullmatch(r":?-+:?", c) for c in cells):
                    rows.append(cells)
                i += 1
            if not any(rows):  # '|' opening a line of text: text
                out += [tex(x.strip()) + "\n" for x in lines[start:i]]
                continue
            shrink = "\\ifdim\\width>\\linewidth\\linewidth\\else\\width\\fi"  # a wide table, never a narrow one
            for group in column_groups(rows[0]):
                part = [[row[c] for c in group] for row in rows]
                body, head = (part[1:], part[0]) if len(rows) > 1 else (part, ())  # a lone row: a row, no header
                table = results.latex_rows(tabulate(body, head, tablefmt="latex_booktabs", disable_numparse=True))
                out.append(f"\\begin{{center}}\\resizebox{{{shrink}}}{{!}}{{%\n{table}}}\\end{{center}}")
            continue
        end = next((j for j in range(i + 1, len(lines)) if lines[j].strip() == "```"), None) if line == "```" else None
        if end is not None:  # an unmatched fence is text
            i = end
            out.append("\\begin{verbatim}\n" + "\n".join(map(wrap_code, lines[start + 1:i])) + "\n\\end{verbatim}")
        elif line.startswith("- "):
            while i + 1 < len(lines) and lines[i + 1].startswith("- "):
                i += 1
            out.append("\\begin{itemize}\n" + "".join(f"\\item {tex(x[2:])}\n" for x in lines[start:i + 1])
                       + "\\end{itemize}")
        elif figure := FIGURE.fullmatch(line):
            out.append(f"\\includegraphics[width=\\linewidth]{{{figure[1]}}}")
        elif line.startswith("#"):
            command = "section*" if i == 0 else "subsection*" if re.match(r"## \d+\. ", line) else "paragraph"
            out.append(f"\\{command}{{{tex(line.lstrip('#').strip())}}}")
        elif line:
            out.append(tex(line) + "\n")
        i += 1
    return "\n".join(out)


TEX_COLUMNS = 10  # a wider table is split: at 19 columns on one page its text was 3-4 pt
TEX_KEYS = ("run", "size", "ctx", "seq", "d", "dtype", "mode", "impl", "K", "warmup", "compile", "case")


def column_groups(header: list) -> list:
    """The column indices of each LaTeX table a markdown table becomes: all of them when it has at most
    TEX_COLUMNS, else parts of at most TEX_COLUMNS, each with the columns that name a row (size, ctx, ...)."""
    if len(header) <= TEX_COLUMNS:
        return [list(range(len(header)))]
    keys = [i for i, name in enumerate(header) if name in TEX_KEYS][:TEX_COLUMNS // 2]
    rest = [i for i in range(len(header)) if i not in keys]
    parts = -(-len(rest) // (TEX_COLUMNS - len(keys)))
    step = -(-len(rest) // parts)  # parts of even width: no column left alone in a part of its own
    return [sorted(keys + rest[k:k + step]) for k in range(0, len(rest), step)]


def demoted(markdown: str) -> str:
    """A script's report inside a problem's section: its headings one level down, the rest as written, a code
    fence it leaves open escaped (it would swallow the writeup after it)."""
    lines = re.sub(r"^(#{1,5}) ", r"#\1 ", markdown, flags=re.MULTILINE).split("\n")
    fences = [i for i, line in enumerate(lines) if line.strip() == "```"]
    if len(fences) % 2:
        lines[fences[-1]] = results.md_text(lines[fences[-1]])
    return "\n".join(lines)


def writeup(study, plan, machine, args) -> str:
    """A header, then per problem: deliverable, commands, tables, figures, measured facts, empty Answer:."""
    where = ("on a CPU: every problem at the tiny size, with the study's shapes scaled down (context "
             f"{'64' if args.quick else '128'} at batch {results.DEFAULT_BATCH_SIZE}"
             + ("; training steps and memory tables at d_model 64, 2 layers, vocabulary 512" if args.quick else "")
             + ", checkpointing at context 256" * any(p.key == "gradient_checkpointing" for p in plan)
             + f"; attention d 16 at sequences 64-128{' (compiled: 64)' if args.quick else ''}, batch 1)"
             if machine["device"] == "cpu" else
             f"on {machine['name']} ({machine['free_bytes'] / results.GIB:.1f} GiB free), sized to its memory")
    ran = sorted({2 if p.key in PART_TWO else 1 for p in plan for c in p.commands if c.name in study.ledger}) or [1, 2]
    out = [f"# CS336 assignment 2, part{'s' * (len(ran) > 1)} {' and '.join(map(str, ran))} (handout "
           f"{args.handout}): the study {where}"
           + (", --quick: every problem at its smallest shape" if args.quick else ""), "",
           f"- model: {args.model or 'ours (model.TransformerLM)'}; optimizer: "
           f"{args.optimizer or 'ours (optim.AdamW)'}; attention kernel (--impl): "
           f"{args.impl or 'none (PyTorch SDPA stands in)'}",
           results.md_text(f"- study folder: {rel(study.root)}; interpreter: {sys.executable} (shown as python3)"),
           results.md_text(f"- every command below ran from {Path.cwd()}; its log is in the study folder's logs/")]
    if not importlib.util.find_spec("matplotlib"):
        out += ["- no figures: matplotlib is not installed (pip install matplotlib); then `python3 report.py "
                "FILE.jsonl --plot` draws a command's figures from its records, or a study with --fresh has them"]
    out += [""]
    if verdicts := study.checks(plan):
        out += ["Checks: " + "; ".join(verdict_text(*verdict) for verdict in verdicts), ""]
    owner = {c.name: (n, p.title) for n, p in enumerate(plan, 1) for c in p.commands}  # where a table is shown
    said = {}  # fact -> the section that listed it first
    for n, p in enumerate(plan, 1):
        out += [f"## {n}. {p.title}", "", f"Deliverable: {p.deliverable}", ""]
        out += [f"Note: {p.note}", ""] if p.note else []
        lines = [] if p.commands else [f"# no command of its own: it reads the tables of {', '.join(p.show)}"]
        for c in p.commands:
            entry = study.ledger.get(c.name)
            cause = f": {entry['cause']}" if entry and entry.get("cause") else ""
            lines += ([results.one_line(f"# {entry['status']}, {entry['seconds']:.0f} s{cause}"),
                       results.one_line(entry["command"])] if entry else  # copied whole, whatever this run skips
                      [f"# {c.name}: {c.skipped or 'not run yet'}"])
        out += ["```", *lines, "```", ""]
        merges = {c.name: c.merge for c in p.commands if c.merge}
        covered = {m for name, runs in merges.items() if study.done(name) for m in runs}
        tables, sources = [], []  # the merged table where the merge ran, else the tables of its runs
        for name in (n for n in p.show if n not in covered):
            runs = [m for m in merges.get(name, [name]) if study.done(m)]
            tables += [name] if name in merges and study.done(name) else runs
            sources += runs  # the facts come from the runs' own records
        elsewhere = [name for name in tables if owner.get(name, (n,))[0] != n]
        for name in dict.fromkeys(tables):
            if name in elsewhere:  # each table once: in the section of the command that made it
                out += [f"(The tables of {name} are in section {owner[name][0]}, {owner[name][1]}.)\n"]
                continue
            files = study.files(name)
            out += [demoted(files[k].read_text(errors="replace").rstrip("\n")) + "\n" for k in sorted(files)
                    if k.startswith("md")]
            out += [f"![{files[k].name}]({os.path.relpath(files[k], study.root)})\n" for k in sorted(files)
                    if k.endswith(".png")]
        try:
            facts = facts_for(p.key, [r for name in dict.fromkeys(sources) for r in study.records(name)])
        except (KeyError, TypeError, ZeroDivisionError):  # a record without a field: its table stands alone
            facts = []
        earlier = sorted({said[x] for x in facts if x in said})
        facts = [x for x in facts if said.setdefault(x, n) == n]
        computed = [x for x in facts if isinstance(x, NotMeasured)]
        measured = [x for x in facts if not isinstance(x, NotMeasured)]
        measured += [f"the facts of section {m} ({plan[m - 1].title})" for m in earlier]
        measured = measured or ["(not run)" if not tables else "(the tables above)" if set(tables) - set(elsewhere)
                                else f"(the tables of section {', '.join(str(owner[t][0]) for t in elsewhere)})"]
        measured += [f"not measured on this machine: {p.unmeasured}"] if p.unmeasured else []
        out += ["Measured:", "", *(f"- {results.md_text(x)}" for x in measured), ""]
        out += ["Computed or predicted (not measured):", "", *(f"- {results.md_text(x)}" for x in computed), ""] if computed else []
        out += ["Answer:", ""]
    return "\n".join(out)


def write_writeup(study, plan, machine, args) -> Path:
    markdown = writeup(study, plan, machine, args)
    fonts = ("\\IfFileExists{cmap.sty}{\\usepackage{cmap}}{}\n\\usepackage[T1]{fontenc}\n"  # "fi" copies as f, i
             "\\IfFileExists{lmodern.sty}{\\usepackage{lmodern}}{}\n")  # outline fonts, not bitmaps
    latex = ("\\documentclass[10pt]{article}\n\\usepackage[margin=2cm]{geometry}\n\\usepackage{booktabs}\n"
             "\\usepackage{graphicx}\n" + fonts + "\\begin{document}\n" + md_to_tex(markdown)
             + "\n\\end{document}\n")
    for name, text in (("writeup.md", markdown), ("writeup.tex", latex)):  # whole files, even when killed
        results.replace_text(study.root / name, text)
    return study.root / "writeup.md"


# ---- main ----

def settings_differ(recorded: object, settings: dict) -> str:
    """'' when a study was made with these settings (one it predates reads as None, the default), else what differs:
    'impl ours -> torch, adapters None -> tests.adapters'."""
    recorded = recorded if isinstance(recorded, dict) else {}
    return ", ".join(f"{k} {recorded.get(k)} -> {v}" for k, v in settings.items() if recorded.get(k) != v)


def study_root(args, settings) -> Path:
    """--out; else the latest study with the same settings (unless --fresh); else a new study-<UTC time>."""
    base = Path(args.results_dir) / "study"
    if args.out and not (args.fresh and (base / args.out).exists()):
        return base / args.out
    for folder in sorted(base.iterdir(), reverse=True) if not args.fresh and base.is_dir() else []:
        with contextlib.suppress(OSError, ValueError):
            if not settings_differ(json.loads((folder / "settings.json").read_text()), settings):
                return folder
    stem = args.out or f"study-{datetime.datetime.now(datetime.UTC):%Y%m%d-%H%M%S}"
    return next(base / name for name in (stem if n == 1 else f"{stem}-{n}" for n in range(1, 10 ** 6))
                if not (base / name).exists())


def print_plan(plan, study, scale):
    for n, p in enumerate(plan, 1):
        print(f"[{n}/{len(plan)}] {p.title}" + (f"\n    note: {p.note}" if p.note else "")
              + ("" if p.commands else f"\n    the tables of: {', '.join(p.show)}"))
        for c in p.commands:
            to_do = not c.skipped and not (study.done(c.name) and not c.merge)
            what = f"merge {' '.join(c.merge)}" if c.merge else display([sys.executable, script(c.script), *c.args])
            print(f"    {c.name}: {c.skipped or (what if to_do else 'done')}"
                  + (f"   ~{c.estimate() * scale:.0f} s" if to_do else ""))
    print("nothing was run (drop --dry-run to run it)")


@contextlib.contextmanager
def study_lock(root: Path):
    """study.lock holds the running study's pid and host: a second run in the folder would run every command
    again, each timed under the other's load. It is written whole beside and linked into place, so a full disk
    never leaves an empty one; one whose process is gone (killed), or that names none, is taken over."""
    lock, mine = root / "study.lock", f"{os.getpid()} {socket.gethostname()}"
    claim = root / f".study.lock.{os.getpid()}"
    try:
        root.mkdir(parents=True, exist_ok=True)
        claim.write_text(mine)
        for attempt in (1, 2):
            try:
                os.link(claim, lock)
                break
            except FileExistsError:
                pid, host = "?", "?"
                with contextlib.suppress(OSError, ValueError):
                    pid, host = lock.read_text().split()
                dead = pid.isdigit() and host == socket.gethostname() and not results.alive(int(pid))
                if attempt == 1 and (not pid.isdigit() or dead):
                    lock.unlink(missing_ok=True)
                    continue
                results.exit_usage_error(f"a study is running in this folder: pid {pid} on {host} (if it is not, "
                                         f"delete {rel(lock)})")
    except OSError as exc:  # a read-only folder, a full disk
        results.exit_usage_error(f"cannot write the lock in {rel(root)}: {exc.strerror or exc} (choose another "
                                 "--results-dir, or free some space)")
    finally:
        with contextlib.suppress(OSError):
            claim.unlink()
    try:
        yield
    finally:
        with contextlib.suppress(OSError):
            if lock.read_text() == mine:
                lock.unlink()


def conduct(args, machine, settings, root) -> int:
    """The plan and its estimate; without --dry-run, every command not recorded yet, then the writeup."""
    study, plan = Study(root), build_plan(args, machine)
    for c in (c for p in plan for c in p.commands if study.done(c.name) and not c.merge):
        c.per_config_s, c.configs = 0.0, 0  # what is already done costs nothing
    scale = study.scale()
    dropped = apply_budget(plan, args.budget, scale)
    total = sum(c.estimate() for p in plan for c in p.commands) * scale
    print(f"study: handout {args.handout} on {machine['name']} ({machine['device']}) -> {rel(root)}"
          + (f" (resuming: {len(study.ledger)} commands recorded)" if study.ledger else ""))
    scaled = f", scaled by the measured times x{scale:.2f}" if scale != 1 else ""
    within = f" within --budget {hms(args.budget)}" if args.budget else ""
    print(f"estimate {hms(total)} (h:mm{scaled}){within}")
    if args.budget:
        print(DROP_ORDER + (": dropped " + ", ".join(dropped) if dropped else ": nothing dropped"))
        if total > args.budget:
            print(f"note: even after dropping, the estimate exceeds the budget by {hms(total - args.budget)}")
    if args.dry_run:
        print_plan(plan, study, scale)
        return 0
    if not (root / "settings.json").exists():
        results.replace_text(root / "settings.json", json.dumps(settings) + "\n")
    failed = []
    handler = signal.signal(signal.SIGINT, signal.default_int_handler)  # also when started in the background
    with results.sigterm_as_interrupt():
        try:
            for n, p in enumerate(plan, 1):
                left = sum(c.estimate() for q in plan[n - 1:] for c in q.commands) * study.scale()
                print(f"[{n}/{len(plan)}] {p.title} ... ETA {hms(left)}", flush=True)
                for c in (c for c in p.commands if not c.skipped):
                    earlier = study.ledger.get(c.name)
                    entry = study.run(c)
                    c.per_config_s, c.configs = 0.0, 0
                    state = "recorded earlier" if entry is earlier else entry["status"]
                    took = f" ({entry['seconds']:.0f} s)" if "seconds" in entry else ""
                    cause = f": {entry['cause']}" if entry.get("cause") else ""
                    print(f"    {c.name}: {state}{took}{cause}", flush=True)
                    failed += [c.name] if entry["status"] == "failed" else []
        except KeyboardInterrupt as stop:
            for signum in (signal.SIGINT, *results.STOP_SIGNALS):  # a second signal does not cut the writeup short
                signal.signal(signum, signal.SIG_IGN)
            path = write_writeup(study, plan, machine, args)
            print(f"stopped by signal {results.signal_number(stop)}: finished commands kept; run the same command "
                  f"to continue ({rel(path)} has what is done)", file=sys.stderr)
            return 128 + results.signal_number(stop)
        finally:
            signal.signal(signal.SIGINT, handler)
    path = write_writeup(study, plan, machine, args)
    checks = study.checks(plan)
    for verdict in ("passed", "failed", NOT_WRITTEN):
        names = [f"{p.title} ({p.path})" + f": {why}" * bool(why) for p, v, why in checks if v == verdict]
        if names or verdict != NOT_WRITTEN:
            print(f"{verdict}: {'; '.join(names) or 'none'}")
    if unmeasured := [f"{p.title}: {p.unmeasured}" for p in plan if p.unmeasured]:
        print(f"not measured on this machine: {'; '.join(unmeasured)}")
    if failed:
        print("failed commands: " + ", ".join(failed) + " (causes in the writeup and logs/)")
    print(f"wrote {rel(path)} and {rel(path.with_suffix('.tex'))} (its PDF: cd {shlex.quote(rel(root))} && "
          f"{results.PDFLATEX} writeup.tex)")
    return 1 if failed or any(v == "failed" for _, v, _ in checks) else 0


def main(argv=None) -> int:
    args = parse_args(argv)
    machine = probe_machine(args.device, args.handout)
    settings = {"handout": args.handout, "quick": args.quick, "device": machine["device"],
                "model": args.model, "optimizer": args.optimizer, "impl": args.impl, "adapters": args.adapters}
    root = study_root(args, settings).resolve()
    with contextlib.suppress(OSError, ValueError):  # --out names a study: its tables are of its own settings
        if differ := settings_differ(json.loads((root / "settings.json").read_text()), settings):
            results.exit_usage_error(f"{rel(root)} is a study with other settings ({differ}): choose another "
                                     "--out, or add --fresh to start a new study beside it")
    try:
        with contextlib.nullcontext() if args.dry_run else study_lock(root):
            return conduct(args, machine, settings, root)
    except OSError as exc:  # a full disk, a read-only folder: what is recorded stays, and the same command resumes
        print(f"study.py: error: cannot write {exc.filename or rel(root)}: {exc.strerror or exc}; the finished "
              f"commands stay recorded in {rel(root / 'study.jsonl')}: run the same command again to continue",
              file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
