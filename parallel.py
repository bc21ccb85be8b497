"""Data parallelism across processes for `bench_e2e.py --parallel ddp|fsdp`, on torch.distributed launched by
torchrun: DDP and FSDP2 wrapping, the per-rank memory prediction, the process group of one configuration, the
rank processes' agreement on its outcome, and the merge of every rank's timings into one record.

    torchrun --nproc-per-node 2 bench_e2e.py --parallel ddp fsdp --size tiny --device cpu   # 2 processes, gloo
    torchrun --nproc-per-node 8 bench_e2e.py --parallel fsdp --size 2.7B --dtype bf16          # 8 GPUs, NCCL

How a sweep runs across ranks. torchrun starts one process per rank (a "rank process"). Every rank process runs
the same sweep; each configuration runs, on every rank, in a fresh child process (isolation.run_isolated), and the
children of one configuration join a process group of their own, made for it: a PrefixStore with the
configuration's key prefix on torchrun's TCPStore at MASTER_ADDR:MASTER_PORT (the one torchrun's rendezvous
already runs). So an OOM, a dead child or a broken NCCL communicator never outlives its configuration. The rank
processes form no process group: they agree through the same store. A child that fails writes its rank under
the configuration's `first_failure` key before it exits (before its peers can see a closed connection and fail
in turn), the other ranks' parents see the key within POLL_S and stop their children (a peer stuck in a
collective would otherwise wait for the dead one until the process-group timeout), then every rank publishes
its answer and reads everyone's. All ranks thus reach the same row ("OOM on rank 3") and the same decisions
(skip larger contexts after an OOM) without a collective that could hang.

Nothing here does work at import time or changes global state on import.
"""
from __future__ import annotations

import argparse
import contextlib
import datetime
import itertools
import math
import os
import pickle
import platform
import re
import statistics
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Mapping

import torch
import torch.distributed as dist
import torch.nn as nn

import cli
import common
from common import ddp_no_forward_buffer_sync, fsdp_root_reshard_after_forward, resolve_device
from model_config import ModelConfig
from results import progress

PARALLEL = ("ddp", "fsdp")
FSDP_MIXED_PRECISION = ("off", "bf16")
DEFAULT_PG_TIMEOUT_S = 300.0  # a collective waiting this long for a peer fails (both backends)
POLL_S = 0.2  # how often a rank process looks for a failed peer while its child runs
FIRST_FAILURE = "first_failure"  # store key (per configuration): the rank that failed first


# ---- the launch: what torchrun tells every process ----


@dataclass(frozen=True)
class Launch:
    """One process's place in a torchrun launch (torchrun's environment variables)."""

    rank: int  # global rank, 0 .. world_size - 1
    world_size: int
    local_rank: int  # rank on this node: the GPU it uses
    local_world_size: int  # processes on this node (--nproc-per-node)
    master_addr: str  # the rendezvous TCPStore
    master_port: int


def torchrun_launch(environ: Mapping[str, str] = os.environ) -> Launch | None:
    """The launch this process belongs to, from torchrun's variables; None when not launched by torchrun (no RANK
    or WORLD_SIZE)."""
    if "RANK" not in environ or "WORLD_SIZE" not in environ:
        return None
    world_size = int(environ["WORLD_SIZE"])
    return Launch(rank=int(environ["RANK"]), world_size=world_size, local_rank=int(environ.get("LOCAL_RANK", 0)),
                  local_world_size=int(environ.get("LOCAL_WORLD_SIZE", world_size)),
                  master_addr=environ.get("MASTER_ADDR", "127.0.0.1"),
                  master_port=int(environ.get("MASTER_PORT", 29500)))


def is_rank_zero() -> bool:
    """True in a single process and on global rank 0: the one process that prints and writes files."""
    return os.environ.get("RANK", "0") == "0"


def rank_device(device: torch.device, launch: Launch | None) -> torch.device:
    """With CUDA, each rank uses the GPU of its local rank (one device per process, as NCCL requires)."""
    if launch is not None and device.type == "cuda":
        return torch.device("cuda", launch.local_rank)
    return device


def backend_for(device: torch.device) -> str:
    """NCCL between GPUs, gloo between CPU processes."""
    return "nccl" if device.type == "cuda" else "gloo"


# ---- the command line: --parallel and its settings (bench_e2e) ----


def add_parallel_args(parser: argparse.ArgumentParser) -> None:
    """--parallel, FSDP2's settings, --pg-timeout and --world-size (to plan a run with --dry-run)."""
    parser.add_argument("--parallel", nargs="+", choices=PARALLEL, default=None,
                        help="under torchrun, on every rank: ddp = DistributedDataParallel, fsdp = FSDP2 (fully_shard "
                             "on every block and the root); both to compare them. --batch-size is per rank. See "
                             "docs/bench_e2e.md#more-than-one-gpu")
    parser.add_argument("--fsdp-mixed-precision", nargs="+", choices=FSDP_MIXED_PRECISION, default=None,
                        help="fsdp: bf16 = MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32): parameters used "
                             "in bf16, fp32 sharded master weights and reduction; off (default) = fp32")
    parser.add_argument("--reshard-after-forward", nargs="+", choices=["on", "off"], default=None,
                        help="fsdp: on (default) = blocks free their gathered parameters after forward and gather "
                             "them again for backward; off = keep them (more memory, fewer all-gathers)")
    parser.add_argument("--pg-timeout", type=cli.positive_float, default=DEFAULT_PG_TIMEOUT_S, metavar="SECONDS",
                        help="--parallel: a collective waiting longer than this for a peer fails its configuration")
    parser.add_argument("--world-size", type=cli.positive_int, default=None, metavar="N",
                        help="--parallel --dry-run without torchrun: plan for N ranks (the predicted state per rank)")


def check_parallel_args(parser: argparse.ArgumentParser, args: argparse.Namespace, device: torch.device) -> int:
    """--parallel and torchrun belong together (or --world-size, to plan with --dry-run); a bad combination is a
    one-line exit 2 (from rank 0 only), too many CPU processes a one-line warning. Fills the FSDP-only flags'
    defaults. Returns the world size (1 without --parallel)."""
    launch = torchrun_launch()
    fsdp_flags = [f for f, v in (("--fsdp-mixed-precision", args.fsdp_mixed_precision),
                                 ("--reshard-after-forward", args.reshard_after_forward)) if v is not None]
    args.fsdp_mixed_precision = args.fsdp_mixed_precision or ["off"]
    args.reshard_after_forward = args.reshard_after_forward or ["on"]
    cli.refuse(parser, [
        (args.world_size is not None and not args.parallel, "--world-size only applies to --parallel (with --dry-run)"),
        (args.world_size is not None and not args.dry_run,
         "--world-size only plans a --parallel run with --dry-run; a real run takes its world size from torchrun: "
         "torchrun --nproc-per-node N bench_e2e.py --parallel ..."),
        (args.world_size is not None and launch is not None,
         f"--world-size plans without torchrun; this is a torchrun launch (WORLD_SIZE="
         f"{launch.world_size if launch else ''})"),
        (not args.parallel and launch is not None and launch.world_size > 1,
         f"launched by torchrun with WORLD_SIZE={launch.world_size if launch else ''} but without --parallel: every "
         "rank would run the whole sweep on its own; add --parallel ddp or --parallel fsdp"),
        (bool(fsdp_flags) and "fsdp" not in (args.parallel or []),
         f"{' and '.join(fsdp_flags)} only apply to --parallel fsdp")])
    if not args.parallel:
        return 1
    args.parallel = list(dict.fromkeys(args.parallel))
    cli.refuse(parser, [
        (args.in_process, "--parallel with --in-process is not supported yet: every rank runs each configuration in "
                          "a child process of its own, which joins that configuration's process group"),
        (device.type == "cuda" and device.index is not None,
         f"--parallel gives each rank the GPU of its LOCAL_RANK: pass --device cuda, not {device}")])
    if args.world_size is not None:  # a plan: nothing is launched, so there are no processes to check
        return args.world_size
    if "fsdp" in args.parallel and (reason := common.fsdp2_unsupported(device)):
        parser.error(f"--parallel fsdp: {reason}: use --parallel ddp, a GPU or a newer torch")
    cli.refuse(parser, [(launch is None, "--parallel needs torchrun, which starts one process per rank and sets RANK "
                                         "and WORLD_SIZE: torchrun --nproc-per-node N bench_e2e.py --parallel ... (to "
                                         "plan without it: --dry-run --world-size N)")])
    if device.type == "cuda" and torch.cuda.device_count() < launch.local_world_size:
        parser.error(f"--parallel on CUDA needs one GPU per process: {launch.local_world_size} processes on this "
                     f"node but {torch.cuda.device_count()} GPU(s) visible")
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    if device.type != "cuda" and launch.local_world_size > cores and launch.rank == 0:
        progress(f"warning: {launch.local_world_size} processes on this node but {cores} CPU cores: the "
                         "ranks share cores and every timing includes the others' work")
    return launch.world_size



# ---- DDP and FSDP2 around the model ----


def shard_model(model: nn.Module, parallel: str, device: torch.device, fsdp_mixed_precision: str = "off",
                reshard_after_forward: bool = True) -> nn.Module:
    """The model as the step calls it, for the process group this process has joined.

    ddp: DistributedDataParallel: full replica on every rank, gradients averaged by all-reduce in buckets during
    backward. gradient_as_bucket_view=True: gradients live in the communication buckets, not in a second copy;
    no buffer broadcast before forward (common.ddp_no_forward_buffer_sync): the only buffer is the RoPE cos/sin
    cache, computed identically on every rank.

    fsdp: FSDP2, fully_shard on every TransformerBlock and then on the root (embedding, final norm and lm_head):
    parameters, gradients and optimizer state are sharded across ranks (dim 0 of each parameter); each block's
    parameters are all-gathered before its forward and backward, and gradients reduce-scattered after backward.
    fsdp_mixed_precision "bf16" = MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32): the all-gathered
    parameters and the compute are bf16, the sharded master weights and the gradient reduction stay fp32.
    reshard_after_forward: the blocks free their gathered parameters after forward (and gather again in
    backward); False keeps them until backward (more memory, less communication). The root follows torch's
    rule: it stays gathered after forward, since backward begins with it. The model is changed in place."""
    if parallel == "ddp":
        from torch.nn.parallel import DistributedDataParallel
        return DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None,
                                       gradient_as_bucket_view=True, **ddp_no_forward_buffer_sync())
    if parallel != "fsdp":
        raise ValueError(f"unknown parallelism {parallel!r}; choose from {', '.join(PARALLEL)}")
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
    mesh = init_device_mesh(device.type, (dist.get_world_size(),))
    policy = (MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
              if fsdp_mixed_precision == "bf16" else MixedPrecisionPolicy())
    for block in model.layers:
        fully_shard(block, mesh=mesh, mp_policy=policy, reshard_after_forward=reshard_after_forward)
    fully_shard(model, mesh=mesh, mp_policy=policy,
                reshard_after_forward=fsdp_root_reshard_after_forward(reshard_after_forward))
    return model


def full_parameters(model: nn.Module) -> dict[str, torch.Tensor]:
    """Every parameter, whole, by its name in the unwrapped model: FSDP2's DTensor shards are all-gathered (a
    collective: every rank must call this), DDP's "module." prefix is dropped."""
    out = {}
    for name, p in model.named_parameters():
        full = p.full_tensor() if hasattr(p, "full_tensor") else p
        out[name.removeprefix("module.")] = full.detach().clone()
    return out


# ---- memory prediction per rank ----

BYTES_FP32 = 4


def parameter_shapes(cfg: ModelConfig) -> list[torch.Size]:
    """The shape of every parameter of model.py's TransformerLM, from a model built on the meta device (no memory,
    no time, and always in step with model.py)."""
    from model import TransformerLM
    with torch.device("meta"):
        return [p.shape for p in TransformerLM(cfg).parameters()]


def shard_elements(shape: torch.Size, world_size: int) -> int:
    """Elements of the largest rank's FSDP2 shard of one parameter: dim 0 is split in world_size chunks, padded to
    ceil(dim0 / world_size) rows each (FSDP2 allocates the padded shard on every rank)."""
    rows = math.ceil(shape[0] / world_size)
    return rows * math.prod(shape[1:])


def state_bytes_per_rank(cfg: ModelConfig, parallel: str | None, world_size: int, mode: str) -> dict[str, int]:
    """Predicted bytes of the training state on one rank (the largest): fp32 parameters; fp32 gradients (modes with
    backward); AdamW's two fp32 moments, exp_avg and exp_avg_sq (train mode). Full on every rank for DDP and a
    single process, the largest 1/N shard for FSDP2. --dtype bf16 autocast and FSDP2's bf16 MixedPrecisionPolicy
    keep fp32 master weights, gradients and moments, so they do not change it.

    Not counted: activations (they scale with batch x context and are what a context sweep runs out of); FSDP2's
    gathered parameters and unsharded gradients of the blocks in flight (transient, about one or two blocks);
    DDP's and NCCL's communication buffers; autocast's bf16 weight copies; the RoPE cache buffer; AdamW's step
    counters; the CUDA context and the caching allocator's fragmentation (reserved minus allocated)."""
    shapes = parameter_shapes(cfg)
    if parallel == "fsdp":
        elements = sum(shard_elements(s, world_size) for s in shapes)
    else:
        elements = sum(math.prod(s) for s in shapes)
    params = BYTES_FP32 * elements
    grads = params if mode != "forward" else 0
    optimizer = 2 * params if mode == "train" else 0
    return {"params_bytes": params, "grads_bytes": grads, "optimizer_bytes": optimizer,
            "state_bytes": params + grads + optimizer}


# ---- the process group of one configuration (in the child of every rank) ----


def configuration_store(prefix: str, launch: Launch, timeout_s: float) -> dist.Store:
    """A client of torchrun's TCPStore at MASTER_ADDR:MASTER_PORT, seen through the configuration's key prefix.
    Only clients: the server is torchrun's agent (or rank 0's process, when the launcher runs none), and it lives
    for the whole launch."""
    client = dist.TCPStore(launch.master_addr, launch.master_port, is_master=False,
                           timeout=datetime.timedelta(seconds=timeout_s))
    return dist.PrefixStore(prefix, client)


class PeerTimeout(RuntimeError):
    """A collective waited longer than the process-group timeout for a peer."""


PEER_TIMEOUT = "error: PeerTimeout: "  # how common.failure_status words it


@contextlib.contextmanager
def configuration_group(prefix: str, device: torch.device, timeout_s: float = DEFAULT_PG_TIMEOUT_S) -> Iterator[Launch]:
    """Join the process group of one configuration (world = every rank of the launch) for the block, then leave
    it. A failure inside the block is marked in the store under `first_failure` (if no rank was first) before it
    propagates; a collective's timeout becomes a PeerTimeout that says so."""
    launch = torchrun_launch()
    if launch is None:
        raise RuntimeError("a distributed configuration needs torchrun's RANK / WORLD_SIZE / MASTER_ADDR")
    store = configuration_store(prefix, launch, timeout_s)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group(backend_for(device), store=dist.PrefixStore("pg/", store), rank=launch.rank,
                            world_size=launch.world_size, timeout=datetime.timedelta(seconds=timeout_s),
                            device_id=device if device.type == "cuda" else None)
    try:
        yield launch
    except BaseException as exc:
        with contextlib.suppress(Exception):  # the store may be gone if the whole launch is going down
            store.compare_set(FIRST_FAILURE, "", str(launch.rank))
        if _is_timeout(exc):
            raise PeerTimeout(f"a collective waited more than {timeout_s:g} s for a peer (--pg-timeout)") from exc
        raise  # no destroy_process_group: a collective may be stuck; the process exits and that frees it
    dist.destroy_process_group()


def _is_timeout(exc: BaseException) -> bool:
    text = str(exc)
    return isinstance(exc, (RuntimeError, dist.DistError)) and bool(re.search(r"timed? ?out|timeout", text, re.I))


def measure_on_rank(measure: Callable[..., dict], run: Any, prefix: str, device: str,
                    timeout_s: float = DEFAULT_PG_TIMEOUT_S) -> dict[str, Any]:
    """In the child of every rank: join the configuration's process group, run `measure(run=run)`, leave. The
    record says which host the rank ran on."""
    with configuration_group(prefix, rank_device(resolve_device(device), torchrun_launch()), timeout_s):
        record = measure(run=run)
    record["host"] = platform.node()
    return record


# ---- the rank processes: agreeing on a configuration's outcome ----

_SWEEPS = itertools.count()  # sweeps started in this process: part of every key prefix, the same on every rank


class RankSweep:
    """What a rank process needs to run a sweep's configurations together with the other ranks: the store, a key
    prefix per configuration, and the exchange of answers. Every rank must run the same configurations in the
    same order (they parse the same command line)."""

    def __init__(self, launch: Launch, timeout_s: float = DEFAULT_PG_TIMEOUT_S):
        self.launch = launch
        # env:// connects to torchrun's store (or hosts it on rank 0 when no agent runs one)
        self.store, _, _ = next(dist.rendezvous("env://", timeout=datetime.timedelta(seconds=timeout_s)))
        restart = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
        self.prefix = f"bench/{os.environ.get('TORCHELASTIC_RUN_ID', 'none')}/{restart}/sweep{next(_SWEEPS)}/"

    def configuration_prefix(self, index: int) -> str:
        return f"{self.prefix}cfg{index}/"

    def _store_for(self, index: int) -> dist.Store:
        return dist.PrefixStore(self.configuration_prefix(index), self.store)

    def peer_failure(self, index: int) -> Callable[[], str | None]:
        """A check for run_isolated's stop_when: the reason to stop this rank's child once another rank failed."""
        store = self._store_for(index)

        def check() -> str | None:
            if not store.check([FIRST_FAILURE]):
                return None
            first = int(store.get(FIRST_FAILURE))
            return None if first == self.launch.rank else f"stopped: rank {first} failed"
        return check

    def exchange(self, index: int, answer: dict[str, Any], timeout_s: float) -> list[dict[str, Any]]:
        """Publish this rank's answer for configuration `index` and return every rank's, in rank order. A failed
        answer claims first_failure if no rank has yet (a child that timed out or died without a word)."""
        store = self._store_for(index)
        if not answer["ok"] and not answer["status"].startswith("stopped: rank"):
            store.compare_set(FIRST_FAILURE, "", str(self.launch.rank))
        store.set(f"answer/{self.launch.rank}", pickle.dumps(answer))
        keys = [f"answer/{r}" for r in range(self.launch.world_size)]
        store.wait(keys, datetime.timedelta(seconds=timeout_s))
        answers = [pickle.loads(store.get(k)) for k in keys]
        first = int(store.get(FIRST_FAILURE)) if store.check([FIRST_FAILURE]) else None
        for rank, a in enumerate(answers):
            a["first_failure"] = first
        return answers

    def finish(self, timeout_s: float = 60.0) -> None:
        """The end of the sweep: rank 0 waits until every rank is done reading the store (when rank 0's process
        hosts it, it must outlive the others' last read)."""
        store = dist.PrefixStore(self.prefix, self.store)
        store.set(f"done/{self.launch.rank}", b"1")
        if self.launch.rank == 0:
            store.wait([f"done/{r}" for r in range(self.launch.world_size)], datetime.timedelta(seconds=timeout_s))


def agreed_answer(answers: list[dict[str, Any]], merge: Callable[[list[dict]], dict]) -> dict[str, Any]:
    """One answer from every rank's: {"ok": True, "value": merge(values)} when all succeeded; otherwise the failure
    of the rank that failed first ("OOM on rank 3"), with every rank's status kept under "rank_status"."""
    if all(a["ok"] for a in answers):
        return {"ok": True, "value": merge([a["value"] for a in answers])}
    first = answers[0].get("first_failure")
    if first is None or answers[first]["ok"]:
        first = next(r for r, a in enumerate(answers) if not a["ok"])
    culprit = answers[first]
    status = culprit["status"]
    if status == "OOM" or status.startswith("timeout"):
        status = f"{status} on rank {first}"
    elif status.startswith(PEER_TIMEOUT):
        status = f"process-group timeout on rank {first}: {status.removeprefix(PEER_TIMEOUT)}"
    else:
        status = f"error on rank {first}: {status.removeprefix('error: ')}"
    out = {"ok": False, "status": status, "failed_rank": first,
           "rank_status": [a["status"] if not a["ok"] else "ok" for a in answers]}
    for key in ("traceback", "detail"):
        if culprit.get(key):
            out[key] = culprit[key]
    return out


# ---- every rank's timings in one record ----

PER_RANK_KEYS = ("host", "peak_mem_allocated_bytes", "peak_mem_reserved_bytes", "compile_s", "collectives")


def merge_rank_records(records: list[dict[str, Any]]) -> dict[str, Any]:
    """One record from every rank's (rank order). The table's figures are the slowest rank's: for each phase (and
    the step), `<phase>_ms` holds the samples of the rank with the largest mean, named in "slowest_rank"; peak
    memory and compile time are the maximum over ranks. "ranks" keeps every rank's own samples, peaks, host and
    device, so nothing measured is lost."""
    merged = {k: v for k, v in records[0].items() if not k.endswith("_ms") and k not in PER_RANK_KEYS}
    sample_keys = [k for k in records[0] if k.endswith("_ms")]
    merged["ranks"] = []
    for rank, rec in enumerate(records):
        env = rec.get("environment", {})
        merged["ranks"].append({"rank": rank, "device": env.get("device"),
                                "device_name": env.get("device_name"),
                                **{k: rec[k] for k in sample_keys + list(PER_RANK_KEYS) if k in rec}})
    merged["slowest_rank"] = {}
    for key in sample_keys:
        slowest = max(range(len(records)), key=lambda r: statistics.fmean(records[r][key]))
        merged[key] = records[slowest][key]
        merged["slowest_rank"][key.removesuffix("_ms")] = slowest
    for key in ("peak_mem_allocated_bytes", "peak_mem_reserved_bytes", "compile_s"):
        values = [rec[key] for rec in records if rec.get(key) is not None]
        if values:
            merged[key] = max(values)
    merged["world_size"] = len(records)
    return merged


# ---- --profile: time in collectives per phase ----

# Collective kinds by the name of the work that ran them: NCCL kernels on a GPU (ncclDevKernel_AllReduce_Sum_f32_..,
# ncclKernel_AllGather_RING_LL_..), and on a CPU the "gloo:<op>" ranges gloo's worker thread records. gloo runs a
# reduce-scatter as an all-reduce, so on CPU FSDP2's gradient reduce-scatter shows as all-reduce.
COLLECTIVE_KINDS = (("all-reduce", re.compile(r"all_?reduce", re.I)), ("all-gather", re.compile(r"all_?gather", re.I)),
                    ("reduce-scatter", re.compile(r"reduce_?scatter", re.I)),
                    ("broadcast", re.compile(r"broadcast", re.I)))


def collective_kind(name: str) -> str | None:
    """all-reduce / all-gather / reduce-scatter / broadcast / other collective for an NCCL kernel or a gloo range;
    None for anything that is not a collective."""
    if not (name.startswith("gloo:") or "nccl" in name.lower()):
        return None
    return next((kind for kind, pattern in COLLECTIVE_KINDS if pattern.search(name)), "other collective")


def _union_ns(intervals: list[tuple[float, float]]) -> float:
    total, end = 0.0, -math.inf
    for s, e in sorted(intervals):
        if e > end:
            total += e - max(s, end)
            end = e
    return total


def collective_rows(trace_events: list[dict[str, Any]], phases: tuple[str, ...]) -> list[dict[str, Any]]:
    """Per phase of the measured steps: milliseconds per step in each kind of collective, the wall time covered by
    any collective (their union: collectives on several streams or threads overlap) and its share of the phase.
    A collective belongs to the phase whose range contains its start. The time counts while compute may run
    beside it (FSDP2 prefetches the next block's all-gather): it is time on the wire, not time lost."""
    events = [e for e in trace_events if e.get("ph") == "X" and "dur" in e]
    measure = [(e["ts"], e["ts"] + e["dur"]) for e in events if e.get("name") == "measure"]
    ranges = {p: [(e["ts"], e["ts"] + e["dur"]) for e in events
                  if e.get("name") == p and e.get("cat") == "user_annotation"
                  and (not measure or any(s <= e["ts"] <= t for s, t in measure))] for p in phases}
    collectives = [(collective_kind(e["name"]), e["ts"], e["ts"] + e["dur"]) for e in events
                   if e.get("cat") in ("kernel", "user_annotation") and collective_kind(e["name"])]
    rows = []
    for phase in phases:
        windows = ranges[phase]
        if not windows:
            continue
        steps = len(windows)
        inside = [(kind, s, t) for kind, s, t in collectives if any(a <= s <= b for a, b in windows)]
        row: dict[str, Any] = {"phase": phase, "phase_ms": sum(b - a for a, b in windows) / steps / 1e3}
        for kind in [k for k, _ in COLLECTIVE_KINDS] + ["other collective"]:
            ms = sum(t - s for k, s, t in inside if k == kind) / steps / 1e3
            if ms:
                row[f"{kind}_ms"] = ms
        row["collective_ms"] = _union_ns([(s, t) for _, s, t in inside]) / steps / 1e3
        row["share"] = row["collective_ms"] / row["phase_ms"] if row["phase_ms"] else None
        rows.append(row)
    return rows

