"""Data parallelism for `bench_e2e.py --parallel ddp|fsdp` under torchrun: DDP and FSDP2 around the model, the
ranks' agreement on each configuration's outcome, their timings merged into one record.

    torchrun --nproc-per-node 2 bench_e2e.py --parallel ddp fsdp --size tiny --device cpu   # 2 processes, gloo
    torchrun --nproc-per-node 8 bench_e2e.py --parallel fsdp --size 2.7B --dtype bf16          # 8 GPUs, NCCL

Every rank runs each configuration in a fresh child that joins a process group made for it (a PrefixStore on
torchrun's TCPStore). A failing child claims the configuration's `first_failure` key and the other ranks stop their
children; then every rank publishes its answer and reads everyone's: all reach the same row ("OOM on rank 3")
without a collective that could hang.
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
import signal
import statistics
import time
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Mapping

import torch
import torch.distributed as dist
import torch.nn as nn

import common
import results
from common import ddp_no_forward_buffer_sync, fsdp_root_reshard_after_forward, resolve_device
from kernel_tables import COLLECTIVE_KINDS, collective_kind, covered, merged
from results import ModelConfig, progress

PARALLEL = ("ddp", "fsdp")
DEFAULT_PG_TIMEOUT_S = 300.0  # a collective waiting this long for a peer fails (both backends)
FIRST_FAILURE = "first_failure"  # store key (per configuration): the rank that failed first
STOP_GRACE_S = 5.0  # after SIGTERM, how long a started rank has to exit before SIGKILL
DEATH_GRACE_S = 0.5  # how long a started rank's death may take to show after its peers' failure


# ---- the launch: what torchrun tells every process ----


@dataclass(frozen=True)
class Launch:
    rank: int
    world_size: int
    local_rank: int  # rank on this node: the GPU it uses
    local_world_size: int  # processes on this node (--nproc-per-node)
    master_addr: str  # the rendezvous TCPStore
    master_port: int


def torchrun_launch(environ: Mapping[str, str] = os.environ) -> Launch | None:
    """This process's place in a torchrun launch; None when not launched by torchrun."""
    if "RANK" not in environ or "WORLD_SIZE" not in environ:
        return None
    world_size = int(environ["WORLD_SIZE"])
    return Launch(int(environ["RANK"]), world_size, int(environ.get("LOCAL_RANK", 0)),
                  int(environ.get("LOCAL_WORLD_SIZE", world_size)), environ.get("MASTER_ADDR", "127.0.0.1"),
                  int(environ.get("MASTER_PORT", 29500)))


def is_rank_zero() -> bool:
    """True in a single process and on rank 0: the one process that prints and writes files."""
    return os.environ.get("RANK", "0") == "0"


def rank_device(device: torch.device, launch: Launch | None) -> torch.device:
    """With CUDA each rank uses the GPU of its local rank (one device per process, as NCCL requires)."""
    return torch.device("cuda", launch.local_rank) if launch is not None and device.type == "cuda" else device


# ---- the command line ----


def add_parallel_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--parallel", nargs="+", choices=PARALLEL, default=None,
                        help="under torchrun: ddp = DistributedDataParallel, fsdp = FSDP2 (fully_shard on every block "
                             "and the root); both to compare them. --batch-size is per rank")
    parser.add_argument("--fsdp-mixed-precision", nargs="+", choices=["off", "bf16"], default=None,
                        help="fsdp: bf16 = MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32); off = fp32")
    parser.add_argument("--reshard-after-forward", nargs="+", choices=["on", "off"], default=None,
                        help="fsdp: on (default) = blocks free their gathered parameters after forward; off = keep "
                             "them until backward (more memory, fewer all-gathers)")
    parser.add_argument("--pg-timeout", type=results.positive_float, default=DEFAULT_PG_TIMEOUT_S, metavar="SECONDS",
                        help="--parallel: a collective waiting longer than this for a peer fails its configuration")
    parser.add_argument("--world-size", type=results.positive_int, default=None, metavar="N",
                        help="--parallel --dry-run without torchrun: plan for N ranks (the predicted state per rank)")


def check_parallel_args(parser: argparse.ArgumentParser, args: argparse.Namespace, device: torch.device) -> int:
    """--parallel needs torchrun (or --world-size with --dry-run); a bad combination: exit 2. Returns the world
    size (1 without --parallel)."""
    launch = torchrun_launch()
    fsdp_flags = [f for f, v in (("--fsdp-mixed-precision", args.fsdp_mixed_precision),
                                 ("--reshard-after-forward", args.reshard_after_forward)) if v is not None]
    args.fsdp_mixed_precision = args.fsdp_mixed_precision or ["off"]
    args.reshard_after_forward = args.reshard_after_forward or ["on"]
    world = launch.world_size if launch else None
    results.refuse(parser, [
        (args.world_size is not None and not args.parallel, "--world-size only applies to --parallel (with --dry-run)"),
        (args.world_size is not None and not args.dry_run,
         "--world-size only plans a --parallel run with --dry-run; a real run takes its world size from torchrun: "
         f"torchrun --nproc-per-node N {parser.prog} --parallel ..."),
        (args.world_size is not None and launch is not None,
         f"--world-size plans without torchrun; this is a torchrun launch (WORLD_SIZE={world})"),
        (not args.parallel and (world or 1) > 1,
         f"launched by torchrun with WORLD_SIZE={world} but without --parallel: every rank would run the whole sweep "
         "on its own; add --parallel ddp or --parallel fsdp"),
        (bool(fsdp_flags) and "fsdp" not in (args.parallel or []), f"{' and '.join(fsdp_flags)} only apply to "
                                                                   "--parallel fsdp")])
    if not args.parallel:
        return 1
    args.parallel = list(dict.fromkeys(args.parallel))
    results.refuse(parser, [
        (args.in_process, "--parallel with --in-process is not supported yet: every rank runs each configuration in "
                          "a child process of its own, which joins that configuration's process group"),
        (device.type == "cuda" and device.index is not None,
         f"--parallel gives each rank the GPU of its LOCAL_RANK: pass --device cuda, not {device}")])
    if args.world_size is not None:  # a plan: nothing is launched
        return args.world_size
    if "fsdp" in args.parallel and (reason := common.fsdp2_unsupported(device)):
        parser.error(f"--parallel fsdp: {reason}: use --parallel ddp, a GPU or a newer torch")
    results.refuse(parser, [(launch is None, "--parallel needs torchrun, which starts one process per rank and sets "
                                             f"RANK and WORLD_SIZE: torchrun --nproc-per-node N {parser.prog} "
                                             "--parallel ... (to plan without it: --dry-run --world-size N)")])
    if device.type == "cuda" and torch.cuda.device_count() < launch.local_world_size:
        parser.error(f"--parallel on CUDA needs one GPU per process: {launch.local_world_size} processes on this "
                     f"node but {torch.cuda.device_count()} GPU(s) visible")
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    if device.type != "cuda" and launch.local_world_size > cores and launch.rank == 0:
        progress(f"warning: {launch.local_world_size} processes on this node but {cores} CPU cores: the ranks share "
                 "cores and every timing includes the others' work")
    return launch.world_size


# ---- DDP and FSDP2 around the model ----


def shard_model(model: nn.Module, parallel: str, device: torch.device, fsdp_mixed_precision: str = "off",
                reshard_after_forward: bool = True) -> nn.Module:
    """ddp: a replica per rank, gradients all-reduced in buckets (no buffer broadcast: the RoPE cache is the same
    on every rank). fsdp: fully_shard on every block, then the root; each block all-gathered before its forward
    and backward. bf16: gathered parameters and compute in bf16, master weights and reduction in fp32."""
    if parallel == "ddp":
        from torch.nn.parallel import DistributedDataParallel
        return DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None,
                                       gradient_as_bucket_view=True, **ddp_no_forward_buffer_sync())
    if why := common.fsdp2_unsupported(device):  # else an AttributeError from deep inside fully_shard
        raise RuntimeError(why)
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


# ---- the training state per rank ----


def state_bytes_per_rank(cfg: ModelConfig, parallel: str | None, world_size: int, mode: str) -> dict[str, int]:
    """Predicted bytes of the training state on the largest rank: fp32 parameters, gradients (with a backward)
    and AdamW's two moments (train); FSDP2's largest shard is ceil(rows / world_size) of dim 0. Not counted:
    activations, gathered blocks in flight, communication buffers, the CUDA context."""
    shapes = cfg.parameter_shapes
    shards = world_size if parallel == "fsdp" else 1
    params = 4 * sum(math.ceil(s[0] / shards) * math.prod(s[1:]) for s in shapes)
    grads = params if mode != "forward" else 0
    optimizer = 2 * params if mode == "train" else 0
    return {"params_bytes": params, "grads_bytes": grads, "optimizer_bytes": optimizer,
            "state_bytes": params + grads + optimizer}


# ---- the process group of one configuration (in every rank's child) ----


class PeerTimeout(RuntimeError):
    """A collective waited longer than the process-group timeout for a peer."""


PEER_TIMEOUT = "error: PeerTimeout: "  # how common.failure_status words it


@contextlib.contextmanager
def configuration_group(prefix: str, device: torch.device, timeout_s: float = DEFAULT_PG_TIMEOUT_S,
                        timeout_flag: str = "--pg-timeout") -> Iterator[Launch]:
    """Join the configuration's process group (every rank of the launch) for the block. A failure inside is
    marked under `first_failure` (if no rank was first) before it propagates; a timeout becomes a PeerTimeout
    (naming the script's `timeout_flag`)."""
    launch = torchrun_launch()
    timeout, cuda = datetime.timedelta(seconds=timeout_s), device.type == "cuda"
    client = dist.TCPStore(launch.master_addr, launch.master_port, is_master=False, timeout=timeout)  # torchrun's
    store = dist.PrefixStore(prefix, client)
    if cuda:
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if cuda else "gloo", store=dist.PrefixStore("pg/", store), rank=launch.rank,
                            world_size=launch.world_size, timeout=timeout, device_id=device if cuda else None)
    try:
        yield launch
    except BaseException as exc:
        with contextlib.suppress(Exception):  # the store may be gone if the whole launch is going down
            store.compare_set(FIRST_FAILURE, "", str(launch.rank))
        if isinstance(exc, (RuntimeError, dist.DistError)) and re.search(r"timed? ?out|timeout", str(exc), re.I):
            raise PeerTimeout(f"a collective waited more than {timeout_s:g} s for a peer ({timeout_flag})") from exc
        raise  # no destroy_process_group: a collective may be stuck; the process exits and that frees it
    dist.destroy_process_group()


def measure_on_rank(measure: Callable[..., dict], run: Any, prefix: str, device: str,
                    timeout_s: float = DEFAULT_PG_TIMEOUT_S) -> dict[str, Any]:
    """In every rank's child: join the configuration's group, `measure(run=run)`, leave; the record names the host."""
    with configuration_group(prefix, rank_device(resolve_device(device), torchrun_launch()), timeout_s):
        record = measure(run=run)
    return {**record, "host": platform.node()}


# ---- the rank processes: agreeing on a configuration's outcome ----

_SWEEPS = itertools.count()  # sweeps started in this process: part of every key prefix, the same on every rank


class RankSweep:
    """A rank process's view of the sweep: the store, a key prefix per configuration, the exchange of answers.
    Every rank runs the same configurations in the same order (they parse the same command line)."""

    def __init__(self, launch: Launch, timeout_s: float = DEFAULT_PG_TIMEOUT_S):
        self.launch = launch
        self.store, _, _ = next(dist.rendezvous("env://", timeout=datetime.timedelta(seconds=timeout_s)))
        restart = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
        self.prefix = f"bench/{os.environ.get('TORCHELASTIC_RUN_ID', 'none')}/{restart}/sweep{next(_SWEEPS)}/"

    def configuration_prefix(self, index: int) -> str:
        return f"{self.prefix}cfg{index}/"

    def peer_failure(self, index: int) -> Callable[[], str | None]:
        """For run_isolated's stop_when: the reason to stop this rank's child once another rank failed."""
        store = dist.PrefixStore(self.configuration_prefix(index), self.store)

        def check() -> str | None:
            first = int(store.get(FIRST_FAILURE)) if store.check([FIRST_FAILURE]) else self.launch.rank
            return None if first == self.launch.rank else f"stopped: rank {first} failed"
        return check

    def exchange(self, index: int, answer: dict[str, Any], timeout_s: float) -> list[dict[str, Any]]:
        """Publish this rank's answer for configuration `index`; every rank's, in rank order. A failed answer
        claims first_failure if no rank has yet (a child that timed out or died without a word)."""
        store = dist.PrefixStore(self.configuration_prefix(index), self.store)
        if not answer["ok"] and not answer["status"].startswith("stopped: rank"):
            store.compare_set(FIRST_FAILURE, "", str(self.launch.rank))
        store.set(f"answer/{self.launch.rank}", pickle.dumps(answer))  # our own processes' answers, never a file's
        keys = [f"answer/{r}" for r in range(self.launch.world_size)]
        store.wait(keys, datetime.timedelta(seconds=timeout_s))
        first = int(store.get(FIRST_FAILURE)) if store.check([FIRST_FAILURE]) else None
        return [{**pickle.loads(store.get(k)), "first_failure": first} for k in keys]

    def finish(self, timeout_s: float = 60.0) -> None:
        """Rank 0 waits until every rank is done with the store (its process may host it)."""
        store = dist.PrefixStore(self.prefix, self.store)
        store.set(f"done/{self.launch.rank}", b"1")
        if self.launch.rank == 0:
            store.wait([f"done/{r}" for r in range(self.launch.world_size)], datetime.timedelta(seconds=timeout_s))


def on_rank(status: str, rank: int) -> str:
    """A rank's failure as a row says it: "OOM on rank 3", "error on rank 1: ValueError: ..."."""
    if status == "OOM" or status.startswith("timeout"):
        return f"{status} on rank {rank}"
    if status.startswith(PEER_TIMEOUT):
        return f"process-group timeout on rank {rank}: {status.removeprefix(PEER_TIMEOUT)}"
    return f"error on rank {rank}: {status.removeprefix('error: ')}"


def first_failure_status(prefix: str, status: str, wait_s: float = 10) -> str:
    """After this rank failed inside configuration_group(prefix), which marked the first rank to fail: this rank's
    status for the others, and the first failed rank's as a row says it. A peer's failure reaches the other ranks
    only as a broken connection ("Connection closed by peer")."""
    launch = torchrun_launch()
    with contextlib.suppress(Exception):  # torchrun's store gone, or the first rank never said: this rank's own
        store = dist.PrefixStore(prefix, dist.TCPStore(launch.master_addr, launch.master_port, is_master=False,
                                                       timeout=datetime.timedelta(seconds=wait_s)))
        store.set(f"status/{launch.rank}", status)
        first = int(store.get(FIRST_FAILURE)) if store.check([FIRST_FAILURE]) else launch.rank
        return on_rank(store.get(f"status/{first}").decode(), first)
    return on_rank(status, launch.rank)


def agreed_answer(answers: list[dict[str, Any]], merge: Callable[[list[dict]], dict]) -> dict[str, Any]:
    """{"ok": True, "value": merge(values)} when every rank succeeded; else the first failure ("OOM on rank 3"),
    every rank's status kept under "rank_status"."""
    if all(a["ok"] for a in answers):
        return {"ok": True, "value": merge([a["value"] for a in answers])}
    first = answers[0].get("first_failure")
    if first is None or answers[first]["ok"]:
        first = next(r for r, a in enumerate(answers) if not a["ok"])
    culprit = answers[first]
    return {"ok": False, "status": on_rank(culprit["status"], first), "failed_rank": first,
            "rank_status": [a["status"] if not a["ok"] else "ok" for a in answers],
            **{k: culprit[k] for k in ("traceback", "detail") if culprit.get(k)}}


PER_RANK_KEYS = ("host", "peak_mem_allocated_bytes", "peak_mem_reserved_bytes", "compile_s", "collectives")


def merge_rank_records(records: list[dict[str, Any]]) -> dict[str, Any]:
    """One record from every rank's: every phase's samples are those of the rank whose step is slowest (named in
    "slowest_rank"; a phase's slowest rank alone would count a wait in a collective as well as what it waited for,
    and the phases would add up to more than the step), peaks and compile time the largest; "ranks" keeps every
    rank's own samples, peaks, host and device."""
    if "step_ms" not in records[0]:  # nothing timed (the leaderboard's behaviour check failed): rank 0's says why
        return {**records[0], "world_size": len(records)}
    merged = {k: v for k, v in records[0].items() if not k.endswith("_ms") and k not in PER_RANK_KEYS}
    sample_keys = [k for k in records[0] if k.endswith("_ms")]
    merged["ranks"] = [{"rank": rank, "device": rec.get("environment", {}).get("device"),
                        "device_name": rec.get("environment", {}).get("device_name"),
                        **{k: rec[k] for k in sample_keys + list(PER_RANK_KEYS) if k in rec}}
                       for rank, rec in enumerate(records)]
    slowest = max(range(len(records)), key=lambda r: statistics.fmean(records[r]["step_ms"]))
    merged.update({key: records[slowest][key] for key in sample_keys}, slowest_rank=slowest)
    for key in ("peak_mem_allocated_bytes", "peak_mem_reserved_bytes", "compile_s"):
        if values := [rec[key] for rec in records if rec.get(key) is not None]:
            merged[key] = max(values)
    return {**merged, "world_size": len(records)}


# ---- --profile: time in collectives per phase ----

def collective_rows(trace_events: list[dict[str, Any]], phases: tuple[str, ...]) -> list[dict[str, Any]]:
    """Per phase of the measured steps: ms per step in each kind of collective, the wall time any collective
    covers (their union: streams and threads overlap) and its share of the phase. A collective belongs to the
    phase whose range holds its start; compute may run beside it, so it is time on the wire, not time lost."""
    events = [e for e in trace_events if e.get("ph") == "X" and "dur" in e]
    measure = [(e["ts"], e["ts"] + e["dur"]) for e in events if e.get("name") == "measure"]
    collectives = [(collective_kind(e["name"]), e["ts"], e["ts"] + e["dur"]) for e in events
                   if e.get("cat") in ("kernel", "user_annotation") and collective_kind(e["name"])]
    rows = []
    for phase in phases:
        windows = [(e["ts"], e["ts"] + e["dur"]) for e in events if e.get("name") == phase and e.get("cat") ==
                   "user_annotation" and (not measure or any(s <= e["ts"] <= t for s, t in measure))]
        if not windows:
            continue
        inside = [(kind, s, t) for kind, s, t in collectives if any(a <= s <= b for a, b in windows)]
        per_step_ms = 1 / len(windows) / 1e3  # trace times are microseconds
        row: dict[str, Any] = {"phase": phase, "phase_ms": sum(b - a for a, b in windows) * per_step_ms}
        for kind in [*COLLECTIVE_KINDS, "other collective"]:
            if ms := sum(t - s for k, s, t in inside if k == kind) * per_step_ms:
                row[f"{kind}_ms"] = ms
        row["collective_ms"] = covered(merged((s, t) for _, s, t in inside)) * per_step_ms
        row["share"] = row["collective_ms"] / row["phase_ms"] if row["phase_ms"] else None
        rows.append(row)
    return rows


# ---- ranks started here: torch.multiprocessing's spawn (the handout's mp.spawn), one process per rank ----

SPAWN_HOST = "127.0.0.1"


def _spawned_rank(local_rank: int, parent: int, fn: Callable[..., None], world_size: int, port: int, messages: Any,
                  args: tuple) -> None:
    """A started rank: torchrun's variables set (configuration_group and first_failure_status read them), then
    fn(*args, publish). Ctrl-C is the parent's to act on; torch sends SIGINT when the parent dies: then exit (and
    at once if it died while this process started)."""
    signal.signal(signal.SIGINT, lambda signum, frame: os._exit(1) if os.getppid() != parent else None)
    if os.getppid() != parent:
        os._exit(1)
    os.environ.update(RANK=str(local_rank), WORLD_SIZE=str(world_size), LOCAL_RANK=str(local_rank),
                      LOCAL_WORLD_SIZE=str(world_size), MASTER_ADDR=SPAWN_HOST, MASTER_PORT=str(port))
    fn(*args, messages.put)


class SpawnedRanks:
    """`world_size` processes running fn(*args, publish) with a store hosted here (at MASTER_ADDR:MASTER_PORT for
    them); what they publish comes back through next_message. Leaving the block stops every one still running
    (SIGTERM, then SIGKILL): none outlives the script, after a failure, a timeout, Ctrl-C or SIGTERM."""

    def __init__(self, fn: Callable[..., None], args: tuple, world_size: int, store: dist.TCPStore):
        import torch.multiprocessing as mp
        ctx = mp.get_context("spawn")
        self.messages = ctx.SimpleQueue()
        saved = dict(os.environ)
        # a started interpreter runs `python -c`, which would put the working directory first on its path (a
        # student's file there could replace ours) until the parent's path arrives: PYTHONSAFEPATH keeps it out;
        # SIGINT ignored from the first instruction (spawn keeps an ignored signal), the parent stops them
        os.environ["PYTHONSAFEPATH"] = "1"
        try:
            with results.handling_signal(signal.SIGINT, signal.SIG_IGN):
                self.context = mp.start_processes(
                    _spawned_rank, (os.getpid(), fn, world_size, store.port, self.messages, args), nprocs=world_size,
                    join=False, start_method="spawn")
        finally:
            os.environ.clear()
            os.environ.update(saved)

    def next_message(self, timeout_s: float) -> dict[str, Any]:
        """The next thing a rank published; {"ok": False, "status": ...} when a rank died without a word or
        nothing came within `timeout_s`. A rank's death reaches the others as a broken connection: a failure
        that comes with a dead rank is that rank's."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if not self.messages.empty():
                message = self.messages.get()
                settle = time.monotonic() + DEATH_GRACE_S
                while not message["ok"] and (died := self.died()) is None and time.monotonic() < settle:
                    time.sleep(0.05)
                return message if message["ok"] or died is None else {**died, "index": message["index"]}
            if self.died() is not None:
                time.sleep(DEATH_GRACE_S)  # what it, or a peer, sent before it died is still on its way
                if self.messages.empty():
                    return self.died()
                continue
            time.sleep(0.02)
        return {"ok": False, "status": f"timeout after {timeout_s:g} s: no rank answered"}

    def died(self) -> dict[str, Any] | None:
        """The first rank that exited with an error (a published failure exits 0), as a failure."""
        for rank, proc in enumerate(self.context.processes):
            if (code := proc.exitcode) not in (None, 0):
                how = f"signal {signal.Signals(-code).name}" if code < 0 else f"exit code {code}"
                return {"ok": False, "status": on_rank(f"error: process died ({how})", rank)}
        return None

    def __enter__(self) -> SpawnedRanks:
        return self

    def __exit__(self, *exc: object) -> None:
        for proc in self.context.processes:
            if proc.is_alive():
                proc.terminate()
        for proc in self.context.processes:
            proc.join(STOP_GRACE_S)
            if proc.is_alive():
                proc.kill()
                proc.join()
        self.messages.close()
