"""isolation.py, sweep.py and runner.py's measuring: the child-process runner (values, failures, time limit, OOM-killer
rows), the fault hook, interleaved variants (their order, their own memory figures), and the sweep through a real
script's command line: SIGTERM, a hung child, a parent killed with SIGKILL, a closed stdout, one timed step, and
records that always carry the experiment, the environment and a status. Every run is on the CPU."""
import contextlib
import dataclasses
import json
import os
import re
import signal
import subprocess
import threading
import sys
import time
import timeit
from pathlib import Path

import pytest
import torch

import bench_attention
import bench_e2e
import common
import isolation
import mem_profile
import precision_demo
import report
import runner
import stats
import sweep
from results import read_records

HERE = Path(__file__).resolve().parent
SMALL = ["--size", "tiny", "--num-layers", "1", "--d-model", "64", "--num-heads", "4", "--d-ff", "128",
         "--vocab-size", "256", "--steps", "2", "--warmup", "0", "--device", "cpu"]


# ---- run_isolated ----


def returns_config(n):
    return {"n": n, "pid": os.getpid(), "fault": os.environ.get(sweep.FAULT_ENV), "cwd": os.getcwd()}


def server_threads():
    """The OS threads of this child's parent, the fork server (Linux: /proc)."""
    with open(f"/proc/{os.getppid()}/status") as f:
        return {"threads": next(int(line.split()[1]) for line in f if line.startswith("Threads:"))}


def raises_oom(n):
    raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")


def raises_value_error(n):
    raise ValueError("bad thing\nsecond line")


def dies(n):
    os._exit(7)


def hangs(n):
    time.sleep(120)


def test_run_isolated_returns_values_and_failures(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # after the fork server started: the child still sees this folder...
    monkeypatch.setenv(sweep.FAULT_ENV, "error:n=99")  # ...and this environment
    ok = isolation.run_isolated(returns_config, {"n": 3})
    assert ok["ok"] and ok["value"]["n"] == 3
    assert ok["value"]["pid"] != os.getpid()  # really another process
    assert ok["value"]["fault"] == "error:n=99" and ok["value"]["cwd"] == str(tmp_path)
    assert isolation.run_isolated(raises_oom, {"n": 1})["status"] == "OOM"
    assert isolation.run_isolated(raises_value_error, {"n": 1})["status"] == "error: ValueError: bad thing"
    assert isolation.run_isolated(dies, {"n": 1})["status"] == "error: child process died with exit code 7"
    assert isolation.run_isolated(raises_oom, {"n": 1}, in_process=True)["status"] == "OOM"


def test_a_hung_child_is_killed_at_its_time_limit():
    isolation.run_isolated(returns_config, {"n": 0})  # the fork server is up: only the child's time is measured
    start = time.monotonic()
    answer = isolation.run_isolated(hangs, {"n": 1}, timeout_s=1)
    assert answer == {"ok": False, "status": "timeout after 1 s"}
    assert time.monotonic() - start < 1 + isolation.STOP_GRACE_S + 5


def ignores_sigterm_and_hangs(n):
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    time.sleep(120)


def test_a_child_that_ignores_sigterm_is_killed_after_the_grace_period(monkeypatch):
    monkeypatch.setattr(isolation, "STOP_GRACE_S", 0.5)
    isolation.run_isolated(returns_config, {"n": 0})  # the fork server is up: only the child's time is measured
    start = time.monotonic()
    assert isolation.run_isolated(ignores_sigterm_and_hangs, {"n": 1}, timeout_s=1)["status"] == "timeout after 1 s"
    assert time.monotonic() - start < 10


@pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="reads the server's threads from Linux's /proc")
def test_the_fork_server_is_single_threaded_when_it_forks():
    """fork() copies only the calling thread, so a lock another thread held stays held in the child (Python 3.12+
    warns: "This process is multi-threaded, use of fork() may lead to deadlocks"). The preload starts one thread,
    OpenBLAS's (numpy's, imported by torch), which OpenBLAS's own fork handler joins before every fork: nothing
    else may run beside the server's main thread."""
    answer = isolation.run_isolated(server_threads, {})
    assert answer["ok"] and answer["value"]["threads"] == 1, answer


def test_the_fork_server_preload_never_asks_cuda_anything():
    """A CUDA driver initialised in the server before fork() would be unusable in every child."""
    probe = f"""
import traceback, torch
calls = []
for name in ("is_available", "device_count", "_lazy_init", "init", "current_device", "get_device_properties",
             "get_device_name", "mem_get_info", "synchronize"):
    real = getattr(torch.cuda, name)
    setattr(torch.cuda, name, lambda *a, _name=name, _real=real, **k: calls.append(_name) or _real(*a, **k))
for module in {[m for m in isolation.PRELOAD if m != "__main__"] + ["bench_e2e", "bench_attention", "mem_profile"]!r}:
    __import__(module)
print(calls)
"""
    out = subprocess.run([sys.executable, "-c", probe], cwd=HERE, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_a_sigkill_while_an_oom_kill_counter_rose_is_an_oom():
    killed = -signal.SIGKILL
    assert isolation.died_status(killed, (5, 0), (6, 0))["status"] == "OOM"  # system-wide counter rose
    assert isolation.died_status(killed, (None, 2), (None, 3))["status"] == "OOM"  # the cgroup's rose
    # killed by someone else (no counter moved), or unknowable: an error with the exit code, not a guess
    assert isolation.died_status(killed, (5, 0), (5, 0))["status"] == "error: child process died with exit code -9"
    assert isolation.died_status(killed, (None, None), (None, None))["status"].startswith("error")
    assert isolation.died_status(-signal.SIGSEGV, (5, 0), (6, 0))["status"].startswith("error")
    counts = isolation.oom_kill_counts()
    assert len(counts) == 2 and all(c is None or c >= 0 for c in counts)


def test_default_time_limit_is_derived_from_the_sweep():
    assert sweep.time_limit(None, 0.0) == sweep.TIMEOUT_FLOOR_S  # nothing measured yet: the floor
    assert sweep.time_limit(None, 600.0) == 6000.0  # 10x the slowest configuration so far
    assert sweep.time_limit(7.5, 600.0) == 7.5  # --timeout SECONDS
    assert sweep.time_limit(0.0, 600.0) is None  # --timeout 0: no limit


# ---- the fault hook ----


def test_injected_fault_matches_only_its_configuration(monkeypatch):
    monkeypatch.setenv(sweep.FAULT_ENV, "oom:context_length=256,dtype=fp32")
    sweep.injected_fault({"context_length": 128, "dtype": "fp32"})
    with pytest.raises(torch.OutOfMemoryError):
        sweep.injected_fault({"context_length": 256, "dtype": "fp32"})
    monkeypatch.setenv(sweep.FAULT_ENV, "oom:context_length>=512,dtype=bf16")  # every context from 512 up
    for ctx in (128, 256):
        sweep.injected_fault({"context_length": ctx, "dtype": "bf16"})
    sweep.injected_fault({"context_length": 4096, "dtype": "fp32"})
    sweep.injected_fault({"context_length": None, "dtype": "bf16"})  # not a number: no match
    for ctx in (512, 4096):
        with pytest.raises(torch.OutOfMemoryError):
            sweep.injected_fault({"context_length": ctx, "dtype": "bf16"})


def test_a_slow_fault_slows_every_op_run_under_it_and_nothing_else(monkeypatch):
    monkeypatch.setenv(sweep.FAULT_ENV, "slow:attn=sdpa")
    assert isinstance(sweep.injected_fault({"attn": "naive"}), contextlib.nullcontext)
    slow, x = sweep.injected_fault({"attn": "sdpa"}), torch.ones(4)
    for _ in range(2):  # entered around every block of the variant's steps
        start = time.monotonic()
        with slow:
            y = (x + 1) * 2  # two ops
        assert time.monotonic() - start >= 2 * sweep.SLOW_OP_S and y.tolist() == [4.0] * 4
    start = time.monotonic()
    for _ in range(10):
        x = x + 1
    assert time.monotonic() - start < 10 * sweep.SLOW_OP_S  # left: as fast as before


# ---- the sweep through bench_e2e's command line ----


def start(tmp_path, *argv, fault=None, **popen):
    env = {k: v for k, v in os.environ.items() if k != sweep.FAULT_ENV}
    if fault:
        env[sweep.FAULT_ENV] = fault
    cmd = [sys.executable, str(HERE / "bench_e2e.py"), *SMALL, *argv, "--results-dir", str(tmp_path), "--out", "s"]
    return subprocess.Popen(cmd, cwd=HERE, env=env, stderr=subprocess.PIPE, text=True, **popen)


def read_until(stream, text, timeout_s=120):
    """Lines of `stream` up to and including the first that contains `text`."""
    lines, deadline = [], time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        line = stream.readline()
        if not line:
            break
        lines.append(line)
        if text in line:
            return lines
    raise AssertionError(f"{text!r} never came; got {''.join(lines)}")


def hung_pid(lines):
    return int(next(line for line in lines if "injected hang in pid" in line).split()[-1])


def gone(pid, timeout_s=15):
    """True once `pid` has exited (reaped, or a zombie waiting for a reaper that is not us)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            with open(f"/proc/{pid}/stat") as f:
                if f.read().split(") ")[1].startswith("Z"):
                    return True
        except (FileNotFoundError, ProcessLookupError):
            return True
        time.sleep(0.1)
    return False


def test_sigterm_mid_sweep_keeps_finished_rows_in_both_files_and_stops_the_child(tmp_path):
    proc = start(tmp_path, "--context-length", "8", "16", "24", fault="hang:context_length=16",
                 stdout=subprocess.DEVNULL)
    pid = hung_pid(read_until(proc.stderr, "injected hang in pid"))
    proc.send_signal(signal.SIGTERM)
    err = proc.stderr.read()
    assert proc.wait(timeout=60) == 143, err
    assert "interrupted by SIGTERM after 1 of 3 configurations" in err and "Traceback" not in err
    assert gone(pid)
    (record,) = read_records(tmp_path / "e2e" / "s.jsonl")
    assert record["config"]["model"]["context_length"] == 8 and record["status"] in ("ok", "noisy")
    assert "step ms" in (tmp_path / "e2e" / "s.md").read_text()


def test_a_hung_child_hits_the_timeout_and_the_sweep_goes_on(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv(sweep.FAULT_ENV, "hang:context_length=16")
    code = bench_e2e.main([*SMALL, "--context-length", "8", "16", "24", "--timeout", "10",
                           "--results-dir", str(tmp_path), "--out", "t"])
    assert code == 0
    records = read_records(tmp_path / "e2e" / "t.jsonl")
    assert [r["status"] for r in records][1] == "timeout after 10 s"
    assert records[0]["status"] in ("ok", "noisy") and records[2]["status"] in ("ok", "noisy")
    captured = capsys.readouterr()
    assert "timeout after 10 s" in captured.out and "[2/3] starting tiny ctx=16" in captured.err


def test_a_child_stops_quietly_when_its_parent_is_killed(tmp_path):
    proc = start(tmp_path, "--context-length", "8", fault="hang:context_length=8", stdout=subprocess.DEVNULL)
    pid = hung_pid(read_until(proc.stderr, "injected hang in pid"))
    proc.kill()  # SIGKILL: no handler runs in the parent
    proc.wait(timeout=30)
    assert gone(pid), "the child outlived its parent"
    rest = proc.stderr.read()  # EOF once every process holding stderr has exited
    assert "Traceback" not in rest and "BrokenPipeError" not in rest


def test_a_closed_stdout_loses_no_rows(tmp_path):
    proc = start(tmp_path, "--context-length", "8", "16", stdout=subprocess.PIPE)
    proc.stdout.close()  # as `... | head -0` does: every print from now on meets a closed pipe
    err = proc.stderr.read()
    assert proc.wait(timeout=120) == 0, err
    assert "Traceback" not in err and "stdout was closed" in err
    assert len(read_records(tmp_path / "e2e" / "s.jsonl")) == 2
    assert (tmp_path / "e2e" / "s.md").read_text().count("| tiny ") == 1 + 2  # config row, two result rows


def assert_complete(records, experiment):
    for record in records:
        assert record["experiment"] == experiment
        assert record["status"]
        assert record["environment"]["torch"] == torch.__version__ and record["environment"]["device"] == "cpu"


def test_failed_and_skipped_records_carry_experiment_environment_and_status(tmp_path, monkeypatch):
    monkeypatch.setenv(sweep.FAULT_ENV, "oom:context_length=16;error:impl=naive,seq_len=16")
    bench_e2e.main([*SMALL, "--context-length", "8", "16", "24", "--in-process", "--results-dir", str(tmp_path)])
    records = read_records(next((tmp_path / "e2e").glob("*.jsonl")))
    assert [r["status"] for r in records][1:] == ["OOM", "skipped: OOM at ctx=16"]
    assert_complete(records, "bench_e2e")
    bench_attention.main(["--batch-size", "2", "--d", "8", "--iters", "2", "--warmup", "0", "--seq-len", "8", "16",
                          "--impl", "naive", "--device", "cpu", "--in-process", "--results-dir", str(tmp_path)])
    records = read_records(next((tmp_path / "attention").glob("*.jsonl")))
    assert records[1]["status"].startswith("error: RuntimeError")
    assert_complete(records, "bench_attention")
    mem_profile.main(["--size", "tiny", "--context-length", "24", "16", "--mode", "forward", "--device", "cpu",
                      "--results-dir", str(tmp_path)])
    records = read_records(next((tmp_path / "memory").glob("*.jsonl")))
    # the fault (no stage named) fails the whole configuration before either stage, as a killed child would
    assert [(r["status"], r["saved_status"]) for r in records] == [
        ("skipped: measured peaks need a CUDA device", "ok"), ("OOM", "OOM")]
    assert_complete(records, "mem_profile")
    precision_demo.main(["--count", "10", "--results-dir", str(tmp_path)])
    records = read_records(next((tmp_path / "precision").glob("precision_demo*.jsonl")))
    assert_complete(records, "precision_demo")


def test_reports_render_from_the_records_alone(tmp_path, capsys):
    """What a script printed can be rebuilt from its JSONL: same text from report.render(experiment, records, fmt)."""
    bench_e2e.main([*SMALL, "--context-length", "8", "--in-process", "--results-dir", str(tmp_path), "--out", "r"])
    records = read_records(tmp_path / "e2e" / "r.jsonl")
    assert report.render("bench_e2e", records, "github") + "\n" == (tmp_path / "e2e" / "r.md").read_text()
    records = json.loads(json.dumps(records))  # nothing but JSON
    assert "step ms" in report.render("bench_e2e", records, "plain")


# ---- run_sweep(search=True): a group's first failure of any kind ends its search ----


@dataclasses.dataclass(frozen=True)
class Probe:
    """A configuration for run_sweep: a search group and a size (label() and skip_key(), as RunConfig has)."""

    group: str
    size: int

    def label(self):
        return f"{self.group} n={self.size}"

    def skip_key(self):
        return (self.group,), "n", self.size


def fails_in_some_groups(run):
    failures = {("oom", 4): torch.OutOfMemoryError("out of memory"), ("error", 2): ValueError("broken"),
                ("hang", 4): None}
    if (run.group, run.size) in failures:
        if run.group == "hang":
            time.sleep(60)  # past the sweep's --timeout
        raise failures[(run.group, run.size)]
    return {"measured": run.size}


def test_a_search_ends_each_group_at_its_first_failure(tmp_path, capsys):
    experiment = sweep.Experiment(name="probe", measure=fails_in_some_groups, finish=lambda run, record: None,
                                   summary=lambda record: "ok", render=lambda records: "")
    runs = [Probe(group, n) for group in ("oom", "error", "hang", "fine") for n in (1, 2, 4, 8)]
    args = type("Args", (), {"in_process": False, "timeout": 5.0, "no_skip": False, "quiet": False})()
    records, code = sweep.run_sweep(experiment, runs, None, torch.device("cpu"), args, search=True)
    assert code == 0
    assert [(r["label"], r["status"].split(" ")[0]) for r in records] == [
        ("oom n=1", "ok"), ("oom n=2", "ok"), ("oom n=4", "OOM"),                  # n=8 never runs
        ("error n=1", "ok"), ("error n=2", "error:"),                             # nor 4 and 8 after an error
        ("hang n=1", "ok"), ("hang n=2", "ok"), ("hang n=4", "timeout"),          # nor 8 after a timeout
        ("fine n=1", "ok"), ("fine n=2", "ok"), ("fine n=4", "ok"), ("fine n=8", "ok")]
    assert len({r["pid"] for r in records if "pid" in r}) == len([r for r in records if "pid" in r])
    err = capsys.readouterr().err
    assert "[3/15] oom n=4: OOM" in err and "[12/12] fine n=8: ok" in err  # the count shrinks as searches end

# ---- progress: the heartbeat ----


def slow_phase(seconds):
    """A configuration whose one phase takes `seconds` (for the heartbeat through a child process)."""
    isolation.phase("slow fake phase")
    time.sleep(seconds)
    return {"slept": seconds}


def test_heartbeat_names_a_slow_phase_in_process_and_from_a_child(monkeypatch):
    monkeypatch.setattr(isolation, "HEARTBEAT_S", 0.1)
    for in_process in (True, False):
        lines = []
        answer = isolation.run_isolated(slow_phase, {"seconds": 0.6}, in_process=in_process, on_heartbeat=lines.append)
        assert answer["ok"], answer
        assert 2 <= len(lines) <= 7, lines  # about one per 0.1 s, never a flood
        assert all(line.startswith("slow fake phase... ") and line.endswith(" s") for line in lines), lines
    lines = []
    isolation.run_isolated(slow_phase, {"seconds": 0.3}, in_process=True)  # no on_heartbeat: no thread, no line
    assert not any(t.name == "heartbeat" for t in threading.enumerate())


def fake_measurement(step_s, warmup, steps, compile_first):
    """measure_steps on a fake step that sleeps: compile 3x as long, as a first torch.compile step would."""
    calls = []

    def step():  # timed as run_step times a step: a SyncTimer around the work
        with common.SyncTimer(torch.device("cpu")) as timer:
            time.sleep(step_s * (3 if compile_first and not calls else 1))
        calls.append(1)
        return {"step": timer.elapsed_s}

    return runner.measure_steps(step, torch.device("cpu"), warmup, steps, compile_first=compile_first)


def test_heartbeat_names_compile_warmup_and_steps(monkeypatch):
    lines = []
    with isolation.heartbeat(lines.append, interval_s=0.1):
        record = fake_measurement(0.15, warmup=2, steps=3, compile_first=True)
    assert len(record["step_ms"]) == 3 and record["compile_s"] >= 0.45
    said = " | ".join(lines)
    for phase in ("compiling (first step)", "warm-up 1/2", "warm-up 2/2", "step "):
        assert phase in said, said


def test_heartbeat_never_runs_inside_a_timed_step(monkeypatch):
    """Every Python event of the heartbeat thread (threading.setprofile sees each call and return, so also a wake-up
    from a timed wait) lies outside every SyncTimer span of the timed steps, although a line falls due during each
    step (interval 0.05 s, steps of 0.12 s): the lines come between the steps."""
    spans, events, lines = [], [], []
    enter, leave = common.SyncTimer.__enter__, common.SyncTimer.__exit__

    def timed_enter(self):
        out = enter(self)
        self._span_start = timeit.default_timer()
        return out

    def timed_exit(self, *exc):
        spans.append((self._span_start, timeit.default_timer()))
        return leave(self, *exc)

    def profile(frame, event, arg):
        if threading.current_thread().name == "heartbeat":
            events.append(timeit.default_timer())

    monkeypatch.setattr(common.SyncTimer, "__enter__", timed_enter)
    monkeypatch.setattr(common.SyncTimer, "__exit__", timed_exit)
    threading.setprofile(profile)
    try:
        with isolation.heartbeat(lines.append, interval_s=0.05):
            fake_measurement(0.12, warmup=1, steps=5, compile_first=False)
    finally:
        threading.setprofile(None)
    assert len(spans) == 1 + 5 and events  # the warm-up step, then the timed ones
    spans = spans[1:]
    assert sum(line.startswith("step ") for line in lines) >= 3, lines  # due in every step, said between them
    inside = [t for t in events for start, end in spans if start < t < end]
    assert not inside, f"{len(inside)} heartbeat events inside timed steps"


def test_quiet_prints_no_progress_and_no_heartbeat(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(isolation, "HEARTBEAT_S", 0.01)  # a line at nearly every chance...
    measure_saved = bench_attention.saved_tensor_bytes

    def slow_saved_tensor_bytes(*args):  # ...and a phase slow enough for one, however fast the machine
        time.sleep(0.1)
        return measure_saved(*args)

    monkeypatch.setattr(bench_attention, "saved_tensor_bytes", slow_saved_tensor_bytes)
    argv = ["--impl", "naive", "--d", "8", "--seq-len", "16", "32", "--batch-size", "1", "--iters", "2", "--warmup",
            "1", "--device", "cpu", "--in-process", "--results-dir", str(tmp_path)]
    assert bench_attention.main(argv + ["--out", "loud"]) == 0
    err = capsys.readouterr().err
    assert "[1/2] starting naive d=8 seq=16" in err and "[2/2] naive d=8 seq=32 fp32: fwd" in err
    # the heartbeat names the phase; its seconds count from the configuration's start (bench_attention checks its
    # implementation first, which can take a second on a loaded machine)
    assert re.search(r"\[1/2\] after the timed steps\.\.\. \d+ s", err) and re.search(
        r"\[2/2\] after the timed steps\.\.\. \d+ s", err), err
    assert bench_attention.main(argv + ["--out", "quiet", "--quiet"]) == 0
    captured = capsys.readouterr()
    assert "[1/2]" not in captured.err and "..." not in captured.err, captured.err
    assert "fwd ms" in captured.out  # the report itself is printed as before


def test_repeats_merge_each_phase_by_its_own_counts():
    """--interleave runs --repeats: each child's samples keep their repetition per phase, also where the timer
    decided a different count per phase (do_bench), so a paired speed-up pairs backward with backward."""
    first = {"forward_ms": [1.0, 1.0, 1.0, 1.0], "backward_ms": [2.0, 2.0], "compile_s": 3.0}
    second = {"forward_ms": [1.5, 1.5, 1.5, 1.5], "backward_ms": [3.0, 3.0], "compile_s": 0.5}
    merged, bounds = sweep.merge_repeats([first, second])
    assert merged["forward_ms"] == [1.0] * 4 + [1.5] * 4 and merged["backward_ms"] == [2.0, 2.0, 3.0, 3.0]
    assert bounds == {"forward": [[0, 4], [4, 8]], "backward": [[0, 2], [2, 4]]}
    pairing = {"group": "g", "rounds": bounds["forward"], "rounds_by_phase": bounds}
    assert stats.round_times({**merged, "pairing": pairing}, ("backward",)) == [2.0, 3.0]
