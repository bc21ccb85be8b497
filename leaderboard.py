"""How fast is your training step at the 2026 leaderboard's shape, once it behaves like the reference? The study's
leaderboard (2026): your model and optimizer checked against the staff model and AdamW, then the step timed as the
leaderboard times it (triton.testing.do_bench), then split into its phases.

    python3 leaderboard.py --model mine=my_lm:make_model          # full shape on CUDA, scaled down elsewhere
    python3 leaderboard.py --model mine=my_lm:make_model --optimizer my_optim:AdamW   # yours, both checked
    torchrun --nproc-per-node 2 leaderboard.py --parallel fsdp    # ... spread over 2 GPUs
    python3 leaderboard.py full --dry-run --parallel fsdp --world-size 2   # the state per device, nothing run

Method (the `measure` section): the behaviour check first (a WRONG model is never timed); the inductor and triton
caches empty, as in the leaderboard's run; do_bench(step, warmup, rep) of the whole step, phases unsynchronised
(the headline, with the wall time so far); then --steps steps each phase between two synchronisations
(runner.measure_steps: the split, peak memory, MFU). The 2025 leaderboard is a grid of bench_attention.py.
Manual: docs/leaderboard.md.
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import importlib.util
import math
import os
import sys
import tempfile
import time
from typing import Any, Callable
from unittest import mock

import torch

import common
import parallel
import report
import results
from common import environment, precision_context, resolve_device
from model import ADAMW_SETTINGS, ATTENTION, build_model, build_optimizer, cross_entropy
from results import (GIB, LEADERBOARD, LEADERBOARD_BATCH, ModelConfig, ResultFiles, finished, positive_float,
                     positive_int)
from runner import RunConfig, Workload, derive_figures, measure_steps, phase


# ---------------------------------------------------------------- arguments


def parse_args(argv: list[str] | None = None) -> tuple[argparse.Namespace, RunConfig]:
    p = results.ArgParser(description=__doc__.split("\n\n")[0])
    p.add_argument("shape", nargs="?", choices=["auto", "full", "scaled"], default="auto",
                   help="full = the leaderboard's (d_model 4096, 34 layers, vocab 151936, context 32768, batch 2, "
                        "bf16); scaled = a shape a CPU runs in seconds; auto (default): full on CUDA, else scaled")
    for flag, what in (("--d-model", "d_model"), ("--d-ff", "d_ff"), ("--num-layers", "the number of layers"),
                       ("--num-heads", "the number of heads"), ("--vocab-size", "the vocabulary size"),
                       ("--context-length", "the sequence length"), ("--batch-size", "the batch, over all ranks")):
        p.add_argument(flag, type=positive_int, help=f"change {what} (the header then says the shape is changed)")
    common.add_model_args(p, "ours = optim.AdamW; torch = torch.optim.AdamW (fused on CUDA, foreach on CPU)",
                          flops=False)
    model_flag = next(a for a in p._actions if a.dest == "model")
    model_flag.type = common.named_model
    model_flag.help += "; NAME=MODEL names it in tables and records (default: ours)"
    model_flag.default = [(None, common.OURS)]
    p.add_argument("--param-map", type=common.named_or_spec([]), default=None, metavar="MODULE:CALLABLE",
                   help="CALLABLE(your_model) returns {your parameter name: ours} for the behaviour check, where your "
                        "names differ from the reference's")
    p.add_argument("--attn", choices=list(ATTENTION), default="naive", help="our model's attention (default: naive)")
    p.add_argument("--compile", action="store_true", help="torch.compile the model (from empty caches)")
    p.add_argument("--rep-ms", type=positive_float, default=None,
                   help="do_bench's rep, ms of timed steps (default: 30000 on CUDA, 500 elsewhere)")
    p.add_argument("--warmup-ms", type=positive_float, default=None,
                   help="do_bench's warmup, ms of untimed steps (default: 10000 on CUDA, 100 elsewhere)")
    p.add_argument("--warmup", type=results.warmup_count, default=5, help="untimed steps before the split's")
    p.add_argument("--steps", type=results.step_count, default=10, help="the split's timed steps")
    p.add_argument("--seed", type=results.seed_int, default=0, help="random seed for weights and data")
    p.add_argument("--peak-tflops", type=positive_float, default=None,
                   help="peak TFLOP/s of one GPU for MFU, overriding the built-in table (e.g. for an unlisted GPU)")
    results.add_device_args(p)
    parallel.add_parallel_args(p)
    p.set_defaults(in_process=False)  # parallel.check_parallel_args asks: every rank runs in its own process
    results.add_output_args(p, default_stem="leaderboard-<UTC time>")
    results.add_dry_run_arg(p)
    args = p.parse_args(argv)
    return args, leaderboard_run(p, args)


# ---------------------------------------------------------------- build

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
    """The one configuration (full on CUDA or when asked, else scaled), batch 2 over all ranks,
    bf16 autocast, train; a full shape whose training state cannot fit in the free memory is refused."""
    device = common.device_or_exit(parser, args.device)
    results.refuse(parser, [
        (len(args.model) > 1 or len(args.optimizer) > 1,
         "the leaderboard times one configuration: give --model and --optimizer one value each")])
    world_size = parallel.check_parallel_args(parser, args, device)
    full = args.shape == "full" or (args.shape == "auto" and device.type == "cuda")
    args.shape = "full" if full else "scaled"
    dims = {k: getattr(args, k) for k in ("d_model", "d_ff", "num_layers", "num_heads", "vocab_size")}
    dims["context_length"] = args.context_length
    try:
        cfg = dataclasses.replace(LEADERBOARD if full else SCALED, **{k: v for k, v in dims.items() if v})
    except results.ConfigError as exc:
        parser.error(str(exc))
    batch = args.batch_size or LEADERBOARD_BATCH
    if batch % world_size:
        parser.error(f"the batch of {batch} does not split over {world_size} ranks")
    on_cuda = device.type == "cuda"
    args.rep_ms = args.rep_ms or (30_000.0 if on_cuda else 500.0)
    args.warmup_ms = args.warmup_ms or (10_000.0 if on_cuda else 100.0)
    name, spec = args.model[0]
    run = RunConfig(size=f"leaderboard-{args.shape}", model=cfg, batch_size=batch // world_size,
                    warmup=args.warmup, steps=args.steps, dtype="bf16", compile=args.compile, attn=args.attn,
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
        free = sum(common.free_memory_bytes(d) or 0 for d in devices)
        if free and state > free:
            parser.error(f"leaderboard {args.shape}: the training state alone needs {state / GIB:.1f} GiB per "
                         f"device ({state_counted(cfg)}) and {'+'.join(map(str, devices))} has {free / GIB:.1f} "
                         "GiB free: spread it (torchrun ... --parallel fsdp) or cut --num-layers")
    return run


def state_counted(cfg: ModelConfig) -> str:
    return (f"model.TransformerLM's {cfg.num_params:,} parameters x (4 weights + 4 grads + 8 AdamW) bytes, fp32 "
            "master weights; activations not counted")


# ---------------------------------------------------------------- check

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


# ---------------------------------------------------------------- measure


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
    record["leaderboard"] = common.leaderboard_time(work.untimed_step, device, args.warmup_ms, args.rep_ms,
                                                     agree=agree if run.parallel else None)
    record["wall_s"] = time.perf_counter() - started
    record["over_10_min"] = record["wall_s"] > WALL_LIMIT_S
    record["peak_mem_by_device"] = {str(d): torch.cuda.max_memory_allocated(d) for d in cuda
                                    if torch.cuda.max_memory_allocated(d)}
    record.update(measure_steps(work))
    record.update(derive_figures(run, record, args.peak_tflops))
    if record["mfu"]:  # MFU on do_bench's step time rather than the split's
        record["leaderboard"]["mfu"] = record["mfu"] * record["step_ms_mean"] / record["leaderboard"]["ms"]
    return {**record, "status": "noisy" if record["noisy"] else "ok"}


# ---------------------------------------------------------------- report


def leaderboard(args: argparse.Namespace, run: RunConfig, started: float) -> int:
    """The leaderboard in this process (every rank under torchrun, in one process group): 1 when WRONG or failed."""
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
    args, run = parse_args(argv)
    return leaderboard(args, run, started)


if __name__ == "__main__":
    sys.exit(main())
