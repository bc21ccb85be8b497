"""The whole study in one command: every part-1 problem of the handout, run by the experiment scripts as a student
would run them (each command recorded beside its result), sized to the machine, resumable, within a time budget,
ending in a writeup (markdown and LaTeX) with every table and figure and an empty `Answer:` per problem.

    python3 study.py                          # the 2026 handout's part 1; again after a kill: it continues
    python3 study.py --handout 2025           # the Spring 2025 handout's part 1
    python3 study.py --quick                  # every problem at its smallest shape: a check of the whole toolkit
    python3 study.py --budget 2h --dry-run    # the plan, its estimate and what the budget drops; runs nothing
    python3 study.py --fresh                  # a new study beside the old one (nothing is deleted)
    python3 study.py --impl my_flash:FlashAttention2 --model my_lm:make_model --optimizer my_opt:AdamW

The saved records are the state: results/study/<stem>/study.jsonl has one line per finished command (its command
line, exit status, time, the stem it wrote); a command without its line runs again, under a new stem, so a partial
run is never mixed into a table. Sweeps are split into one command per size (or head dimension), so a kill loses
at most the configuration that was running. docs/study.md is the manual.
"""
import argparse
import datetime
import importlib.util
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from tabulate import tabulate

import results
TOOLKIT = Path(__file__).resolve().parent
HANDOUTS = ("2026", "2025")
SUBDIR = {"bench_e2e.py": "e2e", "mem_profile.py": "memory", "bench_attention.py": "attention",
          "precision_demo.py": "precision", "toy_autocast.py": "precision", "report.py": "report",
          "nsys_run.sh": "nsys"}
GIB = 2 ** 30
DROP_ORDER = ("when the budget is short, dropped first: the largest model sizes of every sweep (largest first), "
              "then the attention grids' largest head dimensions, then the warm-up study's sizes past the first")


# ---- arguments ----

def parse_duration(text: str) -> float:
    """'2h', '90m', '1h30m', '45s' -> seconds."""
    match = re.fullmatch(r"(?:(\d+(?:\.\d+)?)h)?(?:(\d+(?:\.\d+)?)m)?(?:(\d+(?:\.\d+)?)s)?", text.strip())
    if not text.strip() or not match or not any(match.groups()):
        raise argparse.ArgumentTypeError(f"not a duration: {text!r} (e.g. 2h, 90m, 1h30m)")
    h, m, s = (float(g or 0) for g in match.groups())
    return h * 3600 + m * 60 + s


def parse_args(argv=None) -> argparse.Namespace:
    parser = results.ArgParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--handout", choices=HANDOUTS, default=os.environ.get("CS336_HANDOUT") or "2026",
                        help="whose part 1 to run: 2026 (v26.1.1) or 2025 (Spring 2025) (default: $CS336_HANDOUT, "
                        "else 2026)")
    parser.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto",
                        help="auto = CUDA when torch sees a GPU (default: auto)")
    parser.add_argument("--quick", action="store_true", help="every problem at its smallest shape")
    parser.add_argument("--budget", type=parse_duration, help="plan within this time (2h, 90m): " + DROP_ORDER)
    parser.add_argument("--only", nargs="+", metavar="PROBLEM",
                        help="run only these problems (e.g. memory_profiling, torch_compile_b); the writeup still "
                        "has a section for every problem")
    parser.add_argument("--fresh", action="store_true", help="start a new study (the previous one is kept)")
    parser.add_argument("--out", help="the study's stem under <results-dir>/study/ (default: the latest study with "
                        "the same settings, else study-<UTC time>)")
    parser.add_argument("--results-dir", default="results", help="results root (default: results)")
    parser.add_argument("--model", help="your model, MODULE:CALLABLE, for bench_e2e.py, mem_profile.py, nsys_run.sh")
    parser.add_argument("--optimizer", help="your optimizer, MODULE:CLASS, for bench_e2e.py and mem_profile.py")
    parser.add_argument("--impl", help="your attention kernel, MODULE:CALLABLE, for the flash problems")
    parser.add_argument("--dry-run", action="store_true", help="print the plan with its estimate; run nothing")
    args = parser.parse_args(argv)
    for flag in ("model", "optimizer", "impl"):
        value = getattr(args, flag)
        if value is not None and not re.fullmatch(r"[\w.]+:[\w.]+", value):
            parser.error(f"--{flag} must be MODULE:CALLABLE, got {value!r}")
    if args.out is not None and not re.fullmatch(r"[\w.-]+", args.out):
        parser.error(f"--out must be a plain name, got {args.out!r}")
    known = {p.key for p in problems("2026")} | {p.key for p in problems("2025")}
    for name in args.only or ():
        if not any(k == name or k.startswith(name + "_") for k in known):
            parser.error(f"--only: unknown problem {name!r}; one of: {', '.join(sorted(known))}")
    return args


# ---- the machine ----

def probe_machine(device: str, handout: str) -> dict:
    """CUDA or CPU, free GPU memory, nsys; on CUDA the predicted training state of each size from
    bench_e2e.py --dry-run (this script itself stays torch-free: a child asks torch)."""
    machine = {"device": "cpu", "name": "cpu", "free_bytes": None, "nsys": shutil.which("nsys"), "states": {}}
    if device != "cpu":
        code = ("import json, torch; ok = torch.cuda.is_available(); print(json.dumps({'cuda': ok, 'name': "
                "torch.cuda.get_device_name() if ok else None, 'free': torch.cuda.mem_get_info()[0] if ok else 0}))")
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=TOOLKIT)
        found = json.loads(out.stdout.strip().splitlines()[-1]) if out.returncode == 0 else {"cuda": False}
        if device == "cuda" and not found["cuda"]:
            sys.exit("study.py: error: --device cuda, but torch sees no CUDA device")
        if found["cuda"]:
            machine.update(device="cuda", name=found["name"], free_bytes=found["free"])
            machine["states"] = predicted_states(handout)
    return machine


def predicted_states(handout: str) -> dict:
    """size -> (bytes of fp32 AdamW training state, bytes of activations at batch 4, the handout's context), in
    Table 1's order, from the size table bench_e2e.py --dry-run --size all prints: parameters x 16 (weights, grads, two moments) and, per layer,
    about 16 fp32 tensors of batch x ctx x d_model plus the scores and softmax (2 x batch x heads x ctx^2)."""
    out = subprocess.run([sys.executable, "bench_e2e.py", "--dry-run", "--size", "all", "--handout", handout,
                          "--device", "cuda"], capture_output=True, text=True, cwd=TOOLKIT).stdout
    ctx, batch, states = (512 if handout == "2026" else 128), 4, {}
    for line in out.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 7 and cells[1].isdigit() and cells[-1].replace(",", "").isdigit():
            d, _, layers, heads = (int(c) for c in cells[1:5])
            act = 4 * layers * batch * ctx * (16 * d + 2 * heads * ctx) + 2 * 4 * batch * ctx * 10_000
            states[cells[0]] = (16 * int(cells[-1].replace(",", "")), act)
    return states


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


PROBLEM_TEXT = [  # key, title, deliverable (paraphrased), handouts
    ("benchmarking_script_a", "benchmarking_script (a)", "A script that builds a model from hyperparameters, makes "
     "a random batch, and times w warm-up and n measured forward (and backward) steps.", HANDOUTS),
    ("benchmarking_script_b", "benchmarking_script (b)", "Forward and backward time, mean and standard deviation, "
     "of every Table 1 size with 5 warm-up and 10 measured steps.", HANDOUTS),
    ("benchmarking_script_c", "benchmarking_script (c)", "The same without warm-up and with 1 or 2 warm-up steps.",
     HANDOUTS),
    ("nsys_profile", "nsys_profile (a)-(e)", "Profiles of forward, backward and optimizer step: forward time against "
     "the stopwatch, the top kernels and their calls, non-matmul kernels, the matmul share in inference and in "
     "training, softmax against the attention matmuls in time and FLOPs.", HANDOUTS),
    ("mixed_precision_accumulation", "mixed_precision_accumulation", "Sum 0.01 a thousand times with fp32, fp16 and "
     "mixed accumulators and addends; the accuracy of each.", HANDOUTS),
    ("benchmarking_mixed_precision_ab", "benchmarking_mixed_precision (a), (b)", "The dtype of each ToyModel tensor "
     "under fp16 autocast; LayerNorm under fp16 and bf16 autocast.", HANDOUTS),
    ("benchmarking_mixed_precision_c", "benchmarking_mixed_precision (c)", "Forward and backward time with and "
     "without bf16 mixed precision, per size.", HANDOUTS),
    ("memory_profiling_ae", "memory_profiling (a), (e)", "Memory timelines of a forward pass and of a training step; "
     "the largest allocations and where they come from.", HANDOUTS),
    ("memory_profiling_bcd", "memory_profiling (b)-(d)", "Peak memory per context length, forward and training "
     "step; the same under bf16; the size of one residual-stream activation.", HANDOUTS),
    ("memory_profiling_f", "memory_profiling (f)", "Saved tensors per TransformerBlock from Nsight's memory tracking "
     "and PyTorch's NVTX labels.", ("2026",)),
    ("gradient_checkpointing", "gradient_checkpointing (a), (b)", "The memory of checkpointing every K blocks; the "
     "best K for xl, batch 4, context 2048, and its neighbours.", ("2026",)),
    ("pytorch_attention", "pytorch_attention", "Naive attention, batch 8, d 16-128 by sequence 256-16384: forward and "
     "backward time, memory before backward, where it runs out of memory.", HANDOUTS),
    ("torch_compile_a", "torch_compile (a)", "Compiled against eager attention on the same grid.", HANDOUTS),
    ("torch_compile_b", "torch_compile (b)", "Compiled against eager whole model, per size.", HANDOUTS),
    ("flash_forward", "flash_forward (a)-(c)", "FlashAttention-2 forward: a PyTorch autograd.Function, the Triton "
     "kernel, the causal flag; each checked against the reference.", ("2025",)),
    ("flash_backward", "flash_backward", "FlashAttention-2 backward with recomputation; checked against the "
     "reference.", ("2025",)),
    ("flash_benchmarking", "flash_benchmarking", "Your FlashAttention-2 against PyTorch attention, batch 1, causal, "
     "sequence 128-65536, d 16-128, bf16 and fp32: forward, backward, forward+backward.", HANDOUTS),
]


def problems(handout: str) -> list:
    return [Problem(key, title, text) for key, title, text, hs in PROBLEM_TEXT if handout in hs]


def build_plan(args, machine) -> list:
    """Every problem of the handout with its commands, sized to the machine."""
    h, cpu, quick = args.handout, machine["device"] == "cpu", args.quick
    dev = ["--device", machine["device"]]
    yours = [*(["--model", args.model] if args.model else []), *(["--optimizer", args.optimizer]
                                                                  if args.optimizer else [])]
    lm = ["--handout", h, *dev, *yours]
    ctx = ["--context-length", "64" if quick else "128"] if cpu else []
    steps = ["--warmup", "1", "--steps", "2"] if quick else []
    e2e_s = 20.0 if cpu else 40.0
    plot = ["--plot"] if importlib.util.find_spec("matplotlib") else []  # the figures, where a script draws one
    if cpu or quick:
        sizes, too_big = ["tiny"], {}
    else:  # fits when the predicted state and activations fit in free memory
        free, sizes, too_big = machine["free_bytes"], [], {}
        for size in machine["states"]:
            state, act = machine["states"].get(size, (0, 0))
            if state + act > 0.9 * free:
                too_big[size] = (f"skipped: predicted state {state / GIB:.1f} GiB + activations {act / GIB:.1f} GiB "
                                 f"> 90% of free GPU memory {free / GIB:.1f} GiB")
            else:
                sizes.append(size)
        sizes = sizes or ["tiny"]

    def cost(size, extra_s):  # seconds per configuration: start-up + 15 steps of 6 x params x tokens at 50 TFLOP/s
        params = machine["states"].get(size, (0, 0))[0] / 16
        return e2e_s + extra_s + (0 if cpu else 15 * 6 * params * 4 * (512 if h == "2026" else 128) / 50e12)

    def per_size(prefix, flags, extra_s, configs=1):
        cmds = [Command(f"{prefix}_{s}", "bench_e2e.py", ["--size", s, *flags, *lm], configs, cost(s, extra_s),
                        drop=100 + 10 * i if i else 0) for i, s in enumerate(sizes)]
        cmds += [Command(f"{prefix}_{s}", "bench_e2e.py", ["--size", s, *flags, *lm], skipped=why)
                 for s, why in too_big.items()]
        if len(sizes) > 1:
            cmds.append(Command(f"{prefix}_all", "report.py", plot, per_config_s=1, merge=[c.name for c in cmds]))
        return cmds

    def per_d(prefix, flags, ds, per_config_s, configs):
        cmds = [Command(f"{prefix}_d{d}", "bench_attention.py", [*flags, "--d", str(d), *dev], configs,
                        per_config_s, drop=50 + i if i else 0) for i, d in enumerate(ds)]
        if len(ds) > 1:
            cmds.append(Command(f"{prefix}_all", "report.py", plot, per_config_s=1, merge=[c.name for c in cmds]))
        return cmds

    plan = {p.key: p for p in problems(h)}
    plan["benchmarking_script_a"].commands = [Command("e2e_" + sizes[0], "bench_e2e.py",
                                                      ["--size", sizes[0], *ctx, *steps, *lm], 1,
                                                      cost(sizes[0], 0))]
    b = plan["benchmarking_script_b"]
    b.commands = per_size("e2e", [*ctx, *steps], 0)[1:] if len(sizes) > 1 else []
    b.show = ["e2e_all"] if len(sizes) > 1 else ["e2e_" + sizes[0]]
    warmups = ["0", "1"] if quick else ["0", "1", "2", "5"]
    c = plan["benchmarking_script_c"]
    c.commands = per_size("warmup", [*ctx, "--warmup", *warmups, *(["--steps", "2"] if quick else []), *plot],
                          0, len(warmups))
    for cmd in c.commands[1:]:
        cmd.drop = cmd.drop and 20 + cmd.drop % 100

    # nsys_profile: the longest context first (2026), then nsys_run.sh, or torch.profiler where nsys cannot help
    n = plan["nsys_profile"]
    two = [s for s in ("small", "medium") if s in sizes] or sizes[:1]
    if not cpu and h == "2026" and not quick:
        n.commands.append(Command("context_max", "bench_e2e.py", ["--size", *two, "--context-length", "max", *lm],
                                  10 * len(two), 30.0))
    if not cpu and machine["nsys"]:
        contexts = ["256"] if quick else (["128", "256", "512", "1024"] if h == "2025" else ["CONTEXTS"])
        nsys_sizes = sizes[:1] if quick else (sizes if h == "2025" else two)
        n.commands.append(Command("nsys", "nsys_run.sh", ["--handout", h, "--size", *nsys_sizes, "--context-length",
                                                          *contexts, *(["--", *yours] if yours else [])],
                                  2 * len(nsys_sizes) * len(contexts), 60.0))
    else:
        n.note = ("nsys was not found on PATH: the torch.profiler path (bench_e2e.py --profile) answers (a)-(e) "
                  "instead." if machine["nsys"] is None else "on a CPU nsys has no GPU kernels to trace: the "
                  "torch.profiler path (bench_e2e.py --profile) answers (a)-(e) instead.")
        prof_ctx = ctx or ["--context-length", "256"]
        for mode in ("forward", "train"):
            n.commands.append(Command(f"profile_{mode}", "bench_e2e.py", ["--size", two[0], *prof_ctx, "--mode", mode,
                                                                          "--profile", *steps, *lm], 1, e2e_s))

    plan["mixed_precision_accumulation"].commands = [Command("precision_demo", "precision_demo.py", plot, 1, 3)]
    plan["benchmarking_mixed_precision_ab"].commands = [Command("toy_autocast", "toy_autocast.py", dev, 1, 3)]
    plan["benchmarking_mixed_precision_c"].commands = per_size("bf16", [*ctx, *steps, "--dtype", "fp32", "bf16",
                                                                                   *plot], 0, 2)

    # memory: the handout's size and contexts are mem_profile.py's defaults (one command per context on a GPU)
    mem_steps = ["--warmup", "1", "--steps", "2"] if quick else []
    if cpu or quick:
        mem_size, mem_ctxs = ["--size", "tiny"], [ctx[1] if ctx else "128"]
    else:
        big = "xl" if h == "2026" else "2.7B"
        mem_size = [] if big in sizes else ["--size", sizes[-1]]
        mem_ctxs = ["128", "2048"] if h == "2026" else ["128", "256", "512"]
    ae, bcd = plan["memory_profiling_ae"], plan["memory_profiling_bcd"]
    if cpu:
        ae.note = "--snapshot needs CUDA: on a CPU the accounting and saved-for-backward tables of (b)-(d) stand in."
        ae.show = ["memory_" + mem_ctxs[0]]
    else:
        ae.commands = [Command(f"snapshot_{c}", "mem_profile.py", [*mem_size, "--context-length", c, "--mode",
                                                                   "forward", "train", "--snapshot", *mem_steps, *lm],
                               2, 60.0) for c in mem_ctxs]
    bcd.commands = [Command(f"memory_{c}", "mem_profile.py", [*mem_size, "--context-length", c, "--mode", "forward",
                                                              "train", "--dtype", "fp32", "bf16", *mem_steps, *lm],
                            4, 15.0 if cpu else 40.0, drop=40 if i else 0) for i, c in enumerate(mem_ctxs)]
    if len(mem_ctxs) > 1:
        bcd.commands.append(Command("memory_all", "report.py", plot, per_config_s=1,
                                    merge=[c.name for c in bcd.commands]))
    if "memory_profiling_f" in plan:
        f = plan["memory_profiling_f"]
        if not cpu and machine["nsys"]:
            f.commands = [Command("nsys_memory", "nsys_run.sh", ["--handout", h, "--pytorch=autograd-nvtx",
                                      "--cuda-memory-usage=true", "--size", mem_size[1] if mem_size else "xl",
                                      "--context-length", mem_ctxs[0], "--mode", "train"], 1, 120.0)]
        else:
            f.note = "the Nsight memory view needs nsys and a GPU: the saved-for-backward table is the check."
        f.show = [bcd.commands[0].name, *(c.name for c in f.commands)]
    if "gradient_checkpointing" in plan:
        g = plan["gradient_checkpointing"]
        ks = ["0", "1", "2"] if quick or cpu else ["0", "1", "2", "4", "8"]
        if cpu or quick:
            g.commands = [Command("checkpoint", "mem_profile.py", [*mem_size, "--mode", "train", "--context-length",
                                                                  mem_ctxs[0], "--checkpoint", *ks, *mem_steps, *lm, *plot],
                                  len(ks), 15.0)]
        else:
            ckpt = mem_size or ["--size", "xl"]  # the gradient_checkpointing setup, also for K = 0
            g.commands = [Command(f"checkpoint_k{k}", "mem_profile.py", [*ckpt, "--context-length", "2048",
                                  "--batch-size", "4", "--mode", "train", "--checkpoint", k, *lm], 1, 60.0)
                          for k in ks]
            g.commands.append(Command("checkpoint_all", "report.py", plot, per_config_s=1,
                                      merge=[c.name for c in g.commands]))

    # attention: the grids are bench_attention.py's defaults; on a CPU or --quick, d 16 at short sequences
    small_grid = ["--seq-len", "64", "128", "--batch-size", "1"] if cpu else ["--seq-len", "256", "1024"]
    ds = [16] if cpu or quick else [16, 32, 64, 128]
    grid = small_grid if cpu or quick else []
    seqs = 2 if cpu or quick else 5
    plan["pytorch_attention"].commands = per_d("attention", ["--impl", "naive", *grid], ds, 5.0, seqs)
    plan["torch_compile_a"].commands = per_d("compiled", ["--impl", "naive", "compiled", *grid], ds, 20.0, 2 * seqs)
    plan["torch_compile_b"].commands = per_size("compile", [*ctx, *steps, "--compile", "off", "on", *plot],
                                                  40.0, 2)
    impl = ["--impl", args.impl] if args.impl else []
    flash_grid = (["--seq-len", "128", "256"] if quick else []) if not cpu else ["--seq-len", "64", "128"]
    fb = plan["flash_benchmarking"]
    fb.commands = per_d("flash", ["--grid", "flash", *impl, *flash_grid], ds, 5.0, 4 * (2 if grid else 10))
    if not args.impl:
        fb.note = "no --impl given: PyTorch's fused SDPA stands in for your kernel."
    if h == "2025":  # the flash problems are the student's kernel: its check against the float64 reference
        plan["flash_forward"].commands = [Command("flash_check", "bench_attention.py", [
            "--impl", args.impl or "MODULE:CALLABLE", "--d", "16", "--seq-len", "128", "--batch-size", "1",
            "--dtype", "fp32", *dev], 1, 10.0, skipped=None if args.impl else
            "skipped: needs your kernel: pass --impl MODULE:CALLABLE")]
        plan["flash_backward"].show = ["flash_check"]
        plan["flash_backward"].note = "the check column of flash_forward's command covers the gradients of Q, K, V."
    for p in plan.values():
        p.show = p.show or [c.name for c in p.commands]
    return list(plan.values())


def selected(problem, only) -> bool:
    return not only or any(problem.key == o or problem.key.startswith(o + "_") for o in only)


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

class Stop(Exception):
    def __init__(self, signum):
        self.signum = signum


def on_signal(signum, frame):
    raise Stop(signum)


class Study:
    def __init__(self, root: Path, args, machine):
        self.root, self.args, self.machine = root, args, machine
        self.ledger_path = root / "study.jsonl"
        self.ledger = {}
        for line in self.ledger_path.read_text().splitlines() if self.ledger_path.is_file() else []:
            try:  # a line cut short by a kill while it was written is not a finished command
                entry = json.loads(line)
                self.ledger[entry["name"]] = entry
            except ValueError:
                continue

    def scale(self) -> tuple:
        """How much longer than estimated the commands measured so far took (1 before any)."""
        measured = [e for e in self.ledger.values() if e.get("estimate_s") and e["status"] == "ok"]
        estimated = sum(e["estimate_s"] for e in measured)
        return measured, (sum(e["seconds"] for e in measured) / estimated) if estimated else 1.0

    def rel(self, path) -> str:
        path = Path(path).resolve()
        return str(path.relative_to(TOOLKIT)) if path.is_relative_to(TOOLKIT) else str(path)

    def free_stem(self, cmd) -> str:
        """The first of name, name-2, ... that no file of the script's folder uses (the scripts' own rule)."""
        folder = self.root / SUBDIR[cmd.script]
        names = [p.name for p in folder.iterdir()] if folder.is_dir() else []
        for n in range(1, 1000):
            stem = cmd.name if n == 1 else f"{cmd.name}-{n}"
            if not any(x.startswith((stem + ".", stem + "_")) for x in names):
                return stem
        raise RuntimeError("no free stem")

    def argv(self, cmd, stem) -> list:
        if cmd.script == "nsys_run.sh":
            args = [self.contexts() if a == "CONTEXTS" else [a] for a in cmd.args]
            return ["bash", "nsys_run.sh", "--results-dir", self.rel(self.root), *sum(args, [])]  # before its --
        args = list(cmd.args)
        if cmd.merge:
            args = [self.rel(self.files(m)["jsonl"]) for m in cmd.merge if self.done(m)] + args
        return [sys.executable, cmd.script, *args, "--results-dir", self.rel(self.root), "--out", stem]

    def contexts(self) -> list:
        """nsys_profile (2026): three powers of two > 128, the largest the longest context that trained."""
        longest = [json.loads(line)["config"]["model"]["context_length"] for line in
                   self.files("context_max").get("jsonl", Path(os.devnull)).read_text().splitlines()
                   if line.strip() and json.loads(line).get("status") in ("ok", "noisy")] if self.done(
                   "context_max") else []
        top = max(1 << (max(longest).bit_length() - 1) if longest else 1024, 512)
        return [str(top // 4), str(top // 2), str(top)]

    def done(self, name) -> bool:
        return self.ledger.get(name, {}).get("status") == "ok"

    def files(self, name) -> dict:
        entry = self.ledger.get(name)
        if not entry:
            return {}
        return {k: TOOLKIT / v for k, v in entry.get("files", {}).items()}

    def record(self, entry):
        self.ledger[entry["name"]] = entry
        with open(self.ledger_path, "a") as f:
            f.write(json.dumps(entry) + "\n")

    def run(self, cmd) -> dict:
        """Run one command (again once if it fails), its output to logs/<stem>.log; the ledger line when done."""
        if cmd.merge:  # a merge is redone when the commands it merges changed
            inputs = [self.ledger[m]["stem"] for m in cmd.merge if self.done(m)]
            if self.done(cmd.name) and self.ledger[cmd.name].get("inputs") == inputs:
                return self.ledger[cmd.name]
            if len(inputs) < 2:
                return {"status": "skipped", "cause": "fewer than two runs to merge"}
        elif cmd.name in self.ledger:
            return self.ledger[cmd.name]
        for attempt in (1, 2):
            stem = self.free_stem(cmd)
            argv = self.argv(cmd, stem)
            (self.root / "logs").mkdir(parents=True, exist_ok=True)
            log = self.root / "logs" / f"{stem}.log"
            started = time.time()
            with open(log, "w") as out:
                child = subprocess.Popen(argv, cwd=TOOLKIT, stdout=out, stderr=subprocess.STDOUT,
                                         start_new_session=True, env={**os.environ, "PYTHON": sys.executable})
                try:
                    rc = child.wait()
                except Stop as stop:
                    stop_child(child, stop.signum)
                    raise
            entry = {"name": cmd.name, "stem": stem, "command": display(argv), "rc": rc,
                     "seconds": round(time.time() - started, 1), "estimate_s": cmd.estimate(),
                     "finished_utc": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                     "files": self.outputs(cmd, stem, started), "log": self.rel(log), "attempt": attempt,
                     "inputs": [self.ledger[m]["stem"] for m in cmd.merge if self.done(m)] if cmd.merge else None}
            if rc == 0:
                entry["status"] = "ok"
                break
            entry.update(status="failed", cause=cause(log, rc))
        self.record(entry)
        return entry

    def checks(self, plan) -> list:
        """(problem, 'passed' | 'failed') for each problem that ran a command: passed when every command
        finished and no row of its records is an error or a timeout."""
        verdicts = []
        for p in plan:
            names = [c.name for c in p.commands if not c.skipped and not c.merge]
            if not names or not all(n in self.ledger for n in names):
                continue
            rows = [json.loads(line) for n in names if "jsonl" in self.files(n) and self.files(n)["jsonl"].is_file()
                    for line in self.files(n)["jsonl"].read_text().splitlines() if line.strip()]
            bad = any(str(r.get("status", "")).startswith(("error", "timeout")) for r in rows)
            verdicts.append((p, "passed" if all(self.done(n) for n in names) and not bad else "failed"))
        return verdicts

    def outputs(self, cmd, stem, started) -> dict:
        folder = self.root / SUBDIR[cmd.script]
        if cmd.script != "nsys_run.sh":
            found = {"md": folder / f"{stem}.md", "jsonl": folder / f"{stem}.jsonl"}
            found.update({p.stem[len(stem) + 1:] + ".png": p for p in sorted(folder.glob(f"{stem}_*.png"))})
        else:
            new = sorted(p for p in folder.glob("*.md") if p.stat().st_mtime >= started - 1) if folder.is_dir() else []
            summary = [p for p in new if p.name.startswith("summary-")]
            found = {"md": summary[-1]} if summary else {f"md{i}": p for i, p in enumerate(new)}
        return {k: self.rel(v) for k, v in found.items() if v.is_file()}


# what each problem exercises, for --quick's verdict (on a GPU: every GPU path)
PATHS = {"benchmarking_script_a": "timing", "benchmarking_script_c": "warm-up sweep", "nsys_profile": "profiler",
         "mixed_precision_accumulation": "precision", "benchmarking_mixed_precision_ab": "autocast",
         "benchmarking_mixed_precision_c": "bf16 autocast", "memory_profiling_ae": "memory snapshot",
         "memory_profiling_bcd": "peak memory", "memory_profiling_f": "nsys memory", "gradient_checkpointing":
         "checkpointing", "pytorch_attention": "attention timing", "torch_compile_a": "compiled attention",
         "torch_compile_b": "compiled model", "flash_benchmarking": "flash grid", "flash_forward": "kernel check"}


def stop_child(child, signum):
    """Stop the running script and everything it started (its own process group): the same signal, then SIGKILL."""
    for sig, wait in ((signum, 30), (signal.SIGKILL, 5)):
        try:
            os.killpg(child.pid, sig)
            child.wait(wait)
            return
        except ProcessLookupError:
            return
        except subprocess.TimeoutExpired:
            continue


def display(argv) -> str:
    return shlex.join(["python3" if a == sys.executable else a for a in argv])


def cause(log: Path, rc: int) -> str:
    lines = [l.strip() for l in log.read_text(errors="replace").splitlines() if l.strip()]
    errors = [l for l in lines if "error" in l.lower()]
    return f"exit {rc}: {(errors or lines or ['no output'])[-1][:300]}"


# ---- measured facts: numbers only, read from the records ----

def finished(r) -> bool:
    return r.get("status") in ("ok", "noisy")


def ms(r, phase) -> str:
    return f"{r[phase + '_ms_mean']:.2f} ms (std {r[phase + '_ms_std']:.2f})"


def size_of(r) -> str:
    return str(r.get("config", {}).get("size") or r.get("label", "?").split()[0])


def compare(records, variant, names, labels) -> list:
    """fp32 vs bf16, eager vs compiled: per size, each phase's two means and their ratio (first / second)."""
    facts, by_size = [], {}
    for r in records:
        by_size.setdefault(size_of(r), {})[r.get("config", {}).get(variant)] = r
    for size, rows in by_size.items():
        a, b = (rows.get(k) for k in names)
        if a and b:
            facts.append(f"{size}: " + "; ".join(
                f"{phase} {labels[0]} {a[phase + '_ms_mean']:.2f} ms, {labels[1]} {b[phase + '_ms_mean']:.2f} ms, "
                f"{labels[0]}/{labels[1]} {a[phase + '_ms_mean'] / b[phase + '_ms_mean']:.2f}x"
                for phase in ("forward", "backward", "step") if phase + "_ms_mean" in a))
    return facts


def facts_for(key, records) -> list:
    facts = [f"{r.get('label', '?')}: {r.get('status')}" for r in records
             if not finished(r) and not str(r.get("status", "")).startswith("skipped: measured peaks need")]
    done = [r for r in records if finished(r)]
    if key.startswith("benchmarking_script") and key != "benchmarking_script_c":
        facts += [f"{size_of(r)}: forward {ms(r, 'forward')}, backward {ms(r, 'backward')}, backward/forward "
                  f"{r['backward_ms_mean'] / r['forward_ms_mean']:.2f}x" for r in done if "backward_ms_mean" in r]
    elif key == "benchmarking_script_c":
        facts += [f"{size_of(r)}, warm-up {r['config']['warmup']}: forward {ms(r, 'forward')}, backward "
                  f"{ms(r, 'backward')}" for r in done if "backward_ms_mean" in r]
    elif key == "nsys_profile":
        longest = {}
        for r in done:
            if r.get("context_search"):
                size = size_of(r)
                longest[size] = max(longest.get(size, 0), r["config"]["model"]["context_length"])
        facts += [f"longest context that trained: {s} {c}" for s, c in longest.items()]
        facts += [f"{r.get('label')}: forward {ms(r, 'forward')}" for r in done
                  if "forward_ms_mean" in r and not r.get("context_search")]
    elif key == "mixed_precision_accumulation":
        facts += [f"case {r['case']} ({r['accumulator_dtype']} += {r['addend_dtype']}"
                  f"{' converted to float32' if r.get('addend_converted_to_float32') else ''}): {r['result']!r}, "
                  f"error {r['abs_error']!r}" for r in done if "case" in r]
    elif key == "benchmarking_mixed_precision_c":
        facts += compare(done, "dtype", ("fp32", "bf16"), ("fp32", "bf16"))
    elif key == "torch_compile_b":
        facts += compare(done, "compile", (False, True), ("eager", "compiled"))
    elif key.startswith(("memory_profiling", "gradient_checkpointing")):
        for r in records:
            peaks = [f"{k} {v / GIB:.3f} GiB" for k, v in r.items()
                     if "peak" in k and k.endswith("_bytes") and isinstance(v, (int, float))]
            pred = r.get("checkpoint_prediction") or {}
            if key == "gradient_checkpointing" and pred and r is records[0]:
                peaks.append(f"predicted best K {pred.get('best_k')} at "
                             f"{pred.get('best_predicted_peak_bytes', 0) / GIB:.3f} GiB")
            if key == "memory_profiling_bcd" and "residual_stream_bytes" in r:
                peaks.append(f"one residual-stream activation {r['residual_stream_bytes']} B "
                             f"({r.get('residual_stream_formula')})")
            if key == "memory_profiling_f" and "saved_block_bytes_mean" in r:
                peaks.append(f"saved for backward per block {r['saved_block_bytes_mean'] / 2**20:.2f} MiB")
            if peaks:
                facts.append(f"{r.get('label')}: " + ", ".join(peaks))
    elif key in ("pytorch_attention", "torch_compile_a", "flash_benchmarking", "flash_forward", "flash_backward"):
        for r in done:
            check = r.get("check") or {}
            facts.append(f"{r.get('label')}: forward {ms(r, 'forward')}, backward {ms(r, 'backward')}"
                         + (f", saved {r['saved_tensor_bytes'] / 2**20:.2f} MiB" if r.get("saved_tensor_bytes")
                            else "") + (f", max error {check['max_error']:.2e}" if "max_error" in check else ""))
    return facts


# ---- the writeup: blocks rendered as markdown and as LaTeX ----

ASCII = {"×": "x", "±": "+/-", "≈": "~", "—": "--", "–": "-", "µ": "u", "μ": "u", "≤": "<=", "≥": ">=",
         "→": "->", "…": "...", "’": "'", "‘": "'", "“": '"', "”": '"', "√": "sqrt", "·": "*", "²": "^2"}
TEX_ESCAPE = {"\\": r"\textbackslash{}", "&": r"\&", "%": r"\%", "$": r"\$", "#": r"\#", "_": r"\_",
              "{": r"\{", "}": r"\}", "~": r"\textasciitilde{}", "^": r"\^{}", "<": r"\textless{}",
              ">": r"\textgreater{}"}


def ascii_fold(text: str) -> str:
    return "".join(ASCII.get(ch, ch if ord(ch) < 128 else "?") for ch in text)


def tex(text: str) -> str:
    return "".join(TEX_ESCAPE.get(ch, ch) for ch in ascii_fold(text))


def md_to_tex(markdown: str) -> str:
    """A script's .md in LaTeX: its pipe tables through tabulate's latex_booktabs, the rest as text."""
    out, lines = [], markdown.splitlines()
    i = 0
    while i < len(lines):
        if lines[i].lstrip().startswith("|"):
            rows = []
            while i < len(lines) and lines[i].lstrip().startswith("|"):
                cells = [ascii_fold(c.strip()) for c in lines[i].strip().strip("|").split("|")]
                if not all(re.fullmatch(r":?-+:?", c) for c in cells):
                    rows.append(cells)
                i += 1
            table = tabulate(rows[1:], rows[0], tablefmt="latex_booktabs", disable_numparse=True)
            out.append(f"\\begin{{center}}\\resizebox{{\\linewidth}}{{!}}{{%\n{table}}}\\end{{center}}"
                       if len(rows[0]) > 6 else f"\\begin{{center}}\n{table}\n\\end{{center}}")
            continue
        line = lines[i].strip()
        if line.startswith("#"):
            out.append(f"\\paragraph{{{tex(line.lstrip('#').strip())}}}")
        elif line:
            out.append(tex(line) + "\n")
        i += 1
    return "\n".join(out)


def render(blocks, fmt: str) -> str:
    out = []
    for kind, value in blocks:
        if fmt == "md":
            out.append({"h1": lambda v: f"# {v}\n", "h2": lambda v: f"## {v}\n", "p": lambda v: f"{v}\n",
                        "code": lambda v: f"```\n{v}\n```\n", "table": lambda v: v.rstrip("\n") + "\n",
                        "img": lambda v: f"![{Path(v).name}]({v})\n",
                        "items": lambda v: "".join(f"- {x}\n" for x in v)}[kind](value))
        else:
            wrap = lambda v: "\n".join(re.sub(r"(.{90}\S*) ", "\\1 \\\\\n      ", ascii_fold(l)) for l in v.split("\n"))
            out.append({"h1": lambda v: f"\\section*{{{tex(v)}}}\n", "h2": lambda v: f"\\subsection*{{{tex(v)}}}\n",
                        "p": lambda v: tex(v) + "\n",
                        "code": lambda v: f"\\begin{{verbatim}}\n{wrap(v)}\n\\end{{verbatim}}\n",
                        "table": md_to_tex, "img": lambda v: f"\\includegraphics[width=\\linewidth]{{{v}}}\n",
                        "items": lambda v: "\\begin{itemize}\n" + "".join(f"\\item {tex(x)}\n" for x in v)
                        + "\\end{itemize}\n" if v else ""}[kind](value))
    if fmt == "md":
        return "\n".join(out)
    return ("\\documentclass[10pt]{article}\n\\usepackage[margin=2cm]{geometry}\n\\usepackage{booktabs}\n"
            "\\usepackage{graphicx}\n\\usepackage[T1]{fontenc}\n\\begin{document}\n" + "\n".join(out)
            + "\\end{document}\n")


def writeup(study, plan, machine, args) -> list:
    cpu = machine["device"] == "cpu"
    where = ("on a CPU: every problem at the tiny size, with the study's shapes scaled down (context "
             f"{'64' if args.quick else '128'}, attention d 16 at sequences 64-128, batch 1)" if cpu else
             f"on {machine['name']} ({machine['free_bytes'] / GIB:.1f} GiB free), sized to its memory")
    blocks = [("h1", f"CS336 assignment 2, part 1 (handout {args.handout}): the study {where}"
               + (", --quick: every problem at its smallest shape" if args.quick else "")),
              ("items", [f"model: {args.model or 'ours (model.TransformerLM)'}; optimizer: "
                         f"{args.optimizer or 'ours (optim.AdamW)'}; attention kernel (--impl): "
                         f"{args.impl or 'none (PyTorch SDPA stands in)'}",
                         f"study folder: {study.rel(study.root)}; interpreter: {sys.executable} (shown as python3)",
                         f"every command below ran from {TOOLKIT}; its log is in the study folder's logs/"])]
    verdicts = study.checks(plan)
    if verdicts:
        blocks.append(("p", "Checks: " + "; ".join(f"{p.title} ({PATHS.get(p.key, p.key)}) {v}"
                                                   for p, v in verdicts)))
    for n, p in enumerate(plan, 1):
        blocks += [("h2", f"{n}. {p.title}"), ("p", f"Deliverable: {p.deliverable}")]
        if p.note:
            blocks.append(("p", f"Note: {p.note}"))
        lines = []
        for c in p.commands:
            entry = study.ledger.get(c.name, {})
            if c.skipped:
                lines.append(f"# {c.name}: {c.skipped}")
            elif entry:
                lines.append(entry["command"] + f"   # {entry['status']}, {entry['seconds']:.0f} s"
                             + (f": {entry['cause']}" if entry.get("cause") else ""))
            elif not selected(p, args.only):
                lines.append(f"# {c.name}: not run (--only)")
            else:
                lines.append(f"# {c.name}: not run yet")
        blocks.append(("code", "\n".join(lines) if lines else
                       f"# no command of its own: it reads the tables of {', '.join(p.show)}"))
        records, tables = [], 0
        for name in shown(study, p):
            files = study.files(name)
            if "md" in files or "md0" in files:
                for k in sorted(k for k in files if k.startswith("md")):
                    blocks.append(("table", files[k].read_text()))
                    tables += 1
            for k in sorted(k for k in files if k.endswith(".png")):
                blocks.append(("img", os.path.relpath(files[k], study.root)))
            if "jsonl" in files and files["jsonl"].is_file() and not study.ledger[name].get("inputs"):
                records += [json.loads(line) for line in files["jsonl"].read_text().splitlines() if line.strip()]
        for name in (m for c in p.commands for m in c.merge):  # the facts come from the merged runs' own records
            if "jsonl" in study.files(name) and name not in shown(study, p):
                records += [json.loads(l) for l in study.files(name)["jsonl"].read_text().splitlines() if l.strip()]
        try:
            facts = facts_for(p.key, records)
        except (KeyError, TypeError, ZeroDivisionError):  # a record without a field: its table stands alone
            facts = []
        blocks += [("p", "Measured:"), ("items", facts or ["(the tables above)" if tables else "(not run)"]),
                   ("p", "Answer:")]
    return blocks


def shown(study, p) -> list:
    """The merged table where the merge ran, else the tables of the runs it would merge."""
    names = []
    for name in p.show:
        cmd = next((c for c in p.commands if c.name == name and c.merge), None)
        if cmd and not study.done(name):
            names += [m for m in cmd.merge if study.done(m)]
        elif cmd:
            names.append(name)
        elif not any(name in c.merge and study.done(c.name) for c in p.commands):
            names.append(name)
    return [n for n in dict.fromkeys(names) if study.done(n)]


def write_writeup(study, plan, machine, args):
    blocks = writeup(study, plan, machine, args)
    for suffix, fmt in ((".md", "md"), (".tex", "tex")):
        path = study.root / f"writeup{suffix}"
        path.with_name(path.name + ".partial").write_text(render(blocks, fmt))
        os.replace(path.with_name(path.name + ".partial"), path)
    return study.root / "writeup.md"


# ---- main ----

def study_root(args, settings) -> Path:
    base = Path(args.results_dir) / "study"
    if args.out and not (args.fresh and (base / args.out).exists()):
        return base / args.out
    if not args.fresh and base.is_dir():
        for folder in sorted(base.iterdir(), reverse=True):
            try:
                if json.loads((folder / "settings.json").read_text()) == settings:
                    return folder
            except (OSError, ValueError):
                continue
    stem = args.out or f"study-{datetime.datetime.now(datetime.timezone.utc):%Y%m%d-%H%M%S}"
    return next(base / f"{stem}{f'-{n}' if n > 1 else ''}" for n in range(1, 10**6)
                if not (base / f"{stem}{f'-{n}' if n > 1 else ''}").exists())


def main(argv=None) -> int:
    args = parse_args(argv)
    machine = probe_machine(args.device, args.handout)
    settings = {"handout": args.handout, "quick": args.quick, "device": machine["device"], "model": args.model,
                "optimizer": args.optimizer, "impl": args.impl}
    root = study_root(args, settings).resolve()
    study = Study(root, args, machine)
    plan = build_plan(args, machine)
    for p in plan:
        for c in p.commands:
            if not selected(p, args.only) and not c.skipped:
                c.skipped = "skipped: not in --only"
    measured, scale = study.scale()
    for p in plan:  # what is already done costs nothing
        for c in p.commands:
            if study.done(c.name) and not c.merge:
                c.per_config_s, c.configs = 0.0, 0
    dropped = apply_budget(plan, args.budget, scale)
    total = sum(c.estimate() for p in plan for c in p.commands) * scale
    print(f"study: handout {args.handout} on {machine['name']} ({machine['device']}) -> {study.rel(root)}"
          f"{'' if not study.ledger else f' (resuming: {len(study.ledger)} commands recorded)'}")
    print(f"estimate {hms(total)} (h:mm{', scaled by the measured times x%.2f' % scale if measured else ''})"
          + (f" within --budget {hms(args.budget)}" if args.budget else ""))
    if args.budget:
        print(DROP_ORDER + (": dropped " + ", ".join(dropped) if dropped else ": nothing dropped"))
        if total > args.budget:
            print(f"note: even after dropping, the estimate exceeds the budget by {hms(total - args.budget)}")
    if args.dry_run:
        for n, p in enumerate(plan, 1):
            print(f"[{n}/{len(plan)}] {p.title}")
            if p.note:
                print(f"    note: {p.note}")
            if not p.commands:
                print(f"    the tables of: {', '.join(p.show)}")
            for c in p.commands:
                what = ("merge " + " ".join(c.merge)) if c.merge else display([sys.executable, c.script, *c.args])
                print(f"    {c.name}: {c.skipped or ('done' if study.done(c.name) and not c.merge else what)}"
                      + ("" if c.skipped or study.done(c.name) else f"   ~{c.estimate() * scale:.0f} s"))
        print("nothing was run (drop --dry-run to run it)")
        return 0
    root.mkdir(parents=True, exist_ok=True)
    if not (root / "settings.json").exists():
        (root / "settings.json").write_text(json.dumps(settings) + "\n")
    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
    failed = []
    try:
        for n, p in enumerate(plan, 1):
            left = sum(c.estimate() for q in plan[n - 1:] for c in q.commands) * study.scale()[1]
            todo = [c for c in p.commands if not c.skipped]
            print(f"[{n}/{len(plan)}] {p.title} ... ETA {hms(left)}", flush=True)
            for c in todo:
                was_done = c.name in study.ledger
                entry = study.run(c)
                c.per_config_s, c.configs = 0.0, 0
                state = "recorded earlier" if was_done and entry.get("name") == c.name else entry["status"]
                print(f"    {c.name}: {state}" + (f" ({entry['seconds']:.0f} s)" if "seconds" in entry else "")
                      + (f": {entry['cause']}" if entry.get("cause") else ""), flush=True)
                if entry["status"] == "failed":
                    failed.append(c.name)
    except Stop as stop:
        for sig in previous:  # a second Ctrl-C does not cut the writeup short
            signal.signal(sig, signal.SIG_IGN)
        path = write_writeup(study, plan, machine, args)
        print(f"stopped by signal {stop.signum}: finished commands kept; run the same command to continue "
              f"({study.rel(path)} has what is done)", file=sys.stderr)
        return 128 + stop.signum
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    path = write_writeup(study, plan, machine, args)
    checks = study.checks(plan)
    for verdict in ("passed", "failed"):
        names = [f"{p.title} ({PATHS.get(p.key, p.key)})" for p, v in checks if v == verdict]
        print(f"{verdict}: {', '.join(names) or 'none'}")
    if failed:
        print("failed commands: " + ", ".join(failed) + " (causes in the writeup and logs/)")
    print(f"wrote {study.rel(path)} and {study.rel(path.with_suffix('.tex'))}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
