"""nsys_run.sh and kernel_tables.py under a real Nsight Systems CLI, on the CPU (docs/nsys_run.md).

On a CPU nsys records NVTX ranges and OS calls, and `nsys stats` writes its real CSVs (the CUDA ones empty). The
CPU build of torch has no NVTX, so the profiled run gets one from a tiny library built here with gcc from the
NVTX3 headers that ship inside the nsys package, named by BENCH_NVTX_LIBRARY (common.nvtx_functions).

Which nsys: $REAL_NSYS (.ci/run sets it from ../shared/tools/get-nsys.sh), else `nsys` on PATH. Without one, or
without gcc or the NVTX headers, every test here is skipped with the reason (pytest -rs prints it).
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import kernel_tables as kt
import nsys_tool
import profile_readers as pr
import profile_tables as pt
from nsys_tool import NVTX_LIBRARY_ENV
from results import read_records
from test_kernel_tables import FIXTURE_REPORTS, write_nsys_fixture, write_nsys_sqlite

HERE = Path(__file__).resolve().parent
STEPS, WARMUP = 3, 2
# the smallest model that still has every phase and attention sub-step: the run is about nsys, not the numbers
APP_ARGS = ["--device", "cpu", "--num-layers", "1", "--d-model", "64", "--num-heads", "4", "--d-ff", "128",
            "--vocab-size", "256", "--batch-size", "2", "--warmup", str(WARMUP), "--steps", str(STEPS)]
REPORTS = ("cuda_gpu_trace", "cuda_api_trace", "nvtx_pushpop_trace", "cuda_gpu_kern_sum", "nvtx_kern_sum")


def find_real_nsys() -> tuple[Path | None, str]:
    """(the nsys binary, '') or (None, why there is none)."""
    given = os.environ.get("REAL_NSYS")
    candidate = given or shutil.which("nsys")
    if not candidate:
        return None, ("no real nsys: set REAL_NSYS to an nsys binary (.ci/run fetches one with "
                      "../shared/tools/get-nsys.sh) or put nsys on PATH")
    try:
        version = subprocess.run([candidate, "--version"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError) as exc:
        return None, f"nsys at {candidate} does not run: {exc}"
    if version.returncode != 0:
        return None, f"nsys at {candidate} does not run: {version.stderr.strip()[:200]}"
    return Path(candidate), ""


@pytest.fixture(scope="module")
def nsys() -> Path:
    path, reason = find_real_nsys()
    if path is None:
        pytest.skip(reason)
    return path


@pytest.fixture(scope="module")
def nvtx_cache(nsys: Path, tmp_path_factory) -> Path:
    """An empty cache folder (XDG_CACHE_HOME): nsys_run.sh builds the NVTX library there itself, the CPU run's
    one step (BENCH_NVTX_LIBRARY unset)."""
    if shutil.which("gcc") is None:
        pytest.skip("no gcc to build the NVTX library that the CPU build of torch lacks")
    if nsys_tool.nvtx_include_dir(nsys) is None:
        pytest.skip(f"no NVTX3 headers (nvtx3/nvToolsExt.h) found beside {nsys}")
    return tmp_path_factory.mktemp("cache")


def run_nsys_run(nsys: Path, nvtx_cache: Path, results: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "NSYS": str(nsys), "PYTHON": sys.executable, "XDG_CACHE_HOME": str(nvtx_cache)}
    env.pop(NVTX_LIBRARY_ENV, None)
    return subprocess.run(["bash", str(HERE / "nsys_run.sh"), "--results-dir", str(results), *args],
                          capture_output=True, text=True, env=env, timeout=300)


@pytest.fixture(scope="module")
def profiled(nsys: Path, nvtx_cache: Path, tmp_path_factory) -> dict:
    """One real nsys_run.sh of a tiny training step on the CPU, shared by the tests below (~25 s here): the
    first of the module, so it also builds the NVTX library, as a student's first CPU run would."""
    results = tmp_path_factory.mktemp("results")
    result = run_nsys_run(nsys, nvtx_cache, results, "tiny", "16", "train", "--", *APP_ARGS)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return {"result": result, "report": results / "nsys" / "tiny_ctx16_train", "folder": results / "nsys"}


def test_a_cpu_run_is_one_step_the_nvtx_library_built_once_into_the_cache(profiled: dict, nvtx_cache: Path):
    assert "building the NVTX library it needs, once" in profiled["result"].stderr
    (library,) = (nvtx_cache / "cs336-bench").glob("nvtx-*/libnvtx.so")
    assert str(library) in profiled["result"].stderr  # where it went, said once; never a temporary path
    assert "nsys_run-" not in profiled["result"].stdout + profiled["result"].stderr


def test_report_csv_and_table_names(profiled: dict):
    report = profiled["report"]
    suffixes = (".nsys-rep", ".sqlite", ".stats.log", ".md", "_e2e.jsonl", "_e2e.md", ".args")
    expected = {f"{report.name}{suffix}" for suffix in suffixes}
    expected |= {f"{report.name}_{name}.csv" for name in REPORTS}
    assert {p.name for p in profiled["folder"].iterdir()} == expected  # no nvtx_sum, nothing else
    assert f"report: {report}.nsys-rep" in profiled["result"].stdout


def test_the_capture_holds_the_measured_steps_and_no_warmup(profiled: dict):
    rows = pr.read_nsys_csv(pr.nsys_report_path(profiled["report"], "nvtx_pushpop_trace"), ("Name", "Lvl"))
    names = [row["name"] for row in rows]
    assert names.count("measure") == 1 and "warmup" not in names  # the capture range is "measure"
    for phase in ("forward", "backward", "optimizer"):
        assert names.count(phase) == STEPS, phase  # the warm-up's steps are not in the report
    measure = next(row for row in rows if row["name"] == "measure")
    assert measure["lvl"] == "0" and all(row["lvl"] != "0" for row in rows if row["name"] != "measure")
    (record,) = read_records(f"{profiled['report']}_e2e.jsonl")
    assert record["config"]["warmup"] == WARMUP and len(record["step_ms"]) == STEPS


def test_real_nvtx_reports_make_the_phase_table_beside_the_stopwatch(profiled: dict):
    report = profiled["report"]
    tables = pt.build_tables(pr.load_nsys(report), pt.stopwatch_ms(read_records(f"{report}_e2e.jsonl")[0]))
    phases = {row["phase"]: row for row in tables["phases"]}
    assert list(phases) == ["forward", "backward", "optimizer", "step"] and tables["steps"] == STEPS
    for name, row in phases.items():
        assert row["range_ms"] > 0 and row["stopwatch_ms"] > 0, row
        if name != "step":  # the NVTX range and the stopwatch time the same interval: they agree far better than 10%
            assert row["agrees"] == "yes", row
        else:  # no step range: the measured region over the steps, which also holds what runs between them (a
            # tenth of a 5 ms step here, under load more), so only longer than the stopwatch's step, never shorter
            assert 0.95 < row["ratio"] < 2.0, row
            assert "step = the measured region over the steps" in tables["ranges_used"]
    md = Path(f"{report}.md").read_text()
    assert "### 1. Phase times (mean per step over 3 steps)" in md
    assert md.startswith("device: ")  # the environment header from bench_e2e's record


def test_no_kernel_data_is_said_not_tabulated(profiled: dict):
    report = profiled["report"]
    for name in ("cuda_gpu_trace", "cuda_api_trace", "cuda_gpu_kern_sum"):
        assert pr.nsys_report_path(report, name).stat().st_size == 0  # how nsys writes a report without data
    md = Path(f"{report}.md").read_text()
    assert pt.NO_KERNELS in md and "### 2." not in md and "### 3." not in md
    stderr = profiled["result"].stderr
    assert "cuda_gpu_kern_sum is empty: SKIPPED:" in stderr and "does not contain CUDA kernel data" in stderr


def test_arguments_the_profiled_run_refuses_exit_2_and_leave_nothing_behind(nsys: Path, nvtx_cache: Path,
                                                                            tmp_path: Path):
    result = run_nsys_run(nsys, nvtx_cache, tmp_path, "tiny", "16", "--", *APP_ARGS, "--steps", "0")
    assert result.returncode == 2  # bench_e2e's own exit status for its usage error, through nsys
    assert "bench_e2e.py: error: argument --steps" in result.stderr
    assert "refused its arguments" in result.stderr
    assert not (tmp_path / "nsys").exists()  # no .args, no report folder


def test_the_csv_fixture_is_what_nsys_stats_writes(nsys: Path, tmp_path: Path):
    """test_kernel_tables' CSV fixture, byte for byte, against the real `nsys stats` on the same events."""
    write_nsys_fixture(tmp_path, "fixture")
    sqlite = write_nsys_sqlite(tmp_path / "real.sqlite")
    reports = [arg for name in FIXTURE_REPORTS for arg in ("--report", name)]
    result = subprocess.run([str(nsys), "stats", "--format", "csv", "--output", str(tmp_path / "real"), *reports,
                             str(sqlite)], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    for name in FIXTURE_REPORTS:
        real = pr.nsys_report_path(tmp_path / "real", name).read_text()
        assert pr.nsys_report_path(tmp_path / "fixture", name).read_text() == real, name


def test_the_summary_of_a_real_report_has_the_forward_pass_and_says_why_the_kernel_columns_are_empty(
        profiled: dict, tmp_path: Path, capsys):
    assert kt.main(["--summary", str(profiled["report"]), "--results-dir", str(tmp_path)]) == 0
    (jsonl,) = (tmp_path / "nsys").glob("summary-*.jsonl")
    (row,) = read_records(jsonl)
    assert (row["size"], row["context_length"], row["runs"]) == ("tiny", 16, {"train": row["runs"]["train"]})
    assert row["runs"]["train"] in ("ok", "noisy") and row["forward_from"] == "train"
    assert row["forward_nsight_ms"] == pytest.approx(row["forward_stopwatch_ms"], rel=0.1)  # the range is the timer's
    assert "top_forward_kernel" not in row and row["matmul_pct_forward"] is None  # no CUDA kernels on a CPU
    assert "no CUDA kernel data in these reports" in capsys.readouterr().out


def test_nsys_2023_4_knows_cuda_memory_usage_but_not_pytorch(nsys: Path, tmp_path: Path):
    """The flags of the 2026 handout's memory_profiling (f), checked against this nsys's own `profile --help`."""
    known = subprocess.run([str(nsys), "profile", "--help"], capture_output=True, text=True, timeout=60).stdout
    assert "--cuda-memory-usage=" in known
    if "--pytorch=" in known:
        pytest.skip(f"this nsys ({nsys}) knows --pytorch; test_nsys.py checks the refusal against a fake")
    env = {**os.environ, "NSYS": str(nsys), "PYTHON": sys.executable}
    result = subprocess.run(["bash", str(HERE / "nsys_run.sh"), "--results-dir", str(tmp_path),
                             "--cuda-memory-usage=true", "--pytorch=autograd-nvtx", "tiny", "16"],
                            capture_output=True, text=True, env=env, timeout=120)
    assert result.returncode == 2 and len(result.stderr.strip().splitlines()) == 1
    assert "does not know --pytorch" in result.stderr and "Nsight Systems version" in result.stderr
    assert "--cuda-memory-usage" not in result.stderr  # that one this nsys knows
    assert not (tmp_path / "nsys").exists()  # refused before anything was profiled or written


# ---- kernel_tables.py on a report it exports itself ----


def test_kernel_tables_on_a_report_runs_nsys_stats_itself_csvs_beside_it(profiled: dict, nsys: Path,
                                                                          tmp_path: Path):
    report = tmp_path / "someone_elses.nsys-rep"
    shutil.copy(f"{profiled['report']}.nsys-rep", report)  # the report alone: no export, no CSV, no record
    env = {**os.environ, "NSYS": str(nsys)}
    result = subprocess.run([sys.executable, str(HERE / "kernel_tables.py"), str(report)], capture_output=True,
                            text=True, env=env, timeout=300)
    assert result.returncode == 0, result.stderr
    for name in REPORTS:
        assert pr.nsys_report_path(tmp_path / "someone_elses", name).exists(), name
    assert (tmp_path / "someone_elses.sqlite").exists() and (tmp_path / "someone_elses.stats.log").exists()
    assert "forward = 'forward' x3" in result.stdout and "no stopwatch record" in result.stdout
    assert "cuda_gpu_kern_sum is empty: SKIPPED" in result.stderr  # what nsys said, passed on


def test_a_report_from_a_newer_nsys_is_one_line_naming_both_versions(profiled: dict, nsys: Path, tmp_path: Path):
    """The report's first line carries the version of the nsys that wrote it ("NVIDIA Tegra Profiler Report
    2023@4@4@..."); written as 2026.1.1, the real 2023.4.4 refuses it, as it refuses any newer report."""
    data = Path(f"{profiled['report']}.nsys-rep").read_bytes()
    head = data[:200].decode("latin-1")
    written = re.search(r"20\d\d@\d+@\d+@[0-9a-z-]+", head).group(0)
    newer = tmp_path / "newer.nsys-rep"
    newer.write_bytes(data.replace(written.encode(), b"2026@1@1@12-361234567890v0", 1))
    result = subprocess.run([sys.executable, str(HERE / "kernel_tables.py"), str(newer)], capture_output=True,
                            text=True, env={**os.environ, "NSYS": str(nsys)}, timeout=300)
    assert result.returncode == 2 and len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert "written by Nsight Systems 2026.1.1, newer than this nsys (2023.4.4" in result.stderr
    assert "install Nsight Systems 2026.1 or newer" in result.stderr
    assert "Report was created in Nsight Systems version" in (tmp_path / "newer.stats.log").read_text()
    junk = tmp_path / "junk.nsys-rep"
    junk.write_bytes(b"not a report at all")
    refused = subprocess.run([sys.executable, str(HERE / "kernel_tables.py"), str(junk)], capture_output=True,
                             text=True, env={**os.environ, "NSYS": str(nsys)}, timeout=300)
    assert refused.returncode == 2 and len(refused.stderr.strip().splitlines()) == 1
    assert "could not read" in refused.stderr and "Exportation error" in refused.stderr
