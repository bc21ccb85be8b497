"""runner.py and runner.py's measuring: the child-process runner (values, failures, time limit, OOM-killer rows),
interleaved variants (their order, their own memory figures), and the sweep through a real script's command line
with faults from test_faults_helper: every failure a row, SIGTERM, a parent killed with SIGKILL, impostor modules
in the working directory, a closed stdout, one timed step, and records that always carry the experiment, the
environment and a status. Every run is on the CPU."""
import argparse
import dataclasses
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

import bench_attention
import bench_e2e
import mem_profile
import precision_demo
import report
import results
import runner
import test_faults_helper
from results import read_records

HERE = Path(__file__).resolve().parent
SMALL = ["--size", "tiny", "--num-layers", "1", "--d-model", "64", "--num-heads", "4", "--d-ff", "128",
         "--vocab-size", "256", "--steps", "2", "--warmup", "0", "--device", "cpu"]


# ---- run_isolated ----


def returns_config(n):
    return {"n": n, "pid": os.getpid(), "mark": os.environ.get("TEST_MARK"), "cwd": os.getcwd(), "path": sys.path[:2]}


def server_threads():
    """The OS threads of this child's parent, the fork server, and its command line (Linux: /proc)."""
    with open(f"/proc/{os.getppid()}/status") as f, open(f"/proc/{os.getppid()}/cmdline", "rb") as cmdline:
        return {"threads": next(int(line.split()[1]) for line in f if line.startswith("Threads:")),
                "cmdline": cmdline.read().decode(errors="replace")}


def fails(kind):
    test_faults_helper.fault(kind)
    if kind == "value":
        raise ValueError("bad thing\nsecond line")
    if kind == "died":
        os._exit(7)


def test_run_isolated_returns_values_and_failures(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # after the fork server started: the child still sees this folder...
    monkeypatch.setenv("TEST_MARK", "seen")  # ...and this environment
    ok = runner.run_isolated(returns_config, {"n": 3})
    assert ok["ok"] and ok["value"]["n"] == 3 and ok["value"]["pid"] != os.getpid()  # really another process
    assert ok["value"]["mark"] == "seen" and ok["value"]["cwd"] == str(tmp_path)
    assert ok["value"]["path"][0] == str(HERE) and str(tmp_path) not in ok["value"]["path"]  # ours first, not cwd's
    statuses = {kind: runner.run_isolated(fails, {"kind": kind})["status"] for kind in ("oom", "value", "died", "exit")}
    assert statuses == {"oom": "OOM", "value": "error: ValueError: bad thing", "exit": "error: SystemExit: 0",
                        "died": "error: child process died with exit code 7"}
    for kind, status in [("oom", "OOM"), ("exit", "error: SystemExit: 0")]:  # in this process alike
        assert runner.run_isolated(fails, {"kind": kind}, in_process=True)["status"] == status
    assert runner.run_isolated(os.chdir, {"path": "/"}, in_process=True)["ok"] and os.getcwd() == str(tmp_path)


def test_a_hung_child_is_killed_at_its_time_limit_even_when_it_ignores_sigterm(monkeypatch):
    runner.run_isolated(returns_config, {"n": 0})  # the fork server is up: only the child's time is measured
    start = time.monotonic()
    assert runner.run_isolated(fails, {"kind": "hang"}, timeout_s=1) == {"ok": False, "status": "timeout after 1 s"}
    assert time.monotonic() - start < 1 + runner.STOP_GRACE_S + 5
    monkeypatch.setattr(runner, "STOP_GRACE_S", 0.5)
    start = time.monotonic()
    assert runner.run_isolated(ignores_sigterm_and_hangs, {"n": 1}, timeout_s=1)["status"] == "timeout after 1 s"
    assert time.monotonic() - start < 10


def test_a_ctrl_c_while_a_child_starts_waits_for_the_start_then_stops_it(monkeypatch, capfd):
    """Interrupted mid-start, the new child would read half its arguments and print the server's traceback."""
    runner.run_isolated(returns_config, {"n": 0})
    real_start = runner.multiprocessing.context.ForkServerProcess.start

    def start_with_a_ctrl_c(proc):
        os.kill(os.getpid(), signal.SIGINT)  # Python runs the handler at its next instruction: inside start()
        real_start(proc)
        started.append(proc)

    started = []
    monkeypatch.setattr(runner.multiprocessing.context.ForkServerProcess, "start", start_with_a_ctrl_c)
    with pytest.raises(KeyboardInterrupt):
        runner.run_isolated(fails, {"kind": "hang"})
    (proc,) = started
    assert proc.exitcode is not None and "Traceback" not in capfd.readouterr().err


def ignores_sigterm_and_hangs(n):
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    time.sleep(120)


@pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="reads the server's threads from Linux's /proc")
def test_the_fork_server_is_single_threaded_when_it_forks():
    """fork() copies only the calling thread, so a lock another thread held stays held in the child. The preload
    starts one thread, OpenBLAS's, which its own fork handler joins before every fork: nothing else may run."""
    answer = runner.run_isolated(server_threads, {})
    assert answer["ok"] and answer["value"]["threads"] == 1, answer
    # pytest is the program here, not one of our scripts: multiprocessing's own server, started afresh
    assert "from multiprocessing.forkserver import main" in answer["value"]["cmdline"], answer


def test_the_fork_server_preload_never_asks_cuda_anything():
    """A CUDA driver initialised in the server before fork() would be unusable in every child."""
    probe = f"""
import torch
calls = []
for name in ("is_available", "device_count", "_lazy_init", "init", "current_device", "get_device_properties",
             "get_device_name", "mem_get_info", "synchronize"):
    real = getattr(torch.cuda, name)
    setattr(torch.cuda, name, lambda *a, _name=name, _real=real, **k: calls.append(_name) or _real(*a, **k))
for module in {[m for m in runner.PRELOAD if m != "__main__"] + ["bench_e2e", "bench_attention", "mem_profile"]!r}:
    __import__(module)
print(calls)
"""
    out = subprocess.run([sys.executable, "-c", probe], cwd=HERE, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_a_sigkill_while_an_oom_kill_counter_rose_is_an_oom():
    killed = -signal.SIGKILL
    assert runner.died_status(killed, (5, 0), (6, 0))["status"] == "OOM"  # system-wide counter rose
    assert runner.died_status(killed, (None, 2), (None, 3))["status"] == "OOM"  # the cgroup's rose
    # killed by someone else (no counter moved), or unknowable: an error with the exit code, not a guess
    assert runner.died_status(killed, (5, 0), (5, 0))["status"] == "error: child process died with exit code -9"
    assert runner.died_status(killed, (None, None), (None, None))["status"].startswith("error")
    assert runner.died_status(-signal.SIGSEGV, (5, 0), (6, 0))["status"].startswith("error")
    counts = runner.oom_kill_counts()
    assert len(counts) == 2 and all(c is None or c >= 0 for c in counts)


def test_default_time_limit_is_derived_from_the_sweep():
    assert runner.time_limit(None, 0.0) == runner.TIMEOUT_FLOOR_S  # nothing measured yet: the floor
    assert runner.time_limit(None, 600.0) == 6000.0  # 10x the slowest configuration so far
    assert runner.time_limit(7.5, 600.0) == 7.5  # --timeout SECONDS
    assert runner.time_limit(0.0, 600.0) is None  # --timeout 0: no limit


# ---- the sweep through bench_e2e's command line ----


def start(tmp_path, *argv, model=None, cwd=HERE, **popen):
    cmd = [sys.executable, str(HERE / "bench_e2e.py"), *SMALL, *argv, "--results-dir", str(tmp_path), "--out", "s"]
    if model:
        cmd += ["--model", f"test_faults_helper:{model}"]
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    return subprocess.Popen(cmd, cwd=cwd, env=env, stderr=subprocess.PIPE, text=True, **popen)


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
    return int(next(line for line in lines if "hanging in pid" in line).split()[-1])


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


def test_every_failure_in_a_child_is_a_row_and_later_configurations_run(tmp_path, capsys):
    faults = "error16_hang24_kill32_exit40_long48_oom64"
    contexts = ["8", "16", "24", "32", "40", "48", "56", "64", "72"]
    # --timeout: the hang's wait, and room for the others on a loaded machine (each takes ~0.5 s at idle)
    code = bench_e2e.main([*SMALL, "--context-length", *contexts, "--timeout", "8", "--model",
                           f"faulty=test_faults_helper:{faults}", "--results-dir", str(tmp_path), "--out", "f"])
    assert code == 0
    records = read_records(tmp_path / "e2e" / "f.jsonl")
    statuses = [r["status"] for r in records]
    assert statuses[0] in ("ok", "noisy") and statuses[6] in ("ok", "noisy"), statuses
    assert statuses[1:6] + statuses[7:] == [
        "error: RuntimeError: injected failure", "timeout after 8 s", "error: child process died with exit code -9",
        "error: SystemExit: 0", f"error: RuntimeError: {test_faults_helper.LONG_MESSAGE}", "OOM",
        "skipped: OOM at ctx=64"]
    assert f"{test_faults_helper.LONG_MESSAGE} (" in capsys.readouterr().err  # whole on stderr too


def test_sigterm_mid_sweep_keeps_finished_rows_in_both_files_and_stops_the_child(tmp_path):
    proc = start(tmp_path, "--context-length", "8", "16", "24", model="hang16", stdout=subprocess.DEVNULL)
    pid = hung_pid(read_until(proc.stderr, "hanging in pid"))
    proc.send_signal(signal.SIGTERM)
    err = proc.stderr.read()
    assert proc.wait(timeout=60) == 143, err
    assert "interrupted by SIGTERM after 1 of 3 configurations" in err and "Traceback" not in err
    assert gone(pid)
    (record,) = read_records(tmp_path / "e2e" / "s.jsonl")
    assert record["config"]["model"]["context_length"] == 8 and record["status"] in ("ok", "noisy")
    assert "step ms" in (tmp_path / "e2e" / "s.md").read_text()


def parent_of(pid):
    with open(f"/proc/{pid}/stat") as f:
        return int(f.read().split(") ")[1].split()[1])


def test_a_child_stops_quietly_when_its_parent_is_killed(tmp_path):
    """The script's fork server is the script itself, forked (no second torch import): both go with it."""
    proc = start(tmp_path, "--context-length", "8", model="hang8", stdout=subprocess.DEVNULL)
    pid = hung_pid(read_until(proc.stderr, "hanging in pid"))
    server = parent_of(pid)
    with open(f"/proc/{server}/cmdline", "rb") as f:
        assert parent_of(server) == proc.pid and b"bench_e2e.py" in f.read()
    proc.kill()  # SIGKILL: no handler runs in the parent
    proc.wait(timeout=30)
    assert gone(pid), "the child outlived its parent"
    assert gone(server), "the fork server outlived its parent"
    rest = proc.stderr.read()  # EOF once every process holding stderr has exited
    assert "Traceback" not in rest and "BrokenPipeError" not in rest


IMPOSTOR = "open({marker!r}, 'a').write(__name__ + ' ')\nraise SystemExit('impostor')\n"


def test_a_students_folder_replaces_none_of_ours_and_a_closed_stdout_loses_no_rows(tmp_path):
    """A student's folder holding files named as ours: every process (this one, the fork server, the children)
    uses ours; their code is imported only where --model names it, from that folder. The same run with its stdout
    closed, as `... | head -0` does: every print from then on meets a closed pipe, and no row is lost."""
    student, marker = tmp_path / "student", tmp_path / "imported"
    student.mkdir()
    for name in ("common", "model", "model_config", "optim", "runner", "sweep", "results", "stats", "parallel",
                 "cli", "search", "report"):
        (student / f"{name}.py").write_text(IMPOSTOR.format(marker=str(marker)))
    (student / "my_lm.py").write_text("from test_faults_helper import sleep999 as make\n")
    proc = start(tmp_path, "--context-length", "8", "16", "--model", "ours", "mine=my_lm:make", cwd=student,
                 stdout=subprocess.PIPE)
    proc.stdout.close()
    err = proc.stderr.read()
    assert proc.wait(timeout=300) == 0, err
    assert "Traceback" not in err and "stdout was closed" in err
    assert not marker.exists(), marker.read_text()
    assert [r["status"] in ("ok", "noisy") for r in read_records(tmp_path / "e2e" / "s.jsonl")] == [True] * 4, err
    main_table = (tmp_path / "e2e" / "s.md").read_text().split("## Floors")[0]
    assert main_table.count("| tiny ") == 1 + 4  # config row, four result rows


def assert_complete(records, experiment):
    for record in records:
        assert record["experiment"] == experiment
        assert record["status"]
        assert record["environment"]["torch"] == torch.__version__ and record["environment"]["device"] == "cpu"


def test_failed_and_skipped_records_carry_experiment_environment_and_status(tmp_path):
    bench_e2e.main([*SMALL, "--context-length", "8", "16", "24", "--in-process", "--model", "test_faults_helper:oom16",
                    "--results-dir", str(tmp_path)])
    records = read_records(next((tmp_path / "e2e").glob("*.jsonl")))
    assert [r["status"] for r in records][1:] == ["OOM", "skipped: OOM at ctx=16"]
    assert_complete(records, "bench_e2e")
    bench_attention.main(["--batch-size", "2", "--d", "8", "--iters", "2", "--warmup", "0", "--seq-len", "8", "16",
                          "--impl", "test_faults_helper:impl_error16", "--device", "cpu", "--in-process",
                          "--results-dir", str(tmp_path)])
    records = read_records(next((tmp_path / "attention").glob("*.jsonl")))
    assert records[1]["status"].startswith("error: ") and "injected failure" in records[1]["status"]
    assert_complete(records, "bench_attention")
    mem_profile.main(["--size", "tiny", "--context-length", "24", "16", "--mode", "forward", "--device", "cpu",
                      "--model", "test_faults_helper:oom16", "--results-dir", str(tmp_path)])
    records = read_records(next((tmp_path / "memory").glob("*.jsonl")))
    assert [r["saved_status"] for r in records] == ["ok", "OOM"]
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


# ---- run_configurations(search=True): a group's first failure of any kind ends its search ----


@dataclasses.dataclass(frozen=True)
class Probe:
    """A configuration for run_configurations: a search group and a size (label() and skip_key(), as RunConfig has)."""

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


def test_a_search_ends_each_group_at_its_first_failure(capsys):
    runs = [Probe(group, n) for group in ("oom", "error", "hang", "fine") for n in (1, 2, 4, 8)]
    args = argparse.Namespace(in_process=False, timeout=5.0, no_skip=False, quiet=False)
    records, code = runner.run_configurations(fails_in_some_groups, runs, None, args, name="probe",
                                             device=torch.device("cpu"), search=True)
    assert code == 0
    assert [(r["label"], r["status"].split(" ")[0]) for r in records] == [
        ("oom n=1", "ok"), ("oom n=2", "ok"), ("oom n=4", "OOM"),                  # n=8 never runs
        ("error n=1", "ok"), ("error n=2", "error:"),                             # nor 4 and 8 after an error
        ("hang n=1", "ok"), ("hang n=2", "ok"), ("hang n=4", "timeout"),          # nor 8 after a timeout
        ("fine n=1", "ok"), ("fine n=2", "ok"), ("fine n=4", "ok"), ("fine n=8", "ok")]
    assert len({r["pid"] for r in records if "pid" in r}) == len([r for r in records if "pid" in r])
    err = capsys.readouterr().err
    assert "[3/15] oom n=4: OOM" in err and "[12/12] fine n=8: ok" in err  # the count shrinks as searches end


def measure_variant(run):
    return {"step_ms": [float(run.size)]}


def measure_variants_together(runs):
    if any(run.group == "oom" for run in runs):
        raise torch.OutOfMemoryError("out of memory beside the others")
    return [{"step_ms": [float(run.size)], "together": len(runs)} for run in runs]


def test_a_comparison_runs_in_one_child_or_each_alone_when_that_fails():
    plan = [[Probe("fine", 1), Probe("fine", 2)], [Probe("oom", 1), Probe("oom", 2)], Probe("single", 1)]
    args = argparse.Namespace(in_process=True, timeout=None, no_skip=False, quiet=True, interleave="steps")
    records, code = runner.run_configurations(measure_variant, plan, None, args, name="pairs",
                                             device=torch.device("cpu"), measure_variants=measure_variants_together)
    assert code == 0 and [r["label"] for r in records] == ["fine n=1", "fine n=2", "oom n=1", "oom n=2", "single n=1"]
    assert [r.get("together") for r in records] == [2, 2, None, None, None]
    assert all(r["interleave_fallback"].endswith("failed (OOM)") for r in records[2:4])
    args.interleave, args.repeats = "runs", 2  # each variant in children of its own, whole runs A B | B A
    records, _ = runner.run_configurations(measure_variant, plan[:1], None, args, name="pairs",
                                          device=torch.device("cpu"), measure_variants=measure_variants_together)
    assert [r["step_ms"] for r in records] == [[1.0, 1.0], [2.0, 2.0]]
    assert [r["pairing"]["rounds"] for r in records] == [[[0, 1], [1, 2]]] * 2


def sleeps_together(runs):
    time.sleep(0.3)
    return [{"step_ms": [1.0]} for _ in runs]


def test_a_comparison_says_its_time_as_shared_by_its_variants(capsys):
    args = argparse.Namespace(in_process=True, timeout=None, no_skip=False, quiet=False, interleave="steps")
    runner.run_configurations(measure_variant, [[Probe("a", 1), Probe("b", 1)]], None, args, name="pairs",
                              device=torch.device("cpu"), measure_variants=sleeps_together)
    took = [line.rsplit("(", 1)[1] for line in capsys.readouterr().err.splitlines() if ": ok (" in line]
    assert len(took) == 2 and all(t.endswith(" s for 2 variants)") and float(t.split()[0]) >= 0.3 for t in took)


# ---- progress: the heartbeat ----


def two_phases(seconds):
    """A configuration with two untimed phases of `seconds` each, then timed steps."""
    for name in ("building", "compiling"):
        runner.phase(name)
        time.sleep(seconds)
    for i in range(3):
        with runner.timed_phase(f"step {i + 1}/3"):
            time.sleep(0.01)
    return {}


def test_the_heartbeat_names_each_phase_from_the_parent(monkeypatch):
    monkeypatch.setattr(runner, "HEARTBEAT_S", 0.1)
    lines = []
    start = time.monotonic()
    assert runner.run_isolated(two_phases, {"seconds": 0.5}, on_heartbeat=lines.append)["ok"]
    # about one per 0.1 s, never a flood (a loaded machine starts the child later: more lines, as many seconds)
    assert 4 <= len(lines) <= (time.monotonic() - start) / 0.1 + 1, lines
    assert any(line.startswith("building... ") for line in lines) and lines[-1].startswith(("compiling", "step"))
    runner.phase("outside a sweep: nothing")


def test_quiet_prints_no_progress(tmp_path, capsys):
    argv = ["--impl", "naive", "--d", "8", "--seq-len", "16", "32", "--batch-size", "1", "--iters", "2", "--warmup",
            "1", "--device", "cpu", "--in-process", "--results-dir", str(tmp_path)]
    assert bench_attention.main(argv + ["--out", "loud"]) == 0
    err = capsys.readouterr().err
    assert "[1/2] starting naive d=8 seq=16" in err and "[2/2] naive d=8 seq=32 fp32: fwd" in err
    assert bench_attention.main(argv + ["--out", "quiet", "--quiet"]) == 0
    captured = capsys.readouterr()
    assert "[1/2]" not in captured.err and "fwd ms" in captured.out  # the report itself is printed as before


def test_repeats_merge_each_phase_by_its_own_counts():
    """--interleave runs --repeats: each child's samples keep their repetition per phase, also where the timer
    decided a different count per phase (do_bench), so a paired speed-up pairs backward with backward."""
    first = {"forward_ms": [1.0, 1.0, 1.0, 1.0], "backward_ms": [2.0, 2.0], "compile_s": 3.0}
    second = {"forward_ms": [1.5, 1.5, 1.5, 1.5], "backward_ms": [3.0, 3.0], "compile_s": 0.5}
    merged, bounds = runner.merge_repeats([first, second])
    assert merged["forward_ms"] == [1.0] * 4 + [1.5] * 4 and merged["backward_ms"] == [2.0, 2.0, 3.0, 3.0]
    assert bounds == {"forward": [[0, 4], [4, 8]], "backward": [[0, 2], [2, 4]]}
    pairing = {"group": "g", "rounds": bounds["forward"], "rounds_by_phase": bounds}
    assert results.round_times({**merged, "pairing": pairing}, ("backward",)) == [2.0, 3.0]


def test_stopping_a_process_group_outlives_no_member_of_it():
    """nsys exits at SIGTERM before the run it profiles: what is left of the group is killed after the grace."""
    stubborn = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print(flush=True); time.sleep(60)"
    leader = subprocess.Popen([sys.executable, "-c", f"import subprocess, sys, time; subprocess.Popen([sys.executable, "
                               f"'-c', {stubborn!r}]); time.sleep(60)"], start_new_session=True)
    deadline = time.monotonic() + 60
    while len(subprocess.run(["pgrep", "-g", str(leader.pid)], capture_output=True, text=True).stdout.split()) < 2:
        assert time.monotonic() < deadline
        time.sleep(0.1)
    time.sleep(0.5)  # the member's handler is set
    results.stop_process_group(leader, grace_s=1)
    assert leader.returncode == -signal.SIGTERM
    gone = time.monotonic() + 5  # the killed member, an orphan, is reaped by init
    while subprocess.run(["pgrep", "-g", str(leader.pid)], capture_output=True).returncode == 0:
        assert time.monotonic() < gone, "a member of the group outlived it"
        time.sleep(0.1)


def test_sighup_stops_a_run_as_sigterm_does_except_under_nohup():
    previous = signal.signal(signal.SIGHUP, signal.SIG_DFL)  # as in a terminal, also when the tests run under nohup
    with results.sigterm_as_interrupt():
        with pytest.raises(results.Terminated) as stop:
            signal.raise_signal(signal.SIGHUP)
    assert results.signal_number(stop.value) == signal.SIGHUP and results.signal_name(stop.value) == "SIGHUP"
    signal.signal(signal.SIGHUP, signal.SIG_IGN)  # nohup
    try:
        with results.sigterm_as_interrupt():
            signal.raise_signal(signal.SIGHUP)  # ignored: the run goes on
            assert signal.getsignal(signal.SIGHUP) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGHUP, previous)
