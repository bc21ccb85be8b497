"""How fast is your training step at the 2026 leaderboard's shape, once it behaves like the reference? The study's
leaderboard (2026): your model and optimizer checked against the staff model and AdamW, then the step timed as the
leaderboard times it (triton.testing.do_bench), then split into its phases.

    python3 leaderboard.py --model mine=my_lm:make_model          # full shape on CUDA, scaled down elsewhere
    python3 leaderboard.py --model mine=my_lm:make_model --optimizer my_optim:AdamW   # yours, both checked
    torchrun --nproc-per-node 2 leaderboard.py --parallel fsdp    # ... spread over 2 GPUs
    python3 leaderboard.py --model fused=my_lm:make_model --step my_lm:train_step   # your whole step
    python3 leaderboard.py full --dry-run --parallel fsdp --world-size 2   # the state per device, nothing run

Method (the `measure` section), in a child process under --timeout: the behaviour check first at the timed head
size over 3 optimizer steps (a WRONG model is never timed); the inductor and triton caches empty, as in the
leaderboard's run; do_bench(step, warmup, rep) of the whole step, phases unsynchronised, or its method with the
sync timer where it cannot run (common.leaderboard_time: the headline, with the wall time so far); then --steps
steps each phase between two synchronisations (runner.measure_steps: the split, peak memory, MFU); then the check
again on the very model and optimizer that were timed. The 2025 leaderboard is a grid of bench_attention.py.
Manual: docs/leaderboard.md.
"""
from __future__ import annotations

import argparse
import contextlib
import copy
import dataclasses
import functools
import importlib.util
import inspect
import math
import os
import signal
import sys
import tempfile
from typing import Any, Callable
from unittest import mock

import torch

import common
import parallel
import report
import results
import runner
from common import dtype_name, environment, precision_context, resolve_device
from model import ADAMW_SETTINGS, ATTENTION, build_model, build_optimizer, check_logits, cross_entropy
from results import GIB, LEADERBOARD, LEADERBOARD_BATCH, ModelConfig, ResultFiles, finished, positive_float
from runner import RunConfig, Workload, derive_figures, measure_steps, phase


# ---------------------------------------------------------------- arguments


def parse_args(argv: list[str] | None = None) -> tuple[argparse.Namespace, RunConfig]:
    p = results.ArgParser(description=__doc__.split("\n\n")[0])
    p.add_argument("shape", nargs="?", choices=["auto", "full", "scaled"], default="auto",
                   help="full = the leaderboard's (d_model 4096, 34 layers, vocab 151936, context 32768, batch 2, "
                        "bf16); scaled = a shape a CPU runs in seconds; auto (default): full on CUDA, else scaled")
    results.add_shape_args(p, "change the {} (the header then says the shape is changed)",
                           context_length="sequence length", batch_size="batch, over all ranks")
    common.add_model_args(p, "ours = optim.AdamW; torch = torch.optim.AdamW (fused on CUDA, foreach on CPU)",
                          flops=False)
    model_flag = next(a for a in p._actions if a.dest == "model")
    model_flag.type = common.named_model
    model_flag.help += "; NAME=MODEL names it in tables and records (default: ours)"
    model_flag.default = [(None, common.OURS)]
    optimizer_flag = next(a for a in p._actions if a.dest == "optimizer")
    optimizer_flag.help = ("ours = optim.AdamW; torch = torch.optim.AdamW (fused on CUDA, foreach on CPU); or yours as "
                           "[NAME=]MODULE:CLASS, built as the course builds it: CLASS(model.parameters()), its own "
                           "defaults, which must be AdamW's (lr 1e-3, betas (0.9, 0.999), eps 1e-8, weight decay 0.01)")
    p.add_argument("--param-map", type=common.named_or_spec([]), default=None, metavar="MODULE:CALLABLE",
                   help="CALLABLE(your_model) returns {your parameter name: ours} for the behaviour check, where your "
                        "names differ from the reference's")
    p.add_argument("--loss", type=common.named_or_spec([]), default=None, metavar="MODULE:CALLABLE",
                   help="your loss in place of cross_entropy: CALLABLE(what your model returns, targets) -> the "
                        "scalar loss (e.g. a model returning its last hidden state, and a loss fusing the LM head "
                        "with cross-entropy); the check compares the loss and every gradient")
    p.add_argument("--step", type=common.named_or_spec([]), default=None, metavar="MODULE:CALLABLE",
                   help="your whole training step in place of ours: CALLABLE(model, optimizer, tokens, targets) -> "
                        "the loss, doing forward, loss, backward, optimizer.step() and zero_grad, called under bf16 "
                        "autocast; the check hands it a probe for an optimizer and compares the loss it returns and "
                        "the gradients at optimizer.step() (your optimizer is checked apart); the split is the whole "
                        "step only")
    p.add_argument("--dtype", choices=list(PRECISIONS), default="bf16-autocast",
                   help="bf16-autocast (default): your model's parameters as built (ours: fp32 master weights) under "
                        "torch.autocast(bfloat16); bf16-weights: your model moved to bfloat16 (model.to), no autocast")
    p.add_argument("--force", action="store_true",
                   help="run the full shape even where its predicted training state does not fit in the free memory")
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
    runner.add_recalibrate_arg(p)
    parallel.add_parallel_args(p)
    runner.add_sweep_args(p)
    results.add_output_args(p, default_stem="leaderboard-<UTC time>")
    results.add_dry_run_arg(p)
    args = p.parse_args(argv)
    return args, leaderboard_run(p, args)


# ---------------------------------------------------------------- build

SCALED = ModelConfig(d_model=128, d_ff=344, num_layers=2, num_heads=2, vocab_size=1024, context_length=128)  # CPU
WALL_LIMIT_S = 600.0  # the leaderboard's run must finish within 10 minutes from empty caches
# The behaviour check: both models at check_shape (the timed head size), the reference in fp32, yours under bf16
# autocast as timed; CHECK_STEPS optimizer steps, so an optimizer that forgets its state between steps fails
CHECK_LAYERS, CHECK_HEADS, CHECK_VOCAB, CHECK_BATCH, CHECK_STEPS = 2, 2, 512, 2, 3
CHECK_CONTEXT = {"cuda": 4096, "cpu": 512}  # long enough for tiled attention; a few seconds on a CPU
# max ||yours - reference|| / ||reference|| per tensor (logits, loss, each gradient) that passes: our own model
# under bf16 autocast reaches 1.3e-2 (the worst gradient) against itself in fp32 at CHECK_MODEL
CHECK_TOLERANCE = 3e-2
# and for the parameters' change after each optimizer step from the same weights and gradients: a missing weight
# decay is 1e-2 off (on the norms' weights), AdamW's moments kept in bf16 about 2e-3
STEP_TOLERANCE = 5e-3
PRECISIONS = {"bf16-autocast": "bf16 autocast", "bf16-weights": "bf16 weights, no autocast"}  # --dtype
STAFF_MODEL = "cs336_basics.model:BasicsTransformerLM"
# AdamW's epsilon placed either way (adamw_changes): torch's adds it to the bias-corrected sqrt(v); assignment 1's
# Algorithm 1 (the staff cs336_basics.optimizer.AdamW) to sqrt(v). Near-zero gradients tell the two apart by ~3%.
STEP_REFERENCES = {"torch.optim.AdamW": False, "Algorithm 1 of assignment 1": True}


def leaderboard_run(parser: argparse.ArgumentParser, args: argparse.Namespace) -> RunConfig:
    """The one configuration (full on CUDA or when asked, else scaled), batch 2 over all ranks,
    bf16 autocast, train; a full shape whose training state cannot fit in the free memory is refused."""
    device = common.device_or_exit(parser, args.device)
    results.refuse(parser, [
        (len(args.model) > 1 or len(args.optimizer) > 1,
         "the leaderboard times one configuration: give --model and --optimizer one value each"),
        (args.dtype == "bf16-weights" and bool(args.parallel), "--dtype bf16-weights runs in one process: "
                                                                 "drop --parallel"),
        (args.loss is not None and args.step is not None, "--step runs your whole step, loss included: give "
                                                           "--loss or --step")])
    world_size = parallel.check_parallel_args(parser, args, device)
    full = args.shape == "full" or (args.shape == "auto" and device.type == "cuda")
    args.shape = "full" if full else "scaled"
    dims = {k: getattr(args, k) for k in (*results.SHAPE_FLAGS, "context_length")}
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
    if not (args.dry_run or args.force or run.model_factory):  # yours is predicted in the run's child
        state = parallel.state_bytes_per_rank(cfg, run.parallel, world_size, "train")["state_bytes"]
        if problem := state_refusal(run, device, state, state_counted(cfg)):
            parser.error(f"leaderboard {args.shape}: {problem}")
    return run


def state_refusal(run: RunConfig, device: torch.device, state: int, counted: str) -> str | None:
    """Why a training state of `state` bytes per device cannot fit in the free memory, or None."""
    if device.type == "cuda" and not run.parallel:  # one process may spread its model over every GPU it sees
        devices = [torch.device("cuda", i) for i in range(torch.cuda.device_count())]
    else:
        devices = [parallel.rank_device(device, parallel.torchrun_launch() if run.parallel else None)]
    free = sum(common.free_memory_bytes(d) or 0 for d in devices)
    if not free or state <= free:
        return None
    return (f"the training state alone needs {state / GIB:.1f} GiB per device ({counted}) and "
            f"{'+'.join(map(str, devices))} has {free / GIB:.1f} GiB free: spread it (torchrun ... --parallel fsdp), "
            "cut --num-layers, or run it anyway with --force")


def your_state_refusal(run: RunConfig, device: torch.device) -> str | None:
    """state_refusal for your model at the full shape, built on the meta device (nothing allocated): its parameters
    in their dtypes, gradients alike, AdamW's two moments in fp32; FSDP2 shards all of it. None where it fits, or
    where your model cannot be built on the meta device (then the run says)."""
    try:
        with torch.device("meta"):
            params = list(build_model(run.model, factory=run.model_factory).parameters())
    except Exception:  # noqa: BLE001 - a factory that needs real memory: not predicted
        return None
    count = sum(p.numel() for p in params)
    state = (2 * sum(p.numel() * p.element_size() for p in params) + 8 * count)
    state //= run.world_size if run.parallel == "fsdp" else 1
    dtypes = ", ".join(sorted({dtype_name(p.dtype) for p in params}))
    return state_refusal(run, device, state, f"your model's {count:,} parameters in {dtypes}: weights + grads "
                                             "alike + 8 bytes of AdamW state each; activations not counted")


def state_counted(cfg: ModelConfig) -> str:
    return (f"model.TransformerLM's {cfg.num_params:,} parameters x (4 weights + 4 grads + 8 AdamW) bytes, fp32 "
            "master weights; activations not counted")


# ---------------------------------------------------------------- check

def check_shape(timed: ModelConfig, device: torch.device) -> ModelConfig:
    """The behaviour check's model: the timed head size over CHECK_HEADS heads, CHECK_LAYERS layers, and a context
    long enough for tiled attention kernels (CHECK_CONTEXT, scaled to the machine)."""
    d_model = CHECK_HEADS * timed.d_head
    return ModelConfig(d_model=d_model, d_ff=8 * max(1, round(d_model / 3)), num_layers=CHECK_LAYERS,
                       num_heads=CHECK_HEADS, vocab_size=CHECK_VOCAB, context_length=CHECK_CONTEXT[device.type])


def relative_error(x: torch.Tensor | None, reference: torch.Tensor) -> float:
    """||x - reference|| / ||reference|| in float64; inf for a missing or non-finite x."""
    if x is None:
        return math.inf
    diff = (x.detach().double().to(reference.device) - reference.detach().double()).norm()
    return float((diff / reference.detach().double().norm().clamp_min(1e-30)).nan_to_num(math.inf))


def adamw_changes(start: dict[str, torch.Tensor], grads: list[dict[str, torch.Tensor]],
                  eps_beside_sqrt_v: bool) -> list[dict[str, torch.Tensor]]:
    """Each parameter's change from `start` after each step of AdamW(**ADAMW_SETTINGS) fed `grads`, in float64:
    epsilon added to the bias-corrected sqrt(v) (torch's) or to sqrt(v), the correction folded into the step size
    (Algorithm 1 of assignment 1, the staff cs336_basics.optimizer.AdamW)."""
    lr, (b1, b2), eps, decay = (ADAMW_SETTINGS[k] for k in ("lr", "betas", "eps", "weight_decay"))
    p = {n: w.double() for n, w in start.items()}
    m, v = ({n: torch.zeros_like(w) for n, w in p.items()} for _ in range(2))
    changes = []
    for t, g in enumerate(grads, 1):
        for n in p:
            m[n] = b1 * m[n] + (1 - b1) * g[n].double()
            v[n] = b2 * v[n] + (1 - b2) * g[n].double() ** 2
            if eps_beside_sqrt_v:
                update = lr * math.sqrt(1 - b2 ** t) / (1 - b1 ** t) * m[n] / (v[n].sqrt() + eps)
            else:
                update = lr / (1 - b1 ** t) * m[n] / (v[n].sqrt() / math.sqrt(1 - b2 ** t) + eps)
            p[n] = p[n] * (1 - lr * decay) - update
        changes.append({n: p[n] - start[n].double() for n in p})
    return changes


def matched_names(yours: torch.nn.Module, reference: torch.nn.Module, param_map: str | None,
                  ) -> tuple[dict[str, str], str | None]:
    """{your parameter: the reference's} (through param_map when given), and what does not match, or None."""
    ref_params, your_params = dict(reference.named_parameters()), dict(yours.named_parameters())
    names = common.load(param_map)(yours) if param_map else {n: n for n in your_params}
    unmatched = [n for n in your_params if names.get(n) not in ref_params]
    uncovered = sorted(set(ref_params) - {names.get(n) for n in your_params})
    misshapen = [n for n in your_params if n not in unmatched and your_params[n].shape != ref_params[names[n]].shape]
    if not (unmatched or uncovered or misshapen):
        return names, None
    problem = (f"{', '.join(unmatched[:3])} match no reference parameter" if unmatched else
               f"nothing of yours maps to {', '.join(uncovered[:3])}" if uncovered else
               f"{misshapen[0]} is {tuple(your_params[misshapen[0]].shape)}, the reference's "
               f"{tuple(ref_params[names[misshapen[0]]].shape)}")
    return names, f"parameters: {problem} (map your names with --param-map)"


def at_reference_weights(your_params: dict[str, torch.Tensor], ref_params: dict[str, torch.Tensor],
                         names: dict[str, str]) -> None:
    """Your parameters get the reference's values; neither has a gradient."""
    with torch.no_grad():
        for n, p in your_params.items():
            p.copy_(ref_params[names[n]])
    for p in (*your_params.values(), *ref_params.values()):
        p.grad = None


class GradientProbe:
    """What the check hands your step (--step) for an optimizer: step() keeps each parameter's gradient, and
    changes nothing; your optimizer's steps are checked apart."""

    def __init__(self, params: list[torch.Tensor]):
        self.params, self.grads, self.param_groups = params, [], [{"params": params, **ADAMW_SETTINGS}]

    def step(self, closure: Callable | None = None) -> None:
        self.grads.append([None if p.grad is None else p.grad.detach().clone() for p in self.params])

    def zero_grad(self, set_to_none: bool = True) -> None:
        for p in self.params:
            p.grad = None


def compare(yours: torch.nn.Module, forward: Callable, optimizer: Any, reference: torch.nn.Module,
            names: dict[str, str], tokens: torch.Tensor, targets: torch.Tensor,
            loss_fn: Callable | None = None, step: Callable | None = None, autocast: bool = True,
            stepped: torch.nn.Module | None = None) -> dict[str, Any]:
    """Both models at the reference's weights: logits (unless your loss_fn takes what your model returns, or your
    step does it all), loss and every gradient of `forward` (yours, or its compiled form) under bf16 autocast
    against the reference's in fp32; your step (--step) is given a GradientProbe for an optimizer. Then CHECK_STEPS
    steps of `optimizer` on your parameters from the reference's weights, each step its own gradients, against
    AdamW's (adamw_changes, either epsilon), on the parameters of `stepped` (default: yours; with bf16 weights, an
    fp32 twin: bf16 would round AdamW's steps away), none when `optimizer` is None: {"errors": {what: relative
    error}, "no_gradient": [...], "step_reference": the closer AdamW, "problem": a step that did not call
    optimizer.step() once, or None}. Without `autocast` (bf16 weights) your forward runs as it is."""
    device = tokens.device
    precision = (lambda: precision_context(device, "bf16")) if autocast else contextlib.nullcontext
    ref_params, your_params = dict(reference.named_parameters()), dict(yours.named_parameters())
    at_reference_weights(your_params, ref_params, names)
    ref_logits = reference(tokens)
    ref_loss = cross_entropy(ref_logits, targets)
    ref_loss.backward()
    errors, problem = {}, None
    if step is None:
        with precision():
            output = forward(tokens)
            if loss_fn is None:
                check_logits(output, tuple(tokens.shape), ref_logits.shape[-1], None)
                errors["logits"] = relative_error(output, ref_logits)
            loss = (loss_fn or cross_entropy)(output, targets)
        loss.backward()
        your_grads = {n: p.grad for n, p in your_params.items()}
    else:
        probe = GradientProbe(list(your_params.values()))
        with precision():
            loss = step(forward, probe, tokens, targets)
        if len(probe.grads) != 1:
            problem = f"your step called optimizer.step() {len(probe.grads)} times in one step"
        your_grads = dict(zip(your_params, probe.grads[0] if probe.grads else [None] * len(your_params)))
    errors["loss"] = relative_error(torch.as_tensor(loss), ref_loss)
    errors.update({f"grad {names[n]}": relative_error(your_grads[n], ref_params[names[n]].grad)
                   for n in your_params})
    no_gradient = [f"grad {names[n]}" for n in your_params if your_grads[n] is None]
    if optimizer is None:
        return {"errors": errors, "no_gradient": no_gradient, "step_reference": None, "problem": problem}
    your_params = dict((stepped or yours).named_parameters())
    # the steps' gradients: the reference's, each element scaled by its own factor in [0.5, 1.5) at each step, so an
    # optimizer that forgets its moments or its step count between steps moves elsewhere from the second step on
    rng = torch.Generator().manual_seed(0)
    start = {r: p.detach().clone() for r, p in ref_params.items()}
    grads = [{r: p.grad * torch.rand(p.shape, generator=rng).add_(0.5).to(device) for r, p in ref_params.items()}
             for _ in range(CHECK_STEPS)]
    at_reference_weights(your_params, ref_params, names)
    yours_changed = []
    for step_grads in grads:
        for n, p in your_params.items():
            p.grad = step_grads[names[n]].to(p.dtype).clone()
        optimizer.step()
        yours_changed.append({names[n]: p.detach() - start[names[n]] for n, p in your_params.items()})
    optimizer.zero_grad(set_to_none=True)
    steps = {name: {f"step {k} of {r}": relative_error(yours_changed[k - 1][r], changes[r])
                    for k, changes in enumerate(adamw_changes(start, grads, beside), 1) for r in changes}
             for name, beside in STEP_REFERENCES.items()}
    matched = min(steps, key=lambda name: max(steps[name].values()))
    return {"errors": errors | steps[matched], "no_gradient": no_gradient, "step_reference": matched,
            "problem": problem}


def judged(out: dict[str, Any], compared: dict[str, Any]) -> dict[str, Any]:
    """The check's verdict from compare(): ok, the worst tensor against its tolerance, and the problem if any."""
    errors = compared["errors"]
    tolerance = {k: STEP_TOLERANCE if k.startswith("step ") else CHECK_TOLERANCE for k in errors}
    worst = max(errors, key=lambda k: errors[k] / tolerance[k])
    out = {**out, "ok": errors[worst] <= tolerance[worst], "worst": worst, "max_error": errors[worst],
           "errors": errors, "tolerance": CHECK_TOLERANCE, "step_tolerance": STEP_TOLERANCE,
           "steps": CHECK_STEPS, "step_reference": compared["step_reference"]}
    if compared.get("problem"):
        return {**out, "ok": False, "problem": compared["problem"]}
    if out["ok"]:
        return out
    if worst in compared["no_gradient"]:
        return {**out, "problem": f"{worst.removeprefix('grad ')} has no gradient (the reference's has one)"}
    against = (f"AdamW({', '.join(f'{k}={v}' for k, v in ADAMW_SETTINGS.items())}) as "
               f"{' or as '.join(STEP_REFERENCES)}" if worst.startswith("step ") else out["reference"])
    return {**out, "problem": f"{worst} off by {errors[worst]:.1e} (relative; tolerance {tolerance[worst]:.0e}) "
                              f"against {against}"}


def default_problem(optimizer: str) -> str | None:
    """A default of your optimizer's signature other than the course AdamW's (model.ADAMW_SETTINGS): the course
    builds AdamW(model.parameters()), so its defaults are the settings it trains with."""
    if optimizer in (common.OURS, "torch"):
        return None
    try:
        named = inspect.signature(common.load(optimizer)).parameters
    except (TypeError, ValueError):  # no signature to read: its steps say
        return None
    for key, value in ADAMW_SETTINGS.items():
        default = named[key].default if key in named else inspect.Parameter.empty
        if isinstance(default, list):
            default = tuple(default)
        if default is not inspect.Parameter.empty and default != value:
            return (f"{optimizer}'s default {key} is {default!r}, the course AdamW's {value!r} (the leaderboard "
                    "builds it with its defaults: CLASS(model.parameters()))")
    return None


def reference_spec() -> str | None:
    return STAFF_MODEL if importlib.util.find_spec("cs336_basics") else None


def yours_compared(yours: torch.nn.Module, called: Callable, optimizer: Any, reference: torch.nn.Module,
                   names: dict[str, str], tokens: torch.Tensor, targets: torch.Tensor, loss: str | None,
                   step: str | None, **options: Any) -> dict[str, Any]:
    """compare() with your loss or step, imported here (in the run's child)."""
    return compare(yours, called, optimizer, reference, names, tokens, targets, loss and common.load(loss),
                   step and common.load(step), **options)


def behaviour_check(factory: str | None, param_map: str | None, device: torch.device, seed: int = 0,
                    optimizer: str = "ours", shape: ModelConfig | None = None, loss: str | None = None,
                    step: str | None = None, bf16_weights: bool = False) -> dict:
    """Your model against the reference (the staff model when cs336_basics imports, else ours) at `shape` (default:
    check_shape of the scaled leaderboard's), both fresh: your parameters get the reference's values (by name,
    through param_map when given) and compare() runs; your optimizer is built as the course builds it
    (CLASS(params): its defaults must be the course AdamW's). With bf16_weights, a second model of yours in bf16
    runs without autocast, and the optimizer steps the fp32 one."""
    shape = shape or check_shape(SCALED, device)
    torch.manual_seed(seed)
    with device:
        reference = build_model(shape, factory=reference_spec())
        yours = build_model(shape, factory=factory)
    out = {"reference": reference_spec() or "ours", "shape": dataclasses.asdict(shape)}
    names, problem = matched_names(yours, reference, param_map)
    problem = problem or default_problem(optimizer)
    if problem:
        return {**out, "ok": False, "problem": problem}
    tokens, targets = (torch.randint(0, shape.vocab_size, (CHECK_BATCH, shape.context_length), device=device)
                       for _ in range(2))
    built = build_optimizer(optimizer, yours.parameters(), device, course=True)
    if bf16_weights:
        with device:
            called = build_model(shape, factory=factory).to(torch.bfloat16)
        return judged(out, yours_compared(called, called, built, reference, names, tokens, targets, loss, step,
                                          autocast=False, stepped=yours))
    return judged(out, yours_compared(yours, yours, built, reference, names, tokens, targets, loss, step))


def recheck(work: YourLossWorkload, param_map: str | None, optimizer_state: dict, loss: str | None = None,
            step: str | None = None) -> dict[str, Any]:
    """The check again after the timing, on the very model and optimizer that were timed, at the timed shape and
    batch: the reference's weights loaded into the timed model, the optimizer's state as it was built (its
    load_state_dict), compare() through the timed (compiled) model. Not where the reference would not fit beside
    the timed model (the full shape) or the model is sharded over ranks (--parallel)."""
    run = work.run
    if run.parallel or run.size == "leaderboard-full":
        why = ("--parallel: the timed model is sharded" if run.parallel
               else "the full shape: a reference beside it would not fit")
        return {"ok": None, "skipped": f"not rechecked after the timing ({why})"}
    torch.manual_seed(run.seed)
    with work.device:
        reference = build_model(run.model, factory=reference_spec())
    out = {"reference": reference_spec() or "ours", "shape": dataclasses.asdict(run.model)}
    names, problem = matched_names(work.model, reference, param_map)
    if problem:
        return {**out, "ok": False, "problem": problem}
    work.optimizer.load_state_dict(optimizer_state)
    if work.bf16_weights:  # its steps on bf16 weights are not AdamW's to the check's tolerance: the model alone
        out["optimizer"] = "not rechecked: bf16 weights round AdamW's steps"
    return judged(out, yours_compared(work.model, work.callable_model, None if work.bf16_weights else work.optimizer,
                                      reference, names, work.tokens, work.targets, loss, step,
                                      autocast=not work.bf16_weights))


def global_settings(device: torch.device) -> dict[str, tuple[Callable, Callable]]:
    """torch's process-wide settings that change what is timed or checked: name -> (read, write)."""
    kind = device.type
    return {"default dtype": (torch.get_default_dtype, torch.set_default_dtype),
            "default device": (torch.get_default_device, torch.set_default_device),
            "grad mode": (torch.is_grad_enabled, torch.set_grad_enabled),
            "float32 matmul precision": (torch.get_float32_matmul_precision, torch.set_float32_matmul_precision),
            "deterministic algorithms": (torch.are_deterministic_algorithms_enabled,
                                         torch.use_deterministic_algorithms),
            "autocast": (lambda: torch.is_autocast_enabled(kind), lambda on: torch.set_autocast_enabled(kind, on))}


def restore_settings(before: dict[str, Any], device: torch.device) -> dict[str, str]:
    """Put back every global setting your code changed since `before`: {setting: what your code had set}."""
    changed = {}
    for name, (read, write) in global_settings(device).items():
        if (now := read()) != before[name]:
            changed[name] = str(now)
            write(before[name])
    return changed


# ---------------------------------------------------------------- measure


def measure_leaderboard(run: RunConfig, args: argparse.Namespace, started: float, caches: str) -> dict[str, Any]:
    """The leaderboard in its child (every rank's under torchrun): inductor's and triton's caches in the empty
    folder `caches`, as in the leaderboard's run."""
    device = parallel.rank_device(resolve_device(run.device), parallel.torchrun_launch() if run.parallel else None)
    cold = {name: os.path.join(caches, name.split("_")[0].lower())
            for name in ("TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR")}
    with mock.patch.dict(os.environ, cold):
        return leaderboard_measure(args, run, device, started)


def leaderboard_measure(args: argparse.Namespace, run: RunConfig, device: torch.device,
                        started: float) -> dict[str, Any]:
    """The check, then do_bench of the leaderboard's step (the headline, and the wall time so far), then --steps
    steps with each phase synchronised apart (the split, peak memory), then the check again on what was timed.
    torch's global settings your code changes are put back before the timing, and recorded."""
    # bound before your code is imported: triton's do_bench as it is, whatever your modules replace later
    do_bench = common.triton_do_bench() if device.type == "cuda" and not run.parallel else None
    settings = {name: read() for name, (read, _) in global_settings(device).items()}
    if run.model_factory and run.size == "leaderboard-full" and not args.force:
        if problem := your_state_refusal(run, device):
            return {"environment": environment(device), "status": f"refused: {problem}",
                    "global_settings_changed": restore_settings(settings, device)}
    phase("the behaviour check")
    record: dict[str, Any] = {"environment": environment(device), "check": behaviour_check(
        run.model_factory, args.param_map, device, run.seed, run.optimizer, check_shape(run.model, device),
        args.loss, args.step, args.dtype == "bf16-weights")}
    changed = restore_settings(settings, device)
    if not record["check"]["ok"]:
        return {**record, "global_settings_changed": changed, "status": f"WRONG: {record['check']['problem']}"}
    loss, step = (common.load(spec) if spec else None for spec in (args.loss, args.step))
    work = YourLossWorkload(run, loss, args.dtype == "bf16-weights")
    work.optimizer = build_optimizer(run.optimizer, work.model.parameters(), device, course=True)  # the course's
    built_state = copy.deepcopy(work.optimizer.state_dict())
    record["precision"] = PRECISIONS[args.dtype]
    record["trained_dtypes"] = sorted({dtype_name(p.dtype) for p in work.model.parameters()})
    changed |= restore_settings(settings, device)

    def agree(n: int) -> int:  # under torchrun: the ranks' largest call count, so all run as many collectives
        count = torch.tensor([n], device=device)
        torch.distributed.all_reduce(count, op=torch.distributed.ReduceOp.MAX)
        return int(count.item())

    cuda = [torch.device("cuda", i) for i in range(torch.cuda.device_count())] if device.type == "cuda" else []
    for d in cuda:
        torch.cuda.reset_peak_memory_stats(d)
    phase(f"do_bench (warmup {args.warmup_ms:g} ms, rep {args.rep_ms:g} ms)")
    def your_step() -> Any:  # --step: yours, as ours: under bf16 autocast, or bf16 weights without
        with work.precision():
            return step(work.callable_model, work.optimizer, work.tokens, work.targets)

    timed_step = your_step if step else work.untimed_step
    record["leaderboard"] = common.leaderboard_time(timed_step, device, args.warmup_ms, args.rep_ms,
                                                     agree=agree if run.parallel else None, do_bench=do_bench)
    record["wall_s"] = common.clock() - started
    record["over_10_min"] = record["wall_s"] > WALL_LIMIT_S
    record["peak_mem_by_device"] = {str(d): torch.cuda.max_memory_allocated(d) for d in cuda
                                    if torch.cuda.max_memory_allocated(d)}
    if step:  # your step has no phases to split: --warmup steps, then --steps timed
        common.sync_times(timed_step, device, run.warmup)
        record.update(step_ms=common.sync_times(timed_step, device, run.steps), **common.peak_memory_bytes(device))
    else:
        record.update(measure_steps(work))
    changed |= restore_settings(settings, device)
    phase("the behaviour check again, on the timed model and optimizer")
    record["recheck"] = recheck(work, args.param_map, built_state, args.loss, args.step)
    record["global_settings_changed"] = changed | restore_settings(settings, device)
    disagree = record["leaderboard"]["clocks_disagree"]
    if record["recheck"]["ok"] is False:
        return {**record, "status": f"WRONG after the timing: {record['recheck']['problem']}"}
    if disagree > common.CLOCKS_AGREE:
        return {**record, "status": f"refused: the step's two clocks disagree by {disagree:.0%} ("
                                    f"{record['leaderboard']['ms']:.3g} ms against "
                                    f"{record['leaderboard']['second_clock_ms']:.3g} ms; a clock was replaced?)"}
    return {**record, "status": "ok"}


class YourLossWorkload(Workload):
    """The timed step with your loss (--loss) in place of cross_entropy: loss(what your model returns, targets);
    with bf16_weights (--dtype bf16-weights) your model in bf16 and no autocast."""

    def __init__(self, run: RunConfig, loss: Callable | None, bf16_weights: bool = False):
        super().__init__(run)
        self.loss, self.bf16_weights = loss, bf16_weights
        if bf16_weights:
            self.model.to(torch.bfloat16)  # before the optimizer is built over its parameters

    def precision(self) -> contextlib.AbstractContextManager:
        return contextlib.nullcontext() if self.bf16_weights else precision_context(self.device, self.run.dtype)

    def forward(self, eager: bool = False) -> torch.Tensor:
        if self.loss is None and not self.bf16_weights:
            return super().forward(eager)
        with torch.enable_grad(), self.precision():
            return (self.loss or cross_entropy)((self.model if eager else self.callable_model)(self.tokens),
                                                self.targets)


def finish_record(run: RunConfig, record: dict[str, Any], peak_tflops: float | None,
                  ceiling: dict[str, Any] | None) -> None:
    """In the parent, once every rank's record is merged: the split's statistics, MFU and the step's floor on
    do_bench's figure."""
    if not finished(record):
        return
    if "forward_ms" not in record:  # --step: the whole step only
        stats = {f"step_ms_{stat}": value for stat, value in results.summarize(record["step_ms"]).items()}
        noisy = stats["step_ms_cv"] is not None and stats["step_ms_cv"] > runner.NOISY_CV
        record.update(stats, noisy=[f"step {stats['step_ms_cv']:.0%}"] if noisy else [], mfu=None)
        record["status"] = "noisy" if noisy else "ok"
        return
    record.update(derive_figures(run, record, peak_tflops, ceiling))
    if record["mfu"]:  # MFU on do_bench's step time rather than the split's
        record["leaderboard"]["mfu"] = record["mfu"] * record["step_ms_mean"] / record["leaderboard"]["ms"]
    step_floor = record["floors"]["phases"].get("step", {}).get("floor_ms")
    if step_floor:  # forward + backward + optimizer's floors against do_bench's step
        record["leaderboard"]["of_floor"] = step_floor / record["leaderboard"]["ms"]
    record["status"] = "noisy" if record["noisy"] else "ok"


# ---------------------------------------------------------------- report


def leaderboard(args: argparse.Namespace, run: RunConfig, started: float) -> int:
    """The leaderboard in a child (every rank's under torchrun, in one process group), bounded by --timeout: a hang,
    a crash or Ctrl-C is the row. 1 when WRONG or failed."""
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
    rank_zero, device = parallel.is_rank_zero(), resolve_device(run.device)
    ceiling = runner.measured_ceiling(args, device)  # the floors' where no datasheet names the device; before files
    files = ResultFiles(args.results_dir, "e2e", args.out, "leaderboard") if rank_zero else None
    # the child's compile caches, made and removed here: a child killed at --timeout removes nothing
    with tempfile.TemporaryDirectory(prefix="leaderboard-cache-", ignore_cleanup_errors=True) as caches:
        measure = functools.partial(measure_leaderboard, args=args, started=started, caches=caches)
        records, code = runner.run_configurations(
            measure, [run], files, args, name="leaderboard-2026", device=device, ceiling=ceiling,
            finish=lambda r, record: finish_record(r, record, args.peak_tflops, ceiling))
    if not records:  # interrupted before its row: the row says so
        how = "SIGTERM" if code == 128 + signal.SIGTERM else "Ctrl-C"
        records = [{"experiment": "leaderboard-2026", "config": dataclasses.asdict(run), "label": run.label(),
                    "environment": {"device": str(device), "device_name": str(device), "torch": torch.__version__},
                    "status": f"interrupted by {how}"}]
        if files is not None:
            files.append_record(records[0])
    if rank_zero and (published := report.publish("leaderboard-2026", records, files, args.fmt)):
        return code or published  # 130: Ctrl-C while the report was written
    return code or (0 if finished(records[0]) else 1)


def main(argv: list[str] | None = None) -> int:
    started = common.clock()
    args, run = parse_args(argv)
    return leaderboard(args, run, started)


if __name__ == "__main__":
    sys.exit(main())
