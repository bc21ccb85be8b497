"""Issue #28: run from a folder of impostors of the toolkit's modules, every script uses its own.

Each command runs in its own temporary working directory holding a hostile `model.py`, `optim.py`,
... that writes a marker file and raises when imported. The commands start together (one torch
import each, in parallel) and each test checks one: it succeeded and no marker file was written.
"""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
IMPOSTORS = ["model", "optim", "common", "results", "runner", "sweep", "isolation", "report", "cli",
             "stats"]
IMPOSTOR = """import pathlib
pathlib.Path(__file__).with_name("IMPORTED-" + __name__).write_text("")
raise RuntimeError("the hostile {name}.py in the working directory was imported")
"""
HELP = ["bench_e2e.py", "bench_attention.py", "mem_profile.py", "precision_demo.py",
        "toy_autocast.py", "report.py", "kernel_tables.py", "test_bench_noise.py"]
RUNS = {"precision_demo run": ["precision_demo.py", "--count", "10"],
        "bench_e2e run": ["bench_e2e.py", "--size", "tiny", "--context-length", "16", "--steps",
                          "1", "--warmup", "0", "--device", "cpu"]}
COMMANDS = {f"{script} --help": [script, "--help"] for script in HELP} | RUNS
# What fails today: the fork server (Python 3.11) imports `common` from the working directory.
FAILS_TODAY: set[str] = set()


@pytest.fixture(scope="module")
def finished(tmp_path_factory) -> dict[str, tuple[subprocess.CompletedProcess, list[str]]]:
    """Every command, started together, each in its own hostile folder: name -> (the finished
    process, the marker files its folder holds afterwards)."""
    started = {}
    for name, (script, *args) in COMMANDS.items():
        cwd = tmp_path_factory.mktemp("hostile")
        for module in IMPOSTORS:
            (cwd / f"{module}.py").write_text(IMPOSTOR.format(name=module))
        if name in RUNS:
            args += ["--results-dir", str(cwd / "results")]
        started[name] = (cwd, subprocess.Popen([sys.executable, str(HERE / script), *args], cwd=cwd,
                                               stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                               text=True))
    done = {}
    for name, (cwd, proc) in started.items():
        stdout, stderr = proc.communicate(timeout=180)
        done[name] = (subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr),
                      sorted(p.name for p in cwd.glob("IMPORTED-*")))
    return done


@pytest.mark.parametrize("name", [
    pytest.param(name, marks=pytest.mark.xfail(
        name in FAILS_TODAY, strict=False,
        reason="issue #28: the shared-run engineer makes module loading safe"))
    for name in COMMANDS])
def test_the_toolkits_own_modules_are_used(finished, name):
    proc, markers = finished[name]
    assert markers == [], f"impostors imported: {markers}\n{proc.stderr[-2000:]}"
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "usage:" in proc.stdout if name.endswith("--help") else "wrote " in proc.stdout
