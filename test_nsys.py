"""nsys_run.sh against a fake `nsys` placed first on PATH: the command lines it runs (trace set, capture range,
environment variable, output path, overwrite rules, forced re-export), the tables it writes beside the report,
the version check, what it says when `nsys stats` quietly writes nothing, the missing-nsys message and exit
code, and the exit status of a failing profiled run; several configurations in one call (one nsys run each,
reuse of existing reports, --force, skipping after an OOM, the summary, --dry-run, the handouts' plans), the
flags passed through to nsys profile, an nsys with the old report names, every spelling of the options, arguments
bench_e2e refuses (exit 2, nothing left behind), the NVTX library of a CPU run, and the run's output naming the
kept files. test_nsys_real.py runs it under the real nsys."""
from __future__ import annotations

import ctypes
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import nsys_tool
from nsys_tool import NVTX_LIBRARY_ENV, OLD_REPORT_NAMES
from results import read_records
from test_kernel_tables import e2e_record, write_nsys_fixture

HERE = Path(__file__).resolve().parent
SCRIPT = HERE / "nsys_run.sh"

# The fake records each call (argv and the NSYS_NVTX_PROFILER_REGISTER_ONLY it was given) as a JSON line. `--version`,
# `stats --help-reports` and `profile --help` answer as nsys 2023.4.4 does (which has no --pytorch), or as
# FAKE_NSYS_VERSION, FAKE_NSYS_REPORTS and FAKE_NSYS_PROFILE_OPTIONS say (an older or a newer nsys). `profile` does
# not run the app: it writes the report (none with FAKE_NSYS_NO_CAPTURE) and the bench_e2e record where the app's
# --results-dir points, or exits with FAKE_NSYS_APP_STATUS as nsys does when the app fails (only for the reports
# whose name holds FAKE_NSYS_APP_STATUS_MATCH, when set). With FAKE_NSYS_RUN_APP it runs the real app instead, in its
# environment, without --nvtx (there is no NVTX to call on a CPU), and writes the report when the app's record says it
# measured its steps (as a real capture range would have opened).
# `stats` prints what nsys prints and, for every --report, copies the fixture CSV to <--output>_<report>.csv (an empty
# file where the fixture has none, as nsys writes a report without data), or writes nothing for a report named in
# FAKE_NSYS_UNKNOWN, as nsys does for a report it does not know.
FAKE_NSYS = r'''#!{python}
import json, os, shutil, subprocess, sys
from pathlib import Path

argv = sys.argv[1:]
with open(os.environ["FAKE_NSYS_LOG"], "a") as log:
    log.write(json.dumps({{"argv": argv, "register_only": os.environ.get("NSYS_NVTX_PROFILER_REGISTER_ONLY"),
                          "nvtx_library": os.environ.get("BENCH_NVTX_LIBRARY")}}) + "\n")

def option(name):
    return next(a.split("=", 1)[1] for a in argv if a.startswith(name + "="))

if argv == ["--version"]:
    print("NVIDIA Nsight Systems version " + os.environ.get("FAKE_NSYS_VERSION", "2023.4.4.54-234433681190v0"))
elif argv == ["stats", "--help-reports"]:
    print("\nThe following built-in reports are available:\n")
    for report in os.environ.get("FAKE_NSYS_REPORTS", "{reports}").split():
        print(f"  {{report}}[:nvtx-name][:base|:mangled] -- some report")
elif argv == ["profile", "--help"]:
    print("usage: nsys profile [<args>] [application] [<application args>]\n")
    for name in os.environ.get("FAKE_NSYS_PROFILE_OPTIONS", "{profile_options}").split():
        print(f"\t{{name}}=\n\n\t   Possible values are ...\n")
elif argv[0] == "profile":
    status = int(os.environ.get("FAKE_NSYS_APP_STATUS", "0"))
    if status and os.environ.get("FAKE_NSYS_APP_STATUS_MATCH", "") in Path(option("--output")).name:
        sys.exit(status)
    e2e = Path(argv[argv.index("--results-dir") + 1]) / "e2e"
    if os.environ.get("FAKE_NSYS_RUN_APP"):
        app = argv[next(i for i, a in enumerate(argv) if i and not a.startswith("-")):]
        status = subprocess.run([a for a in app if a != "--nvtx"]).returncode
        if status:
            sys.exit(status)
        measured = json.loads((e2e / "e2e.jsonl").read_text().splitlines()[-1])["status"] in ("ok", "noisy")
    else:
        e2e.mkdir(parents=True)
        (e2e / "e2e.jsonl").write_text(os.environ["FAKE_NSYS_RECORD"] + "\n")
        measured = not os.environ.get("FAKE_NSYS_NO_CAPTURE")  # the app never opened "measure": no report
    if measured:
        Path(option("--output") + ".nsys-rep").write_text("fake report")
elif argv[0] == "stats":
    prefix = argv[argv.index("--output") + 1]
    fixtures = Path(os.environ["FAKE_NSYS_FIXTURES"])
    if "--sqlite" in argv:  # the export, as nsys writes it before running the reports
        print(f"Generating SQLite file {{prefix}}.sqlite from {{prefix}}.nsys-rep")
        Path(argv[argv.index("--sqlite") + 1]).write_text("fake export")
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
# some of the options `nsys profile --help` of 2023.4.4 lists (test_nsys_real.py asks the real one): no --pytorch
NSYS_2023_PROFILE_OPTIONS = ("--capture-range-end --cuda-memory-usage --cudabacktrace --force-overwrite "
                             "--python-backtrace --python-sampling")
# a tiny model, run for real by FAKE_NSYS_RUN_APP on the CPU
TINY_APP = ["--device", "cpu", "--num-layers", "1", "--d-model", "64", "--num-heads", "4", "--d-ff", "128",
            "--vocab-size", "256", "--batch-size", "2", "--warmup", "1", "--steps", "2"]


@pytest.fixture
def fake(tmp_path: Path) -> dict:
    """A bin folder holding the fake nsys, and the environment to run nsys_run.sh with it first on PATH."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    nsys = bin_dir / "nsys"
    nsys.write_text(FAKE_NSYS.format(python=sys.executable, reports=NSYS_2023_REPORTS,
                                     profile_options=NSYS_2023_PROFILE_OPTIONS))
    nsys.chmod(0o755)
    fixtures = tmp_path / "fixtures"
    fixtures.mkdir()
    write_nsys_fixture(fixtures)
    for new_name, old_name in OLD_REPORT_NAMES.items():  # what an nsys of before 2023 writes for the same reports
        if (fixtures / f"report_{new_name}.csv").exists():
            shutil.copy(fixtures / f"report_{new_name}.csv", fixtures / f"report_{old_name}.csv")
    # BENCH_NVTX_LIBRARY set: the fake runs no NVTX, and a CPU run would otherwise build the library first
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}", "PYTHON": sys.executable,
           "FAKE_NSYS_LOG": str(tmp_path / "calls.jsonl"), "FAKE_NSYS_FIXTURES": str(fixtures),
           "FAKE_NSYS_RECORD": json.dumps(e2e_record()), NVTX_LIBRARY_ENV: str(tmp_path / "libnvtx-unused.so")}
    env.pop("NSYS", None)
    env.pop("NSYS_NVTX_PROFILER_REGISTER_ONLY", None)
    return {"env": env, "log": tmp_path / "calls.jsonl", "results": tmp_path / "results", "cwd": tmp_path}


def run_script(fake: dict, *args: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(SCRIPT), "--results-dir", str(fake["results"]), *args],
                          capture_output=True, text=True, env={**fake["env"], **env}, cwd=fake["cwd"], timeout=60)


def calls(fake: dict) -> list[dict]:
    """The profile and stats calls (not the version check's queries)."""
    logged = [json.loads(line) for line in fake["log"].read_text().splitlines()] if fake["log"].exists() else []
    return [c for c in logged if c["argv"] not in (["--version"], ["stats", "--help-reports"], ["profile", "--help"])]


def profiled(fake: dict) -> list[str]:
    """The report names of the `nsys profile` runs so far, in order."""
    return [Path(next(a for a in c["argv"] if a.startswith("--output="))[len("--output="):]).name
            for c in calls(fake) if c["argv"][0] == "profile"]


def exported(fake: dict) -> list[str]:
    """The report names of the `nsys stats` runs so far, in order."""
    return [Path(c["argv"][c["argv"].index("--output") + 1]).name for c in calls(fake) if c["argv"][0] == "stats"]


def summaries(fake: dict) -> list[list[dict]]:
    """The records of every summary written so far, oldest first."""
    paths = sorted((fake["results"] / "nsys").glob("summary-*.jsonl"), key=lambda path: path.stat().st_mtime_ns)
    return [read_records(path) for path in paths]


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
    assert run_script(fake, "--force", "xl", "64", CS336_HANDOUT="2025").returncode == 0  # else the report is reused
    assert run_script(fake, "xl", "64").returncode == 0
    profiles = [c["argv"] for c in calls(fake) if c["argv"][0] == "profile"]
    outputs = [next(a for a in argv if a.startswith("--output=")) for argv in profiles]
    nsys_dir = fake["results"] / "nsys"
    assert outputs == ([f"--output={nsys_dir / 'xl_ctx64_train_h2025'}"] * 2
                       + [f"--output={nsys_dir / 'xl_ctx64_train'}"])
    assert [argv[argv.index("--handout") + 1] for argv in profiles] == ["2025", "2025", "2026"]
    bad = run_script(fake, "xl", "64", CS336_HANDOUT="2024")
    assert bad.returncode == 2 and "CS336_HANDOUT='2024' is not a handout" in bad.stderr
    # the variable is read as every script reads it (cli.handout_or_exit): surrounding spaces do not matter
    assert run_script(fake, "--force", "xl", "64", CS336_HANDOUT=" 2025").returncode == 0
    assert profiled(fake)[-1] == "xl_ctx64_train_h2025"


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
    assert "python3 bench_e2e.py --size tiny --context-length 64 --mode train --profile" in result.stderr
    not_binary = run_script(fake, "tiny", "64", NSYS=str(tmp_path / "no-such-nsys"))
    assert not_binary.returncode == 2 and "NSYS=" in not_binary.stderr
    assert not calls(fake)


@pytest.mark.parametrize("args, message", [
    (["tiny"], "usage"),
    (["tiny", "0"], "CTX"),
    (["tiny", "64", "inference"], "MODE"),
    (["tiny", "64", "--", "--context-length", "128"], "before --"),
    (["tiny", "64", "--", "--dtype", "fp32", "bf16"], "one --dtype"),
    (["--handout", "2024", "tiny", "64"], "invalid choice: '2024'"),
    (["tiny", "64", "--", "--handout", "2025"], "give --handout before --"),
    (["tiny", "64", "--mode", "forward"], "not both"),
    (["--size", "--context-length", "64"], "--size: expected at least one argument"),
    (["--size", "tiny", "--context-length", "64", "0"], "CTX must be a positive integer, got '0'"),
    (["--size", "tiny", "--mode", "forward", "inference"], "got 'inference'"),
    (["--size", "tiny", "--", "--compile", "off", "on"], "one --compile at a time"),
    (["--cuda-memory-usage=maybe", "tiny", "64"], "--cuda-memory-usage: invalid choice: 'maybe'"),
    (["tiny", "64", "--pytorch"], "--pytorch: expected one argument"),
    (["tiny", "64", "--pytorch="], "--pytorch needs a value"),
    (["tiny", "64", "--", "--dry-run"], "give --dry-run before --"),
    (["tiny", "64", "--", "--results-dir", "x"], "give --results-dir before --"),
    (["tiny", "64", "--", "--out=x"], "no --out after --"),
    (["huge", "64"], "unknown preset 'huge'"),
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


def test_an_nsys_of_before_2023_is_asked_for_its_own_report_names(fake: dict):
    result = run_script(fake, "tiny", "64", FAKE_NSYS_VERSION="2022.4.2.1-df9881f",
                        FAKE_NSYS_REPORTS=NSYS_2022_REPORTS)
    assert result.returncode == 0, result.stderr
    (stats,) = [c["argv"] for c in calls(fake) if c["argv"][0] == "stats"]
    asked = {stats[i + 1] for i, arg in enumerate(stats) if arg == "--report"}
    assert asked == {"gputrace", "cudaapitrace", "nvtxpptrace", "gpukernsum", "nvtxkernsum"}
    report = fake["results"] / "nsys" / "tiny_ctx64_train"
    assert Path(f"{report}_cuda_gpu_trace.csv").exists() and not Path(f"{report}_gputrace.csv").exists()
    assert "### 2. Top kernels by GPU time: backward" in Path(f"{report}.md").read_text()


def test_an_nsys_without_the_reports_under_either_name_is_refused_up_front_with_its_version(fake: dict):
    result = run_script(fake, "tiny", "64", FAKE_NSYS_VERSION="2021.1.1.66-6c5c5cb",
                        FAKE_NSYS_REPORTS="cudaapisum gpusum nvtxsum")
    assert result.returncode == 2 and len(result.stderr.strip().splitlines()) == 1
    assert "2021.1.1" in result.stderr and "cuda_gpu_trace (or gputrace)" in result.stderr
    assert "2023.4.4 or newer" in result.stderr
    assert not calls(fake)  # nothing profiled that could not be read


def test_a_report_that_nsys_stats_quietly_did_not_write_is_an_error_with_its_log_lines(fake: dict):
    result = run_script(fake, "tiny", "64", FAKE_NSYS_UNKNOWN="cuda_api_trace")
    assert result.returncode == 1
    assert "wrote no" in result.stderr and "ERROR: Report 'cuda_api_trace' could not be found." in result.stderr
    report = fake["results"] / "nsys" / "tiny_ctx64_train"
    assert not Path(f"{report}.md").exists()  # no tables from a partial export
    assert "could not be found" in Path(f"{report}.stats.log").read_text()  # the log is kept


# ---- several configurations in one call ----


def test_several_configurations_one_nsys_run_each_then_one_summary(fake: dict):
    result = run_script(fake, "--size", "tiny", "small", "--context-length", "64", "32", "--mode", "train")
    assert result.returncode == 0, result.stderr
    plan = [f"{size}_ctx{ctx}_train" for size in ("tiny", "small") for ctx in (32, 64)]
    assert profiled(fake) == plan  # contexts ascending within a size, so that an OOM can skip the larger ones
    assert exported(fake) == plan
    nsys_dir = fake["results"] / "nsys"
    assert all((nsys_dir / f"{name}.md").read_text().startswith("device: ") for name in plan)
    assert all((nsys_dir / f"{name}.args").exists() for name in plan)
    (rows,) = summaries(fake)
    assert [(row["size"], row["context_length"]) for row in rows] == [("tiny", 32), ("tiny", 64), ("small", 32),
                                                                       ("small", 64)]
    assert all(row["runs"] == {"train": "ok"} for row in rows)
    # no forward-only run: the forward columns come from the training run's forward phase, and say so
    assert all(row["forward_from"] == "train" and row["forward_nsight_ms"] and row["matmul_pct_train_step"]
               for row in rows)
    assert "### nsys_run.sh summary" in result.stdout


def test_existing_reports_are_reused_their_missing_tables_remade_and_force_profiles_again(fake: dict):
    args = ("--size", "tiny", "--context-length", "32", "64", "--mode", "forward")
    assert run_script(fake, *args).returncode == 0
    nsys_dir = fake["results"] / "nsys"
    tables = nsys_dir / "tiny_ctx32_forward.md"
    tables.write_text(tables.read_text() + "marker: the first run's tables\n")
    again = run_script(fake, *args)
    assert again.returncode == 0, again.stderr
    assert profiled(fake) == ["tiny_ctx32_forward", "tiny_ctx64_forward"]  # nothing profiled twice
    assert exported(fake) == ["tiny_ctx32_forward", "tiny_ctx64_forward"]
    assert again.stderr.count("reusing") == 2 and "marker: the first run's tables" in again.stdout
    assert len(summaries(fake)) == 2  # a second summary beside the first, which is kept
    (nsys_dir / "tiny_ctx64_forward.md").unlink()  # a report whose tables are missing: made again, not profiled
    assert run_script(fake, "tiny", "64", "forward").returncode == 0
    assert len(profiled(fake)) == 2 and exported(fake)[-1] == "tiny_ctx64_forward"
    assert (nsys_dir / "tiny_ctx64_forward.md").exists()
    forced = run_script(fake, "--force", "tiny", "32", "forward")
    assert forced.returncode == 0, forced.stderr
    assert profiled(fake)[2:] == ["tiny_ctx32_forward"]
    assert "marker" not in tables.read_text()


def test_a_report_made_with_other_arguments_is_kept_and_neither_reused_nor_replaced(fake: dict):
    assert run_script(fake, "tiny", "64").returncode == 0
    report = fake["results"] / "nsys" / "tiny_ctx64_train"
    made_with = Path(f"{report}.args").read_text()
    other = run_script(fake, "tiny", "64", "--", "--steps", "3")
    assert other.returncode == 1 and "made with other arguments" in other.stderr and "--force" in other.stderr
    assert len(profiled(fake)) == 1 and Path(f"{report}.args").read_text() == made_with
    Path(f"{report}.args").unlink()  # a report from before the .args files: its arguments are unknown, so kept
    assert run_script(fake, "tiny", "64").returncode == 1 and len(profiled(fake)) == 1
    forced = run_script(fake, "--force", "tiny", "64", "--", "--steps", "3")
    assert forced.returncode == 0 and len(profiled(fake)) == 2
    assert "--steps 3" in Path(f"{report}.args").read_text()


def test_an_oom_skips_the_larger_contexts_of_that_size_and_mode(fake: dict):
    # the real bench_e2e runs under the fake nsys; BENCH_INJECT_FAULT reaches it through nsys's environment
    result = run_script(fake, "--size", "tiny", "--context-length", "16", "32", "64", "--mode", "forward", "--",
                        *TINY_APP, FAKE_NSYS_RUN_APP="1", BENCH_INJECT_FAULT="oom:context_length=32")
    assert result.returncode == 1  # not every configuration has its tables
    assert profiled(fake) == ["tiny_ctx16_forward", "tiny_ctx32_forward"]
    assert "tiny ctx=64 forward: skipped: OOM at context_length=32" in result.stderr
    nsys_dir = fake["results"] / "nsys"
    assert read_records(nsys_dir / "tiny_ctx32_forward_e2e.jsonl")[-1]["status"] == "OOM"  # kept: it says why
    assert not (nsys_dir / "tiny_ctx32_forward.nsys-rep").exists()
    (rows,) = summaries(fake)
    assert rows[0]["runs"]["forward"] in ("ok", "noisy")  # noisy: a step time varied by more than bench_e2e allows
    assert [row["runs"] for row in rows[1:]] == [{"forward": "OOM"}, {"forward": "skipped: OOM at context_length=32"}]
    assert rows[0]["forward_stopwatch_ms"] > 0  # the real run's stopwatch, beside the fixture's ranges


def test_no_skip_profiles_the_larger_contexts_after_an_oom(fake: dict):
    oom = e2e_record(status="OOM")
    del oom["forward_ms"]
    args = ("--size", "tiny", "--context-length", "16", "32", "--mode", "forward", "train")
    env = {"FAKE_NSYS_NO_CAPTURE": "1", "FAKE_NSYS_RECORD": json.dumps(oom)}
    assert run_script(fake, *args, **env).returncode == 1
    assert profiled(fake) == ["tiny_ctx16_forward", "tiny_ctx16_train"]  # per size and mode
    assert run_script(fake, "--no-skip", *args, **env).returncode == 1
    assert profiled(fake)[2:] == ["tiny_ctx16_forward", "tiny_ctx16_train", "tiny_ctx32_forward", "tiny_ctx32_train"]


def test_a_failing_configuration_loses_none_of_the_others(fake: dict):
    result = run_script(fake, "--size", "tiny", "--context-length", "32", "64", "--mode", "train",
                        FAKE_NSYS_APP_STATUS="7", FAKE_NSYS_APP_STATUS_MATCH="ctx32")
    assert result.returncode == 7  # the first failure's status, after every configuration ran
    assert profiled(fake) == ["tiny_ctx32_train", "tiny_ctx64_train"]
    assert (fake["results"] / "nsys" / "tiny_ctx64_train.md").exists()
    (rows,) = summaries(fake)
    assert rows[0]["runs"] == {"train": "failed: the profiled run's exit status was 7"}
    assert rows[1]["runs"] == {"train": "ok"}

    # a usage error of the profiled run (exit 2) would repeat for every configuration: the loop stops there, and
    # nothing of the refused configuration is left behind (no .args that would make its next run "kept")
    refused = run_script(fake, "--force", "--size", "tiny", "--context-length", "32", "64", "--mode", "train",
                         FAKE_NSYS_APP_STATUS="2")
    assert refused.returncode == 2 and "refused its arguments" in refused.stderr
    assert profiled(fake)[2:] == ["tiny_ctx32_train"]
    assert not list((fake["results"] / "nsys").glob("tiny_ctx32_train*")) and len(summaries(fake)) == 1


def plan_lines(stdout: str) -> list[str]:
    """The dry run's plan lines, as 'SIZE ctx=N MODE: action'."""
    return [re.sub(r"^\s*\d+\. (.*) -> \S+: (.*)$", r"\1: \2", line) for line in stdout.splitlines()
            if re.match(r"^\s*\d+\. .* -> ", line)]


def test_dry_run_lists_the_plan_and_what_happens_to_existing_reports(fake: dict):
    args = ("--dry-run", "--size", "tiny", "--context-length", "64", "32", "--mode", "forward", "train")
    result = run_script(fake, *args)
    assert result.returncode == 0, result.stderr
    assert plan_lines(result.stdout) == [f"tiny ctx={ctx} {mode}: profile" for ctx in (32, 64)
                                         for mode in ("forward", "train")]
    assert "2 configurations would run" in result.stdout  # bench_e2e's own dry run checked the arguments
    assert "nothing was profiled or written" in result.stdout
    assert not fake["log"].exists() and not fake["results"].exists()  # nsys not even asked, nothing written
    assert run_script(fake, "tiny", "32", "forward").returncode == 0
    lines = plan_lines(run_script(fake, *args).stdout)
    assert lines[0] == "tiny ctx=32 forward: reuse the existing report" and lines[1].endswith(": profile")
    forced = plan_lines(run_script(fake, "--force", "--dry-run", "tiny", "32", "forward").stdout)
    assert forced == ["tiny ctx=32 forward: profile again, replacing the report (--force)"]
    bad = run_script(fake, "--dry-run", "--size", "2.7B", "--context-length", "64")
    assert bad.returncode == 2 and "handout 2025" in bad.stderr  # the handout's sizes, from bench_e2e


@pytest.mark.parametrize("handout, sizes, contexts", [
    ("2025", ["small", "medium", "large", "xl", "2.7B"], [128, 256, 512, 1024]),
    ("2026", ["small", "medium"], [256, 512, 1024]),
])
def test_with_no_configuration_the_handouts_nsys_profile_plan(fake: dict, handout: str, sizes: list[str],
                                                              contexts: list[int]):
    result = run_script(fake, "--dry-run", "--handout", handout)
    assert result.returncode == 0, result.stderr
    assert plan_lines(result.stdout) == [f"{size} ctx={ctx} {mode}: profile" for size in sizes for ctx in contexts
                                         for mode in ("forward", "train")]
    suffix = "_h2025" if handout == "2025" else ""
    assert f"/nsys/small_ctx{contexts[0]}_forward{suffix}: profile" in result.stdout


# ---- nsys profile flags passed through ----


def test_pytorch_and_cuda_memory_flags_reach_nsys_profile_and_name_the_report(fake: dict):
    newer = NSYS_2023_PROFILE_OPTIONS + " --pytorch"
    result = run_script(fake, "--pytorch", "autograd-nvtx,functions-trace", "--cuda-memory-usage=true", "tiny", "64",
                        FAKE_NSYS_PROFILE_OPTIONS=newer)
    assert result.returncode == 0, result.stderr
    argv = calls(fake)[0]["argv"]
    options = argv[:argv.index(sys.executable)]
    assert {"--pytorch=autograd-nvtx,functions-trace", "--cuda-memory-usage=true"} <= set(options)
    assert profiled(fake) == ["tiny_ctx64_train_pytorch_cudamem"]  # never replaces nor stands in for a plain one


def test_an_nsys_that_does_not_know_a_passed_flag_refuses_it_in_one_line(fake: dict):
    result = run_script(fake, "--cuda-memory-usage=true", "--pytorch=autograd-nvtx", "tiny", "64")
    assert result.returncode == 2 and len(result.stderr.strip().splitlines()) == 1
    assert "2023.4.4" in result.stderr and "does not know --pytorch" in result.stderr
    assert not calls(fake)


# ---- the profiled run's arguments, its output, and NVTX on a CPU ----


def test_arguments_that_bench_e2e_refuses_exit_2_and_leave_nothing_behind(fake: dict):
    # the real bench_e2e under the fake nsys refuses --steps 0 (exit 2), as it would under the real one
    result = run_script(fake, "tiny", "16", "--", *TINY_APP, "--steps", "0", FAKE_NSYS_RUN_APP="1")
    assert result.returncode == 2 and "bench_e2e.py: error: argument --steps" in result.stderr
    assert "refused its arguments" in result.stderr
    assert not fake["results"].exists()  # no stray .args (the next run would call the report "kept"), no folder
    # several configurations: bench_e2e --dry-run checks every mode before the first nsys run
    several = run_script(fake, "--size", "tiny", "--context-length", "16", "32", "--", "--no-such-option")
    assert several.returncode == 2 and "--no-such-option" in several.stderr
    assert profiled(fake) == ["tiny_ctx16_train"]  # the single run above only
    assert not fake["results"].exists()


def test_the_run_names_where_its_files_are_kept_never_a_temporary_folder(fake: dict):
    result = run_script(fake, "tiny", "16", "forward", "--", *TINY_APP, FAKE_NSYS_RUN_APP="1")
    assert result.returncode == 0, result.stderr
    report = fake["results"] / "nsys" / "tiny_ctx16_forward"
    assert f"wrote {report}_e2e.md and {report}_e2e.jsonl" in result.stdout  # bench_e2e's own line, re-pointed
    assert "nsys_run-" not in result.stdout + result.stderr  # the prefix of the temporary folder it ran in
    assert read_records(f"{report}_e2e.jsonl")[-1]["status"] in ("ok", "noisy")
    assert "fwd ms" in Path(f"{report}_e2e.md").read_text()  # bench_e2e's results table, kept beside


def test_a_cpu_run_without_an_nvtx_library_builds_one_or_says_what_to_do(fake: dict, tmp_path: Path):
    env = {**fake["env"], "XDG_CACHE_HOME": str(tmp_path / "cache")}
    env.pop(NVTX_LIBRARY_ENV)
    base = ["bash", str(SCRIPT), "--results-dir", str(fake["results"]), "tiny", "16", "--", "--device", "cpu"]
    no_compiler = subprocess.run(base, capture_output=True, text=True, timeout=60,
                                 env={**env, "CC": str(tmp_path / "no-such-gcc")})
    assert no_compiler.returncode == 2 and len(no_compiler.stderr.strip().splitlines()) == 1
    assert NVTX_LIBRARY_ENV in no_compiler.stderr and "gcc -shared" in no_compiler.stderr
    assert "no C compiler" in no_compiler.stderr and not profiled(fake)  # refused before profiling
    if shutil.which("gcc") is None:
        return
    # with gcc: the NVTX headers beside nsys (the fake has none), else a CUDA toolkit's
    headers = nsys_tool.nvtx_include_dir(fake["cwd"] / "bin" / "nsys")
    built = subprocess.run(base, capture_output=True, text=True, timeout=300, env=env)
    if headers is None:
        assert built.returncode == 2 and "no NVTX headers" in built.stderr and not profiled(fake)
        return
    assert built.returncode == 0, built.stderr
    (library,) = (tmp_path / "cache" / "cs336-bench").glob("nvtx-*/libnvtx.so")
    (profile,) = [c for c in calls(fake) if c["argv"][0] == "profile"]
    assert profile["nvtx_library"] == str(library)  # handed to the profiled run
    exported = ctypes.CDLL(str(library))
    assert exported.nvtxRangePushA and exported.nvtxRangePop  # what common.nvtx_functions binds
    assert "building the NVTX library" in built.stderr
    again = subprocess.run(base + ["--steps", "3"], capture_output=True, text=True, timeout=60, env=env)
    assert "building" not in again.stderr  # built once, then reused from the cache


def test_every_spelling_of_the_options_reaches_nsys_and_bench_e2e(fake: dict):
    """The forms the bash nsys_run.sh took, now parsed in Python: =-forms, the --python-backtrace alias, a bare
    --cuda-memory-usage before SIZE (it must not take SIZE as its value), options after the configuration."""
    newer = NSYS_2023_PROFILE_OPTIONS + " --pytorch"
    result = subprocess.run(["bash", str(SCRIPT), f"--results-dir={fake['results']}", "--handout=2025",
                             "--python-backtrace", "--cuda-memory-usage", "small", "32", "--pytorch=autograd-nvtx",
                             "--", "--dtype=bf16"], capture_output=True, text=True, timeout=60,
                            env={**fake["env"], "FAKE_NSYS_PROFILE_OPTIONS": newer}, cwd=fake["cwd"])
    assert result.returncode == 0, result.stderr
    assert profiled(fake) == ["small_ctx32_train_bf16_pytorch_cudamem_h2025"]
    argv = calls(fake)[0]["argv"]
    assert {"--python-backtrace=cuda", "--cudabacktrace=all", "--cuda-memory-usage=true",
            "--pytorch=autograd-nvtx"} <= set(argv)
    no_python = run_script(fake, "tiny", "16", PYTHON="/nonexistent/python3")
    assert no_python.returncode == 2 and "PYTHON=/nonexistent/python3 is not a Python interpreter" in no_python.stderr
