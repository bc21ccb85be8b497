"""nsys_run.sh against a fake `nsys` placed first on PATH: the command lines it runs (trace set, capture range,
environment variable, output path, overwrite rules, forced re-export), the tables it writes beside the report,
the version check, what it says when `nsys stats` quietly writes nothing, the missing-nsys message and exit
code, and the exit status of a failing profiled run. test_nsys_real.py runs it under the real nsys."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from test_kernel_tables import e2e_record, write_nsys_fixture

HERE = Path(__file__).resolve().parent
SCRIPT = HERE / "nsys_run.sh"

# The fake records each call (argv and the NSYS_NVTX_PROFILER_REGISTER_ONLY it was given) as a JSON line. `--version`
# and `stats --help-reports` answer as nsys 2023.4.4 does, or as FAKE_NSYS_VERSION and FAKE_NSYS_REPORTS say (an older
# nsys). `profile` does not run the app: it writes the report (none with FAKE_NSYS_NO_CAPTURE) and the bench_e2e
# record where the app's --results-dir points, or exits with FAKE_NSYS_APP_STATUS as nsys does when the app fails.
# `stats` prints what nsys prints and, for every --report, copies the fixture CSV to <--output>_<report>.csv (an empty
# file where the fixture has none, as nsys writes a report without data), or writes nothing for a report named in
# FAKE_NSYS_UNKNOWN, as nsys does for a report it does not know.
FAKE_NSYS = r'''#!{python}
import json, os, shutil, sys
from pathlib import Path

argv = sys.argv[1:]
with open(os.environ["FAKE_NSYS_LOG"], "a") as log:
    log.write(json.dumps({{"argv": argv, "register_only": os.environ.get("NSYS_NVTX_PROFILER_REGISTER_ONLY")}}) + "\n")

def option(name):
    return next(a.split("=", 1)[1] for a in argv if a.startswith(name + "="))

if argv == ["--version"]:
    print("NVIDIA Nsight Systems version " + os.environ.get("FAKE_NSYS_VERSION", "2023.4.4.54-234433681190v0"))
elif argv == ["stats", "--help-reports"]:
    print("\nThe following built-in reports are available:\n")
    for report in os.environ.get("FAKE_NSYS_REPORTS", "{reports}").split():
        print(f"  {{report}}[:nvtx-name][:base|:mangled] -- some report")
elif argv[0] == "profile":
    status = int(os.environ.get("FAKE_NSYS_APP_STATUS", "0"))
    if status:
        sys.exit(status)
    if not os.environ.get("FAKE_NSYS_NO_CAPTURE"):  # the app never opened "measure": nsys writes no report
        Path(option("--output") + ".nsys-rep").write_text("fake report")
    e2e = Path(argv[argv.index("--results-dir") + 1]) / "e2e"
    e2e.mkdir(parents=True)
    (e2e / "e2e.jsonl").write_text(os.environ["FAKE_NSYS_RECORD"] + "\n")
elif argv[0] == "stats":
    prefix = argv[argv.index("--output") + 1]
    fixtures = Path(os.environ["FAKE_NSYS_FIXTURES"])
    print(f"Generating SQLite file {{prefix}}.sqlite from {{prefix}}.nsys-rep")
    for i, arg in enumerate(argv):
        if arg == "--report":
            report, csv = argv[i + 1], f"{{prefix}}_{{argv[i + 1]}}.csv"
            if report in os.environ.get("FAKE_NSYS_UNKNOWN", "").split():
                print(f"Processing [{{prefix}}.sqlite] with [{{report}}] to [{{csv}}]... ")
                print(f"ERROR: Report '{{report}}' could not be found.", file=sys.stderr)
                continue
            fixture = fixtures / f"report_{{report}}.csv"
            print(f"Processing [{{prefix}}.sqlite] with [/opt/nvidia/reports/{{report}}.py] to [{{csv}}]... "
                  + ("PROCESSED" if fixture.exists() else "SKIPPED: report.sqlite does not contain CUDA kernel data."))
            if fixture.exists():
                shutil.copy(fixture, csv)
            else:
                Path(csv).write_text("")
'''
NSYS_2023_REPORTS = ("cuda_api_gpu_sum cuda_api_sum cuda_api_trace cuda_gpu_kern_sum cuda_gpu_sum cuda_gpu_trace "
                     "nvtx_kern_sum nvtx_pushpop_sum nvtx_pushpop_trace nvtx_sum osrt_sum")
NSYS_2022_REPORTS = "cudaapisum cudaapitrace gpukernsum gpusum gputrace nvtxkernsum nvtxppsum nvtxpptrace nvtxsum"


@pytest.fixture
def fake(tmp_path: Path) -> dict:
    """A bin folder holding the fake nsys, and the environment to run nsys_run.sh with it first on PATH."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    nsys = bin_dir / "nsys"
    nsys.write_text(FAKE_NSYS.format(python=sys.executable, reports=NSYS_2023_REPORTS))
    nsys.chmod(0o755)
    fixtures = tmp_path / "fixtures"
    fixtures.mkdir()
    write_nsys_fixture(fixtures)
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}", "PYTHON": sys.executable,
           "FAKE_NSYS_LOG": str(tmp_path / "calls.jsonl"), "FAKE_NSYS_FIXTURES": str(fixtures),
           "FAKE_NSYS_RECORD": json.dumps(e2e_record())}
    env.pop("NSYS", None)
    env.pop("NSYS_NVTX_PROFILER_REGISTER_ONLY", None)
    return {"env": env, "log": tmp_path / "calls.jsonl", "results": tmp_path / "results", "cwd": tmp_path}


def run_script(fake: dict, *args: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(SCRIPT), "--results-dir", str(fake["results"]), *args],
                          capture_output=True, text=True, env={**fake["env"], **env}, cwd=fake["cwd"], timeout=60)


def calls(fake: dict) -> list[dict]:
    """The profile and stats calls (not the version check's queries)."""
    logged = [json.loads(line) for line in fake["log"].read_text().splitlines()] if fake["log"].exists() else []
    return [c for c in logged if c["argv"] not in (["--version"], ["stats", "--help-reports"])]


def test_profile_and_stats_command_lines(fake: dict):
    result = run_script(fake, "tiny", "64")
    assert result.returncode == 0, result.stderr
    profile, stats = calls(fake)
    report = fake["results"] / "nsys" / "tiny_ctx64_train"
    argv = profile["argv"]
    assert argv[0] == "profile"
    app = argv.index(sys.executable)
    nsys_options = argv[1:app]
    assert {"--trace=cuda,nvtx,osrt", "--capture-range=nvtx", "--nvtx-capture=measure", "--capture-range-end=stop",
            "--env-var=NSYS_NVTX_PROFILER_REGISTER_ONLY=0", "--force-overwrite=true",
            f"--output={report}"} == set(nsys_options)  # no backtraces unless asked
    assert profile["register_only"] == "0"
    assert argv[app + 1:app + 10] == [str(HERE / "bench_e2e.py"), "--size", "tiny", "--context-length", "64",
                                      "--mode", "train", "--nvtx", "--in-process"]
    assert argv[-4] == "--results-dir" and argv[-2:] == ["--out", "e2e"]  # where the script reads the record
    assert stats["argv"][:2] == ["stats", "--force-export=true"] and stats["argv"][-1] == f"{report}.nsys-rep"
    assert {"--format", "csv", "--output", str(report)} <= set(stats["argv"])
    reports = [stats["argv"][i + 1] for i, a in enumerate(stats["argv"]) if a == "--report"]
    assert set(reports) == {"cuda_gpu_trace", "cuda_api_trace", "nvtx_pushpop_trace", "cuda_gpu_kern_sum",
                            "nvtx_kern_sum"}
    assert "nvtx_kern_sum is empty: SKIPPED" in result.stderr  # what nsys said, not a silent 0-byte file
    # the tables, printed and saved beside the report, with bench_e2e's record
    md = Path(f"{report}.md").read_text()
    assert "### 1. Phase times" in md and "### 2. Top kernels by GPU time: backward" in md
    assert "### 1. Phase times" in result.stdout and f"{report}.nsys-rep" in result.stdout
    assert json.loads(Path(f"{report}_e2e.jsonl").read_text())["status"] == "ok"


def test_mode_dtype_and_backtrace_options(fake: dict):
    result = run_script(fake, "--backtrace", "small", "128", "forward", "--", "--dtype", "bf16", "--steps", "3")
    assert result.returncode == 0, result.stderr
    argv = calls(fake)[0]["argv"]
    assert f"--output={fake['results'] / 'nsys' / 'small_ctx128_forward_bf16'}" in argv
    assert {"--python-backtrace=cuda", "--cudabacktrace=all"} <= set(argv)
    app = argv[argv.index(sys.executable):]
    assert app[app.index("--mode") + 1] == "forward"
    assert app[app.index("--in-process") + 1:][:4] == ["--dtype", "bf16", "--steps", "3"]


def test_the_handout_reaches_bench_e2e_and_names_a_2025_report(fake: dict):
    assert run_script(fake, "--handout", "2025", "xl", "64").returncode == 0
    assert run_script(fake, "xl", "64", CS336_HANDOUT="2025").returncode == 0
    assert run_script(fake, "xl", "64").returncode == 0
    profiles = [c["argv"] for c in calls(fake) if c["argv"][0] == "profile"]
    outputs = [next(a for a in argv if a.startswith("--output=")) for argv in profiles]
    nsys_dir = fake["results"] / "nsys"
    assert outputs == ([f"--output={nsys_dir / 'xl_ctx64_train_h2025'}"] * 2
                       + [f"--output={nsys_dir / 'xl_ctx64_train'}"])
    assert [argv[argv.index("--handout") + 1] for argv in profiles] == ["2025", "2025", "2026"]
    bad = run_script(fake, "xl", "64", CS336_HANDOUT="2024")
    assert bad.returncode == 2 and "got '2024'" in bad.stderr


def test_only_this_report_is_replaced(fake: dict):
    nsys_dir = fake["results"] / "nsys"
    nsys_dir.mkdir(parents=True)
    other = nsys_dir / "tiny_ctx128_train.md"
    other.write_text("another report's tables")
    stale = nsys_dir / "tiny_ctx64_train.md"
    stale.write_text("stale tables")
    assert run_script(fake, "tiny", "64").returncode == 0
    assert other.read_text() == "another report's tables"
    assert "### 1. Phase times" in stale.read_text()
    assert sorted(p.name for p in nsys_dir.iterdir() if p.name.startswith("tiny_ctx128")) == ["tiny_ctx128_train.md"]


def test_failing_profiled_run_passes_its_status_through(fake: dict):
    result = run_script(fake, "tiny", "64", FAKE_NSYS_APP_STATUS="7")
    assert result.returncode == 7
    assert "failed with exit status 7" in result.stderr
    assert [c["argv"][0] for c in calls(fake)] == ["profile"]  # no stats on a failed run


def test_a_run_that_recorded_oom_fails_after_stats(fake: dict):
    result = run_script(fake, "tiny", "64", FAKE_NSYS_RECORD=json.dumps(e2e_record(status="OOM")))
    assert result.returncode == 1 and "status 'OOM'" in result.stderr


def test_a_configuration_that_failed_before_measuring_says_why_there_is_no_report(fake: dict):
    record = e2e_record(status="OOM")
    del record["forward_ms"]
    result = run_script(fake, "tiny", "64", FAKE_NSYS_NO_CAPTURE="1", FAKE_NSYS_RECORD=json.dumps(record))
    assert result.returncode == 1 and 'wrote no' in result.stderr and '"status": "OOM"' in result.stderr
    assert [c["argv"][0] for c in calls(fake)] == ["profile"]


def test_missing_nsys_exits_2_with_install_hint(fake: dict, tmp_path: Path):
    bare_path = os.pathsep.join(p for p in ("/usr/local/bin", "/usr/bin", "/bin") if Path(p).is_dir())
    if shutil.which("nsys", path=bare_path):
        pytest.skip("a real nsys is installed on the system PATH")
    result = run_script(fake, "tiny", "64", PATH=bare_path)
    assert result.returncode == 2
    assert "Nsight Systems" in result.stderr and "install" in result.stderr.lower()
    assert "python bench_e2e.py --size tiny --context-length 64 --mode train --profile" in result.stderr
    not_binary = run_script(fake, "tiny", "64", NSYS=str(tmp_path / "no-such-nsys"))
    assert not_binary.returncode == 2 and "NSYS=" in not_binary.stderr
    assert not calls(fake)


@pytest.mark.parametrize("args, message", [
    (["tiny"], "usage"),
    (["tiny", "0"], "CTX"),
    (["tiny", "64", "inference"], "MODE"),
    (["tiny", "64", "--", "--context-length", "128"], "positional"),
    (["tiny", "64", "--", "--dtype", "fp32", "bf16"], "one --dtype"),
    (["--handout", "2024", "tiny", "64"], "must be 2026 or 2025, got '2024'"),
    (["tiny", "64", "--", "--handout", "2025"], "give --handout before --"),
])
def test_usage_errors_exit_2(fake: dict, args: list[str], message: str):
    result = run_script(fake, *args)
    assert result.returncode == 2 and message in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    assert not fake["log"].exists()  # checked before nsys is even asked its version


@pytest.mark.parametrize("args", [["../../escaped", "64"], ["tiny", "64", "--", "--dtype", "../../../escaped"]])
def test_names_that_would_leave_the_results_folder_are_refused_first(fake: dict, args: list[str]):
    nsys_dir = fake["results"] / "nsys"
    result = run_script(fake, *args)
    assert result.returncode == 2 and len(result.stderr.strip().splitlines()) == 1
    assert "SIZE must be a preset name" in result.stderr or "--dtype must be" in result.stderr
    assert not nsys_dir.exists() and not list(fake["cwd"].glob("**/escaped*")) and not fake["log"].exists()


def test_an_nsys_without_the_reports_is_refused_up_front_with_its_version(fake: dict):
    result = run_script(fake, "tiny", "64", FAKE_NSYS_VERSION="2022.4.2.1-df9881f",
                        FAKE_NSYS_REPORTS=NSYS_2022_REPORTS)
    assert result.returncode == 2
    assert "2022.4.2" in result.stderr and "cuda_gpu_trace" in result.stderr and "2023.4 or newer" in result.stderr
    assert not calls(fake)  # nothing profiled that could not be read


def test_a_report_that_nsys_stats_quietly_did_not_write_is_an_error_with_its_log_lines(fake: dict):
    result = run_script(fake, "tiny", "64", FAKE_NSYS_UNKNOWN="cuda_api_trace")
    assert result.returncode == 1
    assert "wrote no" in result.stderr and "ERROR: Report 'cuda_api_trace' could not be found." in result.stderr
    report = fake["results"] / "nsys" / "tiny_ctx64_train"
    assert not Path(f"{report}.md").exists()  # no tables from a partial export
    assert "could not be found" in Path(f"{report}.stats.log").read_text()  # the log is kept
