"""How fast is a collective here? all_reduce (and all_gather_into_tensor and reduce_scatter_tensor, which FSDP
uses) of float32 tensors over sizes and world sizes, timed as the handout does, with nccl-tests' algorithm and bus
bandwidth, the share of the link's peak and a latency + bandwidth fit. Answers distributed_communication_single_node.

    python3 bench_comm.py                      # all_reduce, 1 MB to 1 GB, 2, 4, 6 ranks (NCCL on GPUs, else gloo)
    python3 bench_comm.py --op all_reduce all_gather_into_tensor reduce_scatter_tensor --plot
    python3 bench_comm.py --sizes-mb 0.01 0.1 1 10 --world-sizes 2 --reps 5   # a quick CPU run (gloo), ~6 s
    torchrun --nproc-per-node 4 bench_comm.py  # under torchrun: its world, 4 ranks

Each world size's ranks are started here with torch.multiprocessing's spawn (the handout's mp.spawn); each rank
joins a process group (gloo on CPU, NCCL one GPU per rank), runs every op and size, and rank 0 gathers every rank's
times. docs/bench_comm.md says more.
"""
from __future__ import annotations

import argparse
import dataclasses
import itertools
import os
import platform
import statistics
import sys
import traceback
import uuid
from typing import Any, Callable

import torch
import torch.distributed as dist

import common
import parallel
import report
import results
from common import SyncTimer, failure_status
from results import ResultFiles, finished, is_oom_status, progress

# --- arguments ---

OPS = ("all_reduce", "all_gather_into_tensor", "reduce_scatter_tensor")
BACKENDS = ("gloo", "nccl")  # gloo: CPU tensors; nccl: one GPU per rank
MB = 10**6  # bytes: sizes and GB/s are decimal, as nccl-tests prints them
FLOAT32_BYTES = 4
WORLD_SIZES = (2, 4, 6)  # the handout's
DEFAULT_TIMEOUT_S = 300.0
START_GRACE_S = 60.0  # more for the first answer of started ranks: each imports torch


@dataclasses.dataclass(frozen=True)
class CommRun:
    op: str
    size_mb: float  # the full buffer: all_reduce's tensor, all_gather's output, reduce_scatter's input
    world_size: int
    backend: str
    warmup: int = 5
    reps: int = 10
    timeout_s: float = DEFAULT_TIMEOUT_S  # a collective waiting longer for a peer fails the row

    def label(self) -> str:
        return f"{self.op} {self.size_mb:g} MB x{self.world_size} {self.backend}"

    @property
    def numel(self) -> int:
        """float32 elements of the full buffer: a multiple of the world size (each rank's shard equal), at least
        one per rank."""
        per_rank = max(1, round(self.size_mb * MB) // FLOAT32_BYTES // self.world_size)
        return per_rank * self.world_size


def parse_args(argv: list[str] | None = None) -> tuple[argparse.Namespace, list[CommRun]]:
    p = results.ArgParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--op", nargs="+", choices=OPS, default=["all_reduce"],
                   help="collective(s): all_reduce (DDP's), all_gather_into_tensor and reduce_scatter_tensor "
                        "(FSDP's); sizes are the full buffer, as nccl-tests counts them")
    p.add_argument("--sizes-mb", nargs="+", type=results.positive_float, default=[1.0, 10.0, 100.0, 1000.0],
                   metavar="MB", help="float32 buffer sizes in MB (10^6 bytes); the latency + bandwidth fit "
                        "needs three or more, the largest past the latency (gloo on a CPU: 10 MB)")
    p.add_argument("--world-sizes", nargs="+", type=results.positive_int, default=None, metavar="N",
                   help="processes per configuration, at least 2; on NCCL at most the GPUs seen: larger are "
                        f"dropped, with a note (default: {' '.join(map(str, WORLD_SIZES))}; under torchrun its "
                        "WORLD_SIZE)")
    p.add_argument("--backend", nargs="+", choices=BACKENDS, default=None,
                   help="gloo (CPU tensors) or nccl (one GPU per rank) (default: nccl when torch sees a GPU, "
                        "else gloo)")
    p.add_argument("--warmup", type=results.warmup_count, default=5,
                   help="untimed collectives before the timed ones (the handout asks for at least 5)")
    p.add_argument("--reps", type=results.step_count, default=10,
                   help="timed collectives per row (op, size, world size)")
    p.add_argument("--timeout", type=results.positive_float, default=DEFAULT_TIMEOUT_S, metavar="SECONDS",
                   help="a collective waiting longer than this for a peer fails its row (the process-group "
                        f"timeout); ranks that say nothing for this long plus {START_GRACE_S:g} s are stopped")
    results.add_output_args(p, default_stem="comm-<UTC time>")
    report.add_columns_and_plot_args(p, "bench_comm")
    results.add_dry_run_arg(p)
    args = p.parse_args(argv)
    report.columns_or_exit(p, args.columns, report.COMM_COLUMNS)
    launch = parallel.torchrun_launch()
    cuda = torch.cuda.is_available()
    args.backend = list(dict.fromkeys(args.backend or ["nccl" if cuda else "gloo"]))
    world = launch.world_size if launch else None
    results.refuse(p, [
        (min(args.world_sizes or WORLD_SIZES) < 2, "--world-sizes: a collective needs at least 2 ranks, got "
                                                   f"{min(args.world_sizes or WORLD_SIZES)}"),
        ("nccl" in args.backend and not cuda, "--backend nccl needs CUDA GPUs, and torch sees none: use gloo"),
        (launch is not None and len(args.backend) > 1, "under torchrun every rank runs one backend: pick one"),
        (world == 1, "under torchrun with 1 process: a collective needs at least 2 (--nproc-per-node 2)"),
        (launch is not None and args.world_sizes not in (None, [world]),
         f"under torchrun the world is torchrun's ({world} ranks): drop --world-sizes, or run without torchrun "
         "to have the script start the ranks"),
        (launch is not None and "nccl" in args.backend and torch.cuda.device_count() < launch.local_world_size,
         f"NCCL needs a GPU per rank: {launch.local_world_size if launch else 0} processes on this node, "
         f"{torch.cuda.device_count()} GPU(s) seen")])
    args.world_sizes = [world] if launch else list(dict.fromkeys(args.world_sizes or WORLD_SIZES))
    args.sizes_mb = sorted(dict.fromkeys(args.sizes_mb))
    args.notes = []
    if "nccl" in args.backend and launch is None and (too_big := [n for n in args.world_sizes
                                                                  if n > torch.cuda.device_count()]):
        args.notes.append(f"nccl: world size(s) {', '.join(map(str, too_big))} dropped: NCCL needs a GPU per rank "
                          f"and torch sees {torch.cuda.device_count()}")
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    if "gloo" in args.backend and max(args.world_sizes) > cores:
        args.notes.append(f"gloo: {max(args.world_sizes)} processes on {cores} CPU cores: the ranks share cores, "
                          "and every time includes waiting for a core")
    results.check_tensor_sizes(p, {"buffer": (round(max(args.sizes_mb) * MB) // FLOAT32_BYTES,)})
    runs = [CommRun(op, size, n, backend, args.warmup, args.reps, args.timeout)
            for backend, n, op, size in itertools.product(args.backend, args.world_sizes, args.op, args.sizes_mb)
            if backend == "gloo" or launch or n <= torch.cuda.device_count()]
    if not runs:
        p.error(args.notes[0] + ": nothing left to run")
    return args, runs


# --- the bandwidths, as nccl-tests defines them ---

# nccl-tests, doc/PERFORMANCE.md: algbw = S / t, S the size of the operation (all_reduce: the buffer; all_gather:
# the gathered output, n x each rank's part; reduce_scatter: the input, n x each rank's result; src/*.cu's
# GetBw: count * typesize * nranks for these two). busbw = algbw x the factor that makes it the traffic of one
# rank's link, comparable across world sizes and with the hardware's bandwidth: all_reduce 2(n-1)/n (a
# reduce-scatter then an all-gather), all_gather and reduce_scatter (n-1)/n.
def bus_factor(op: str, world_size: int) -> float:
    n = world_size
    return 2 * (n - 1) / n if op == "all_reduce" else (n - 1) / n


def algbw_gbps(size_bytes: int, seconds: float) -> float:
    return size_bytes / seconds / 1e9


def busbw_gbps(op: str, world_size: int, size_bytes: int, seconds: float) -> float:
    return algbw_gbps(size_bytes, seconds) * bus_factor(op, world_size)


# --- build: one collective on this rank's buffers ---


def collective(op: str, numel: int, device: torch.device) -> Callable[[], Any]:
    """The call timed: the buffers made once, outside the clock (all_gather: each rank's part into the full
    output; reduce_scatter: the full input into each rank's part)."""
    world = dist.get_world_size()
    full = torch.ones(numel, dtype=torch.float32, device=device)
    part = torch.ones(numel // world, dtype=torch.float32, device=device)
    if op == "all_reduce":
        return lambda: dist.all_reduce(full)
    # torch 2.13 renamed both (the old names warn): the same collectives, the same arguments
    if op == "all_gather_into_tensor":
        gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
        return lambda: gather(full, part)
    scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
    return lambda: scatter(part, full)


# --- measure: on every rank ---


def time_collective(run: CommRun, device: torch.device) -> list[float]:
    """ms of each timed call on this rank: every rank leaves a barrier, then the clock runs from a synchronised
    device to a synchronised device (SyncTimer: torch.cuda.synchronize on a GPU, whose NCCL calls only enqueue)."""
    call, timer, samples = collective(run.op, run.numel, device), SyncTimer(device), []
    for _ in range(run.warmup):
        call()
    common.synchronize(device)
    for _ in range(run.reps):
        dist.barrier()
        with timer:
            call()
        samples.append(timer.elapsed_s * 1e3)
    return samples


def measure_on_rank(runs: list[CommRun], prefix: str, publish: Callable[[dict], None]) -> None:
    """Every rank: join the process group, each run timed and every rank's times gathered (all_gather_object);
    rank 0 publishes a row per run. A failure: every rank publishes the row's status, which names the rank
    that failed first (the store says which)."""
    launch, index = parallel.torchrun_launch(), 0
    device = (torch.device("cuda", launch.local_rank) if runs[0].backend == "nccl" else torch.device("cpu"))
    try:
        with parallel.configuration_group(prefix, device, runs[0].timeout_s, "--timeout"):
            env = {**common.environment(device), "host": platform.node()}
            for index, run in enumerate(runs):
                load = common.machine_load(device)
                samples = time_collective(run, device)
                every_rank: list[Any] = [None] * dist.get_world_size()
                dist.all_gather_object(every_rank, samples)
                if launch.rank == 0:
                    publish({"ok": True, "index": index, "value": {
                        "environment": env, "rank_ms": every_rank, "bytes": run.numel * FLOAT32_BYTES,
                        "load": {"before": load, "after": common.machine_load(device)}}})
    except Exception as exc:  # noqa: BLE001 - a failure is a row; its status names the first rank that failed
        status = parallel.first_failure_status(prefix, failure_status(exc))
        publish({"ok": False, "index": index, "status": status, "traceback": traceback.format_exc()})


# --- the sweep: a configuration's ranks started here, or torchrun's ---


class Sweep:
    """The rows so far: each written as it arrives (JSON line, the report rewritten), a failure as its row."""

    def __init__(self, args: argparse.Namespace, files: ResultFiles | None, total: int):
        self.args, self.files, self.total, self.records = args, files, total, []
        self.oom_at: dict[tuple, float] = {}  # (backend, world size, op) -> the smallest size that ran out

    def add(self, run: CommRun, answer: dict[str, Any]) -> None:
        record = {"experiment": "bench_comm", "config": dataclasses.asdict(run), "label": run.label(),
                  "status": "ok", **answer.get("value", {}), "notes": self.args.notes}
        record.update({k: v for k, v in answer.items() if k in ("status", "traceback")})
        finish_record(run, record)
        self.records.append(record)
        if is_oom_status(record["status"]):
            key = (run.backend, run.world_size, run.op)
            self.oom_at[key] = min(self.oom_at.get(key, run.size_mb), run.size_mb)
        if self.files is not None:
            self.files.append_record(record)
            self.files.write_report(lambda fmt: report.render("bench_comm", self.records, fmt, self.args.columns),
                                    self.args.fmt)
        said = (f"median {record['ms_median']:.3f} ms, busbw {record['busbw_gbps']:.2f} GB/s" if finished(record)
                else record["status"])
        progress(f"[{len(self.records)}/{self.total}] {run.label()}: {said}")

    def skipped(self, run: CommRun) -> bool:
        """After an OOM, the larger sizes of that op and world size would need more: a row each, not run."""
        smallest = self.oom_at.get((run.backend, run.world_size, run.op))
        if smallest is None or run.size_mb <= smallest:
            return False
        self.add(run, {"status": f"skipped: OOM at {smallest:g} MB"})
        return True

    def spawned(self, runs: list[CommRun], store: dist.TCPStore) -> None:
        """One configuration's runs in ranks started here; after a failure, the rest in ranks started afresh."""
        todo = list(runs)
        while todo := [run for run in todo if not self.skipped(run)]:
            batch, prefix, arrived, rest = todo, f"comm/{uuid.uuid4().hex[:12]}/", 0, []
            with parallel.SpawnedRanks(measure_on_rank, (batch, prefix), batch[0].world_size, store) as ranks:
                wait_s = batch[0].timeout_s + START_GRACE_S  # a collective's own timeout speaks first
                while arrived < len(batch):
                    answer = ranks.next_message(wait_s)
                    index = answer.get("index", arrived)  # a rank that died or went silent: the row under way
                    self.add(batch[index], answer)
                    if not answer["ok"]:  # the process group is broken: what is left starts afresh
                        rest = batch[arrived:index] + batch[index + 1:]
                        break
                    arrived = index + 1
            todo = rest

    def in_torchrun(self, runs: list[CommRun]) -> None:
        """Under torchrun this process is a rank: the runs here, rank 0 keeping the rows. After a failure the
        ranks cannot start again: the rest are rows that say so."""
        failed: list[int] = []

        def publish(answer: dict[str, Any]) -> None:
            if parallel.is_rank_zero():
                self.add(runs[answer["index"]], answer)
                failed.extend([] if answer["ok"] else [answer["index"]])

        attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")  # keys of a restarted launch start empty
        measure_on_rank(runs, f"comm/{os.environ.get('TORCHELASTIC_RUN_ID', 'none')}/{attempt}/", publish)
        for run in runs[failed[0] + 1:] if failed and parallel.is_rank_zero() else []:
            self.add(run, {"status": "not run: an earlier row failed, and torchrun's ranks cannot start again "
                                     "(without torchrun the script starts them afresh)"})


# --- report: a row's statistics and bandwidths ---


def finish_record(run: CommRun, record: dict[str, Any]) -> None:
    """On a measured row: the median, quartiles and range over every rank's every timed call, the bandwidths of
    the median, and the share of the link's peak where the GPU's link is known."""
    if not finished(record) or "rank_ms" not in record:
        return
    samples = [ms for rank in record["rank_ms"] for ms in rank]
    p25, median, p75 = statistics.quantiles(samples, n=4, method="inclusive") if len(samples) > 1 else samples * 3
    seconds = median / 1e3
    record.update(ms_median=median, ms_p25=p25, ms_p75=p75, ms_min=min(samples), ms_max=max(samples),
                  algbw_gbps=algbw_gbps(record["bytes"], seconds),
                  busbw_gbps=busbw_gbps(run.op, run.world_size, record["bytes"], seconds))
    peak, link = (common.link_peak_gbps(record["environment"]["device_name"]) if run.backend == "nccl"
                  else (None, None))
    record.update(link=link, link_peak_gbps=peak, of_link_peak=record["busbw_gbps"] / peak if peak else None)


def main(argv: list[str] | None = None) -> int:
    args, runs = parse_args(argv)
    rank0 = parallel.is_rank_zero()  # under torchrun, the one process that prints and writes
    for note in args.notes if rank0 else []:
        progress(f"note: {note}")
    configurations = {key: list(group) for key, group in
                      itertools.groupby(runs, key=lambda run: (run.backend, run.world_size))}
    if args.dry_run:
        return 0 if not rank0 else results.print_dry_run(
            [f"{backend}, {n} ranks: " + ", ".join(run.label().removesuffix(f" x{n} {backend}") for run in group)
             for (backend, n), group in configurations.items()],
            preamble=f"settings: float32, {args.warmup} warm-up and {args.reps} timed calls per row, every rank's "
                     f"times gathered; process-group timeout {args.timeout:g} s", notes=args.notes)
    launch = parallel.torchrun_launch()
    files = ResultFiles(args.results_dir, "comm", args.out, "comm") if rank0 else None
    sweep = Sweep(args, files, len(runs))
    code = 0
    with results.sigterm_as_interrupt():
        try:
            if launch is not None:
                sweep.in_torchrun(runs)
            else:  # one store for the sweep, hosted here; each configuration's ranks under a prefix of their own
                store = dist.TCPStore(parallel.SPAWN_HOST, 0, is_master=True, wait_for_workers=False)
                for group in configurations.values():
                    sweep.spawned(group, store)
        except KeyboardInterrupt as exc:
            how, code = results.signal_name(exc), 128 + results.signal_number(exc)
            kept = f"; finished rows are in {files.jsonl}" if sweep.records and files else ""
            progress(f"interrupted by {how} after {len(sweep.records)} of {len(runs)} rows{kept}")
    if files is None:
        return code
    if not sweep.records:
        files.release()
        return code
    published = report.publish("bench_comm", sweep.records, files, args.fmt, args.columns, plot=args.plot)
    return code or published


if __name__ == "__main__":
    sys.exit(main())
