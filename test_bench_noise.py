"""Does a comparison survive a busy machine? One bench_e2e comparison run several times with its variants
measured one after the other (each in its own process: --interleave runs) and as many times interleaved (one
process, timed steps alternating A B B A: --interleave steps, the default), while a background load switches
on and off; then the spread of the step speed-ups each way.

    python3 test_bench_noise.py                            # fp32 vs bf16, 5 runs each way, load 5 s on / off
    python3 test_bench_noise.py --runs 3 --on 10 --off 10  # fewer runs, a slower load cycle
    python3 test_bench_noise.py -- --size small --attn naive sdpa --steps 20   # any bench_e2e comparison

The load: --burners processes spinning Python, stopped and continued together (SIGSTOP / SIGCONT). Each run is
a bench_e2e.py subprocess writing its files under results/noise/<stem>_runs/ (report.py re-renders them).
Every process started here dies with this one, even on kill -9 (Linux: PR_SET_PDEATHSIG). A failed run is a
row.

A check of the toolkit's method, not a study experiment, so it lives with the tests: the tests below check it
without its minutes of benchmarking (the spread arithmetic from known speed-ups, the switched background load,
a failed run among finished ones, arguments that cannot be a comparison, and kill -9).
"""
from __future__ import annotations

import argparse
import ctypes
import itertools
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import results
from results import ResultFiles, render_table

HERE = Path(__file__).resolve().parent
# the study's mixed-precision question on the smallest preset at context 128, 20 rounds per interleaved run
DEFAULT_COMPARISON = ["--size", "tiny", "--context-length", "128", "--dtype", "fp32", "bf16", "--warmup", "2",
                      "--steps", "20", "--device", "cpu"]
TARGET = 0.10  # the interleaved speed-ups should agree within +-10%
PR_SET_PDEATHSIG = 1  # <linux/prctl.h>


def dies_with(parent: int):
    """A preexec_fn: the child is SIGKILLed when `parent` dies however it dies (a stopped child too); where
    prctl is missing, the burners' own getppid() poll still ends them once they run."""
    prctl = ctypes.CDLL(None).prctl if sys.platform.startswith("linux") else None  # looked up before the fork

    def arm() -> None:
        if prctl is not None:
            prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        if os.getppid() != parent:  # the parent died before the prctl
            os._exit(1)
    return arm


class SwitchedLoad:
    """`count` processes spinning Python, switched all on / all off every `on_s` / `off_s` s by a thread."""

    def __init__(self, count: int, on_s: float, off_s: float):
        self.on_s, self.off_s, self.switches = on_s, off_s, 0
        spin = f"import os\nwhile os.getppid() == {os.getpid()}: pass"
        self.procs = [subprocess.Popen([sys.executable, "-c", spin], preexec_fn=dies_with(os.getpid()))
                      for _ in range(count)]
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._switch, daemon=True, name="load-switch")

    def _switch(self) -> None:
        for sig, wait_s in itertools.cycle(((signal.SIGSTOP, self.on_s), (signal.SIGCONT, self.off_s))):
            if self._done.wait(wait_s):
                return
            for proc in self.procs:
                if proc.poll() is None:
                    os.kill(proc.pid, sig)
            self.switches += 1

    def __enter__(self) -> SwitchedLoad:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._done.set()
        self._thread.join()
        for proc in self.procs:
            proc.kill()  # SIGKILL ends a stopped process too
            proc.wait()


class RunFailed(Exception):
    """One bench_e2e run of the comparison gave no speed-up."""


def bench_e2e(args: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(HERE / "bench_e2e.py"), *args], cwd=HERE, capture_output=True,
                          text=True, preexec_fn=dies_with(os.getpid()))


def check_comparison(bench_args: list[str]) -> str | None:
    """Why these arguments are not one comparison of two variants (bench_e2e --dry-run's answer), or None."""
    done = bench_e2e([*bench_args, "--dry-run"])
    if done.returncode != 0:
        lines = done.stderr.strip().splitlines()
        return lines[-1] if lines else f"bench_e2e.py --dry-run exited with {done.returncode}"
    planned = re.search(r"dry run: (\d+) configurations? would run", done.stdout)
    if planned is None or int(planned.group(1)) != 2:
        return (f"bench_noise needs a comparison of exactly two variants (e.g. --dtype fp32 bf16); these "
                f"arguments make {planned.group(1) if planned else 'an unknown number of'} configurations")
    return None


def run_comparison(bench_args: list[str], interleave: str, folder: Path, stem: str) -> dict[str, Any]:
    """One bench_e2e run: the second variant's step speed-up over the first (results.speedup: paired by round
    when interleaved), its interval and the load it ran under."""
    start = time.monotonic()
    done = bench_e2e([*bench_args, "--interleave", interleave, "--quiet", "--results-dir", str(folder),
                      "--out", stem])
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["(nothing on stderr)"])[-1]
        raise RunFailed(f"bench_e2e.py exited with {done.returncode}: {last}")
    jsonl = folder / "e2e" / f"{stem}.jsonl"
    records = results.read_records(jsonl)
    if len(records) != 2 or not all(results.finished(r) for r in records):
        raise RunFailed("not two finished variants: " + ", ".join(r["status"] for r in records))
    found = results.speedup(records[0], records[1], ("step",))
    loads = [r["load"][when]["loadavg_1m"] for r in records for when in ("before", "after") if "load" in r]
    return {"interleave": interleave, "jsonl": str(jsonl), "speedup": found.ratio, "low": found.low,
            "high": found.high, "rounds": found.rounds, "seconds": time.monotonic() - start,
            "loadavg_1m_min": min(loads), "loadavg_1m_max": max(loads),
            "variants": [r["label"] for r in records]}


def spread_row(how: str, runs: list[dict[str, Any]], failed: int = 0) -> dict[str, Any]:
    """The speed-ups of one way of measuring, their median and how far the extremes lie from it."""
    speedups = [r["speedup"] for r in runs]
    row = {"measured": how, "speed-ups": " ".join(f"{s:.2f}x" for s in speedups) or "none",
           "failed runs": failed or None}
    if not speedups:
        return row
    median = statistics.median(speedups)
    worst = max(abs(s / median - 1) for s in speedups)
    return {**row, "median": f"{median:.2f}x", "min": f"{min(speedups):.2f}x", "max": f"{max(speedups):.2f}x",
            "max/min": f"{max(speedups) / min(speedups):.2f}", "within": f"+-{worst:.0%} of the median",
            f"target +-{TARGET:.0%}": ("met" if worst <= TARGET else "missed") if len(speedups) > 1
            else "one run: no spread"}


def build_parser() -> argparse.ArgumentParser:
    p = results.ArgParser(description=__doc__.split("\n\n")[0],
                          formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--runs", type=results.positive_int, default=5, help="runs of the comparison each way")
    p.add_argument("--on", type=results.positive_float, default=5.0, metavar="SECONDS",
                   help="load on for this long")
    p.add_argument("--off", type=results.positive_float, default=5.0, metavar="SECONDS",
                   help="then off for this long")
    p.add_argument("--burners", type=results.non_negative_int, default=os.cpu_count() or 1,
                   help="processes of background load (0: none, to see the machine's own noise)")
    results.add_output_args(p, default_stem="noise-<UTC time>")
    p.add_argument("bench_args", nargs="*", metavar="-- BENCH_E2E_ARGS",
                   help="the comparison, as bench_e2e.py's arguments (default: "
                        f"{' '.join(DEFAULT_COMPARISON)})")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        with results.sigterm_as_interrupt():  # SIGTERM ends the run as Ctrl-C does
            return measure(args)
    except KeyboardInterrupt as stop:  # the load is already killed; the finished runs are on disk
        results.progress("test_bench_noise.py: interrupted; the runs that finished are in its .jsonl")
        return 128 + results.signal_number(stop)


def measure(args: argparse.Namespace) -> int:
    bench_args = args.bench_args or DEFAULT_COMPARISON
    if (refused := check_comparison(bench_args)) is not None:  # before any file or background load exists
        results.exit_usage_error(refused)
    files = ResultFiles(args.results_dir, "noise", args.out, "noise")
    runs, failures = [], []
    with SwitchedLoad(args.burners, args.on, args.off) as load:
        for i in range(args.runs):  # the two ways alternate, so the load's history is the same for both
            for interleave in ("runs", "steps"):
                position = f"[{len(runs) + len(failures) + 1}/{2 * args.runs}] {interleave}"
                try:
                    run = run_comparison(bench_args, interleave, files.path("_runs"), f"{interleave}-{i + 1}")
                except RunFailed as exc:
                    failures.append({"interleave": interleave, "index": i + 1, "status": f"error: {exc}"})
                    files.append_record({"experiment": "bench_noise", **failures[-1]})
                    results.progress(f"{position}: failed: {exc}")
                    continue
                run.update(index=i + 1, burners=args.burners, on_s=args.on, off_s=args.off,
                           bench_args=bench_args)
                runs.append(run)
                files.append_record({"experiment": "bench_noise", "status": "ok", **run})
                results.progress(f"{position}: {run['speedup']:.2f}x ({run['seconds']:.0f} s, load "
                                 f"{run['loadavg_1m_min']:.1f}-{run['loadavg_1m_max']:.1f})")
    if not runs:
        results.progress(f"test_bench_noise.py: no run gave a speed-up ({failures[-1]['status']})")
        return 1
    rows = [spread_row(how, [r for r in runs if r["interleave"] == way],
                       sum(f["interleave"] == way for f in failures))
            for way, how in (("runs", "one after the other (--interleave runs)"),
                             ("steps", "interleaved (--interleave steps)"))]
    a, b = (label.split() for label in runs[0]["variants"])  # the words that tell the two variants apart
    names = " vs ".join(" ".join(w for w in mine if w not in other) or "?"
                        for mine, other in ((a, b), (b, a)))
    heading = (f"step speed-up of {names} (bench_e2e.py {' '.join(bench_args)}), {args.runs} runs each way, "
               f"{args.burners} background processes switched {args.on:g} s on / {args.off:g} s off "
               f"({load.switches} switches); {os.cpu_count()} CPUs")
    columns = [c for c in rows[0] | rows[1] if any(row.get(c) is not None for row in rows)]
    files.publish(lambda fmt: heading + "\n\n" + render_table(rows, columns, fmt), args.fmt)
    return 1 if failures else 0


# ---- the tests ----

THIS = sys.modules[__name__]  # the tool above, for monkeypatch
TOOL = [sys.executable, str(HERE / "test_bench_noise.py")]  # the tool's command line


def test_spread_of_known_speed_ups():
    tight = spread_row("interleaved", [{"speedup": s} for s in (1.80, 1.72, 1.69, 1.75, 1.65)])
    assert tight["median"] == "1.72x" and tight["max/min"] == "1.09"
    # 1.65 / 1.72 = -4.1%, 1.80 / 1.72 = +4.7%
    assert tight["within"] == "+-5% of the median" and tight["target +-10%"] == "met"
    loose = spread_row("one after the other", [{"speedup": s} for s in (1.46, 1.59, 1.79, 1.38, 1.10)])
    assert loose["within"] == "+-25% of the median" and loose["target +-10%"] == "missed"  # 1.10 / 1.46 - 1
    none = spread_row("interleaved", [], failed=2)
    assert none["speed-ups"] == "none" and none["failed runs"] == 2 and "median" not in none


def test_the_load_switches_and_dies_with_the_run():
    with SwitchedLoad(1, 0.05, 0.05) as load:
        time.sleep(0.5)
        procs = list(load.procs)
        assert all(p.poll() is None for p in procs)
    assert load.switches >= 4 and all(p.poll() is not None for p in procs)


def test_a_failed_run_loses_none_of_the_others(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(THIS, "check_comparison", lambda args: None)
    speedups = iter([1.5, 1.8, None, 1.7])  # runs-1, steps-1, runs-2 fails, steps-2

    def fake_run(bench_args, interleave, folder, stem):
        speedup = next(speedups)
        if speedup is None:
            raise RunFailed("bench_e2e.py exited with 1: killed")
        return {"interleave": interleave, "speedup": speedup, "low": None, "high": None, "rounds": 0,
                "seconds": 1.0, "loadavg_1m_min": 0.5, "loadavg_1m_max": 0.7,
                "variants": ["tiny fp32", "tiny bf16"]}

    monkeypatch.setattr(THIS, "run_comparison", fake_run)
    code = main(["--runs", "2", "--burners", "0", "--results-dir", str(tmp_path), "--out", "n"])
    out, err = capsys.readouterr()
    assert code == 1 and "[3/4] runs: failed: bench_e2e.py exited with 1: killed" in err
    records = [json.loads(line) for line in (tmp_path / "noise" / "n.jsonl").read_text().splitlines()]
    assert [(r["interleave"], r["status"]) for r in records] == [
        ("runs", "ok"), ("steps", "ok"), ("runs", "error: bench_e2e.py exited with 1: killed"),
        ("steps", "ok")]
    assert "step speed-up of fp32 vs bf16" in out
    header, _, runs_row, steps_row = [[cell.strip() for cell in line.strip("|").split("|")]
                                      for line in out.splitlines() if line.startswith("|")]
    runs_cells, steps_cells = dict(zip(header, runs_row)), dict(zip(header, steps_row))
    assert runs_cells["speed-ups"] == "1.50x" and runs_cells["failed runs"] == "1"  # counted, not guessed
    assert runs_cells["target +-10%"] == "one run: no spread"
    assert steps_cells["speed-ups"] == "1.80x 1.70x" and steps_cells["failed runs"] == ""
    assert steps_cells["within"] == "+-3% of the median" and steps_cells["target +-10%"] == "met"


def test_arguments_that_are_not_a_comparison_exit_2_before_anything_is_written(tmp_path):
    result = subprocess.run([*TOOL, "--results-dir", str(tmp_path), "--", "--size", "tiny", "--dtype", "fp32",
                             "bf16", "--attn", "naive", "sdpa", "--device", "cpu"],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 2 and len(result.stderr.strip().splitlines()) == 1
    assert "exactly two variants" in result.stderr and "make 4 configurations" in result.stderr
    assert not any(tmp_path.iterdir())


def test_sigterm_kills_the_load_keeps_the_finished_runs_and_exits_143(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(THIS, "check_comparison", lambda args: None)
    started = []

    def fake_run(bench_args, interleave, folder, stem):
        if started:
            signal.raise_signal(signal.SIGTERM)  # mid-run: the handler main() installed raises Terminated
        started.append(stem)
        return {"interleave": interleave, "speedup": 1.5, "low": None, "high": None, "rounds": 0,
                "seconds": 1.0, "loadavg_1m_min": 0.5, "loadavg_1m_max": 0.7,
                "variants": ["tiny fp32", "tiny bf16"]}

    monkeypatch.setattr(THIS, "run_comparison", fake_run)
    spinners = []
    real_load = SwitchedLoad
    monkeypatch.setattr(THIS, "SwitchedLoad", lambda *a: spinners.append(real_load(*a)) or spinners[-1])
    code = main(["--runs", "2", "--burners", "1", "--results-dir", str(tmp_path), "--out", "n"])
    assert code == 143 and "interrupted" in capsys.readouterr().err
    assert all(p.poll() is not None for p in spinners[0].procs)  # the background load did not outlive the run
    assert len((tmp_path / "noise" / "n.jsonl").read_text().splitlines()) == 1  # the finished run, kept
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL  # and the handler is the process's own again


def descendants(pid):
    """Every process below `pid` (Linux /proc), by parent pid."""
    children = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    children.setdefault(int(f.read().rsplit(") ", 1)[1].split()[1]), []).append(int(entry))
            except (FileNotFoundError, ProcessLookupError, IndexError):
                pass
    found, todo = [], [pid]
    while todo:
        kids = children.get(todo.pop(), [])
        found += kids
        todo += kids
    return found


def alive(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(") ", 1)[1][0] != "Z"
    except (FileNotFoundError, ProcessLookupError):
        return False


def test_kill_9_leaves_no_process_running(tmp_path):
    """The burners (paused half the time) and the bench_e2e run with its children all die with the tool."""
    proc = subprocess.Popen([*TOOL, "--runs", "1", "--burners", "1", "--on", "0.2", "--off", "0.2",
                             "--results-dir", str(tmp_path), "--", "--size", "tiny", "--context-length", "16",
                             "--num-layers", "1", "--dtype", "fp32", "bf16", "--steps", "100000", "--device",
                             "cpu"], stderr=subprocess.DEVNULL)
    deadline, tree = time.monotonic() + 120, []
    while time.monotonic() < deadline and len(tree) < 4:  # a burner, bench_e2e, its fork server and a child
        time.sleep(0.5)
        tree = descendants(proc.pid)
    assert len(tree) >= 4, tree
    proc.kill()
    proc.wait()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and any(alive(pid) for pid in tree):
        time.sleep(0.2)
    assert not [pid for pid in tree if alive(pid)]


if __name__ == "__main__":
    sys.exit(main())
