"""bench_noise.py without its minutes of benchmarking: the spread arithmetic from known speed-ups, the switched
background load, a failed run among finished ones, arguments that cannot be a comparison, and kill -9."""
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import bench_noise

HERE = Path(__file__).resolve().parent


def test_spread_of_known_speed_ups():
    tight = bench_noise.spread_row("interleaved", [{"speedup": s} for s in (1.80, 1.72, 1.69, 1.75, 1.65)])
    assert tight["median"] == "1.72x" and tight["max/min"] == "1.09"
    # 1.65 / 1.72 = -4.1%, 1.80 / 1.72 = +4.7%
    assert tight["within"] == "+-5% of the median" and tight["target +-10%"] == "met"
    loose = bench_noise.spread_row("one after the other", [{"speedup": s} for s in (1.46, 1.59, 1.79, 1.38, 1.10)])
    assert loose["within"] == "+-25% of the median" and loose["target +-10%"] == "missed"  # 1.10 / 1.46 - 1
    none = bench_noise.spread_row("interleaved", [], failed=2)
    assert none["speed-ups"] == "none" and none["failed runs"] == 2 and "median" not in none


def test_the_load_switches_and_dies_with_the_run():
    with bench_noise.SwitchedLoad(1, 0.05, 0.05) as load:
        time.sleep(0.5)
        procs = list(load.procs)
        assert all(p.poll() is None for p in procs)
    assert load.switches >= 4 and all(p.poll() is not None for p in procs)


def test_a_failed_run_loses_none_of_the_others(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(bench_noise, "check_comparison", lambda args: None)
    speedups = iter([1.5, 1.8, None, 1.7])  # runs-1, steps-1, runs-2 fails, steps-2

    def fake_run(bench_args, interleave, folder, stem):
        speedup = next(speedups)
        if speedup is None:
            raise bench_noise.RunFailed("bench_e2e.py exited with 1: killed")
        return {"interleave": interleave, "speedup": speedup, "low": None, "high": None, "rounds": 0,
                "seconds": 1.0, "loadavg_1m_min": 0.5, "loadavg_1m_max": 0.7, "variants": ["tiny fp32", "tiny bf16"]}

    monkeypatch.setattr(bench_noise, "run_comparison", fake_run)
    code = bench_noise.main(["--runs", "2", "--burners", "0", "--results-dir", str(tmp_path), "--out", "n"])
    out, err = capsys.readouterr()
    assert code == 1 and "[3/4] runs: failed: bench_e2e.py exited with 1: killed" in err
    records = [json.loads(line) for line in (tmp_path / "noise" / "n.jsonl").read_text().splitlines()]
    assert [(r["interleave"], r["status"]) for r in records] == [
        ("runs", "ok"), ("steps", "ok"), ("runs", "error: bench_e2e.py exited with 1: killed"), ("steps", "ok")]
    assert "step speed-up of fp32 vs bf16" in out
    header, _, runs_row, steps_row = [[cell.strip() for cell in line.strip("|").split("|")]
                                      for line in out.splitlines() if line.startswith("|")]
    runs_cells, steps_cells = dict(zip(header, runs_row)), dict(zip(header, steps_row))
    assert runs_cells["speed-ups"] == "1.50x" and runs_cells["failed runs"] == "1"  # counted, not guessed
    assert runs_cells["target +-10%"] == "one run: no spread"
    assert steps_cells["speed-ups"] == "1.80x 1.70x" and steps_cells["failed runs"] == ""
    assert steps_cells["within"] == "+-3% of the median" and steps_cells["target +-10%"] == "met"


def test_arguments_that_are_not_a_comparison_exit_2_before_anything_is_written(tmp_path):
    result = subprocess.run([sys.executable, str(HERE / "bench_noise.py"), "--results-dir", str(tmp_path), "--",
                             "--size", "tiny", "--dtype", "fp32", "bf16", "--attn", "naive", "sdpa", "--device", "cpu"],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 2 and len(result.stderr.strip().splitlines()) == 1
    assert "exactly two variants" in result.stderr and "make 4 configurations" in result.stderr
    assert not any(tmp_path.iterdir())


def test_sigterm_kills_the_load_keeps_the_finished_runs_and_exits_143(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(bench_noise, "check_comparison", lambda args: None)
    started = []

    def fake_run(bench_args, interleave, folder, stem):
        if started:
            signal.raise_signal(signal.SIGTERM)  # mid-run: the handler bench_noise installed raises Terminated
        started.append(stem)
        return {"interleave": interleave, "speedup": 1.5, "low": None, "high": None, "rounds": 0, "seconds": 1.0,
                "loadavg_1m_min": 0.5, "loadavg_1m_max": 0.7, "variants": ["tiny fp32", "tiny bf16"]}

    monkeypatch.setattr(bench_noise, "run_comparison", fake_run)
    spinners = []
    real_load = bench_noise.SwitchedLoad
    monkeypatch.setattr(bench_noise, "SwitchedLoad", lambda *a: spinners.append(real_load(*a)) or spinners[-1])
    code = bench_noise.main(["--runs", "2", "--burners", "1", "--results-dir", str(tmp_path), "--out", "n"])
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
    """The burners (paused half the time) and the bench_e2e run with its own children all die with bench_noise."""
    proc = subprocess.Popen([sys.executable, str(HERE / "bench_noise.py"), "--runs", "1", "--burners", "1", "--on",
                             "0.2", "--off", "0.2", "--results-dir", str(tmp_path), "--", "--size", "tiny",
                             "--context-length", "16", "--num-layers", "1", "--dtype", "fp32", "bf16", "--steps",
                             "100000", "--device", "cpu"], stderr=subprocess.DEVNULL)
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
