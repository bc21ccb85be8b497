"""nsys_run.sh: the plan, the `nsys profile` and `nsys export` command lines, reuse, skipping after an OOM, a failure
that loses no other configuration, the summary, usage errors, and signals (nsys and the profiled run stopped, the
temporary folder gone). Against a fake nsys (test_kernel_tables.FAKE_NSYS) and, where there is one, the real nsys
on the CPU: $REAL_NSYS (.ci/run sets it from ../shared/tools/get-nsys.sh), else nsys on PATH. A CPU build of torch
has no NVTX, so the real runs get one from a tiny library built here with gcc from the NVTX3 headers inside the nsys
package, which a sitecustomize.py on PYTHONPATH puts behind torch.cuda.nvtx (NVTX_SITECUSTOMIZE). Without nsys or gcc
those tests are skipped (-rs).
"""
from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

import kernel_tables as kt
import runner
from results import read_records
from test_kernel_tables import e2e_record, fake_nsys

HERE = Path(__file__).resolve().parent
SCRIPT = HERE / "nsys_run.sh"
STEPS, WARMUP = 3, 2
# the smallest model that still has every phase and attention sub-step: the run is about nsys, not the numbers
APP_ARGS = ["--device", "cpu", "--num-layers", "1", "--d-model", "64", "--num-heads", "4", "--d-ff", "128",
            "--vocab-size", "256", "--batch-size", "2", "--warmup", str(WARMUP), "--steps", str(STEPS)]


def find_real_nsys() -> tuple[Path | None, str]:
    """(the nsys binary, '') or (None, why there is none)."""
    candidate = os.environ.get("REAL_NSYS") or shutil.which("nsys")
    if not candidate:
        return None, "no real nsys: set REAL_NSYS (.ci/run fetches one with ../shared/tools/get-nsys.sh)"
    try:
        subprocess.run([candidate, "--version"], capture_output=True, timeout=60, check=True)
    except (OSError, subprocess.SubprocessError) as exc:
        return None, f"nsys at {candidate} does not run: {exc}"
    return Path(candidate), ""


# Imported by every Python that has its folder on PYTHONPATH: in bench_e2e.py on a CPU-only torch, torch's missing
# NVTX binding becomes NVTX_LIBRARY's nvtxRangePushA / nvtxRangePop, so the real nsys records the ranges.
NVTX_SITECUSTOMIZE = """
import os, sys
if sys.argv[0].endswith("bench_e2e.py"):
    import ctypes
    import torch.cuda.nvtx
    if torch.version.cuda is None:
        library = ctypes.CDLL(os.environ["NVTX_LIBRARY"])
        library.nvtxRangePushA.argtypes = [ctypes.c_char_p]

        class LibraryNVTX:
            def rangePushA(self, message):
                return library.nvtxRangePushA(message.encode())

            def rangePop(self):
                return library.nvtxRangePop()

        torch.cuda.nvtx._nvtx = LibraryNVTX()
"""


def nvtx_env(nsys: Path, folder: Path) -> dict[str, str]:
    """PYTHONPATH and NVTX_LIBRARY for NVTX_SITECUSTOMIZE: NVTX3's header-only implementation compiled with its API
    exported (what torch binds on a GPU); under nsys its calls reach nsys's injection library."""
    real = nsys.resolve()
    include = next((d for d in (real.parent / "nvtx" / "include", real.parent.parent / "target-linux-x64" / "nvtx" /
                                "include") if (d / "nvtx3" / "nvToolsExt.h").is_file()), None)
    if include is None or shutil.which("gcc") is None:
        pytest.skip(f"no gcc, or no NVTX3 headers beside {nsys}, to build the NVTX library a CPU run needs")
    (folder / "nvtx.c").write_text("#include <nvtx3/nvToolsExt.h>\n")
    subprocess.run(["gcc", "-shared", "-fPIC", "-O1", "-DNVTX_EXPORT_API",
                    '-DNVTX_DECLSPEC=__attribute__((visibility("default")))', f"-I{include}", "-o",
                    str(folder / "libnvtx.so"), str(folder / "nvtx.c"), "-ldl"], check=True, timeout=300)
    (folder / "sitecustomize.py").write_text(NVTX_SITECUSTOMIZE)
    path = os.pathsep.join(filter(None, [str(folder), os.environ.get("PYTHONPATH")]))
    return {"PYTHONPATH": path, "NVTX_LIBRARY": str(folder / "libnvtx.so")}


# ---- against the fake nsys ----


@pytest.fixture
def fake(tmp_path: Path, monkeypatch, capfd) -> dict:
    """The fake nsys first on PATH for this process, and run(*args) -> (exit status, stdout, stderr) of
    nsys_run.sh's Python side in it (the bench_e2e --dry-run check of a plan passes unless `check` is set)."""
    for name, value in fake_nsys(tmp_path / "fake").items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("NSYS", raising=False)
    monkeypatch.chdir(tmp_path)
    folder = tmp_path / "results"

    def run(*args: str, check: bool = False, **env: str) -> tuple[int, str, str]:
        with monkeypatch.context() as patch:
            for name, value in env.items():
                patch.setenv(name, value)
            if not check:
                patch.setattr(runner, "check_with_bench_e2e", lambda *_, **__: 0)
            try:
                status = runner.nsys_run_main(["--results-dir", str(folder), *args])
            except SystemExit as exc:
                status = exc.code
        captured = capfd.readouterr()
        return status, captured.out, captured.err

    return {"run": run, "log": tmp_path / "fake" / "calls.jsonl", "folder": folder / "nsys", "results": folder}


def calls(fake: dict, command: str) -> list[list[str]]:
    logged = fake["log"].read_text().splitlines() if fake["log"].exists() else []
    return [argv for argv in (json.loads(line)["argv"] for line in logged) if argv[0] == command and len(argv) > 2]


def profiled_reports(fake: dict) -> list[str]:
    """The report names of the `nsys profile` runs so far, in order."""
    return [Path(next(a for a in argv if a.startswith("--output="))[9:]).name for argv in calls(fake, "profile")]


def summaries(fake: dict) -> list[list[dict]]:
    """Each summary's rows, from its records (one per configuration)."""
    return [kt.summary_rows(read_records(p))
            for p in sorted(fake["folder"].glob("summary-*.jsonl"), key=lambda p: p.stat().st_mtime_ns)]


def test_profile_and_export_command_lines_and_the_files_beside_the_report(fake: dict):
    status, out, err = fake["run"]("tiny", "64")
    assert status == 0, err
    (profile,), (export,) = calls(fake, "profile"), calls(fake, "export")
    report = fake["folder"] / "tiny_ctx64_train"
    app, staged = profile.index(sys.executable), Path(next(a for a in profile if a.startswith("--output="))[9:])
    assert staged.name == report.name and staged.parent.parent == report.parent  # made beside, moved in when done
    assert set(profile[1:app]) == {"--trace=cuda,nvtx,osrt", "--capture-range=nvtx", "--nvtx-capture=measure",
                                   "--capture-range-end=stop", "--env-var=NSYS_NVTX_PROFILER_REGISTER_ONLY=0",
                                   "--force-overwrite=true", f"--output={staged}"}  # no backtraces unless asked
    assert profile[app + 1:app + 11] == [str(HERE / "bench_e2e.py"), "--size", "tiny", "--context-length", "64",
                                         "--mode", "train", "--nvtx", "--in-process", "--quiet"]
    assert profile[-4] == "--results-dir" and profile[-2:] == ["--out", "e2e"]
    assert export[-1] == f"{staged}.nsys-rep" and "--type=sqlite" in export
    assert json.loads(fake["log"].read_text().splitlines()[0])["register_only"] == "0"
    assert {p.name for p in fake["folder"].iterdir()} == {f"tiny_ctx64_train{s}" for s in (
        ".nsys-rep", ".sqlite", ".md", ".args", "_e2e.jsonl")}
    md = Path(f"{report}.md").read_text()
    assert md.startswith("device: ") and "### 2. Top kernels by GPU time: backward" in md
    assert "### 1. Phase times" in out and f"report: {report}.nsys-rep" in out


@pytest.mark.parametrize("args, env, name, flags", [
    (["--backtrace", "small", "128", "forward", "--", "--dtype", "bf16", "--steps", "3"], {},
     "small_ctx128_forward_bf16", ["--python-backtrace=cuda", "--cudabacktrace=all"]),
    (["--handout", "2025", "xl", "64"], {}, "xl_ctx64_train_h2025", []),
    (["xl", "64"], {"CS336_HANDOUT": " 2025"}, "xl_ctx64_train_h2025", []),
    (["--handout=2025", "--python-backtrace", "--cuda-memory-usage", "small", "32", "--pytorch=autograd-nvtx", "--",
      "--dtype=bf16"], {"FAKE_NSYS_PROFILE_OPTIONS": "--cuda-memory-usage --pytorch"},
     "small_ctx32_train_bf16_pytorch_cudamem_h2025", ["--pytorch=autograd-nvtx", "--cuda-memory-usage=true"]),
])
def test_options_reach_nsys_and_bench_e2e_and_name_the_report(fake: dict, args, env, name, flags):
    status, _, err = fake["run"](*args, **env)
    assert status == 0, err
    assert profiled_reports(fake) == [name]
    (argv,) = calls(fake, "profile")
    assert set(flags) <= set(argv)
    handout = "2025" if "2025" in name else "2026"
    assert argv[argv.index("--handout") + 1] == handout  # the handout reaches bench_e2e too
    if "--dtype" in args:
        assert argv[argv.index("--quiet") + 1:][:2] == ["--dtype", "bf16"]


def test_an_nsys_that_does_not_know_a_passed_flag_refuses_it_in_one_line(fake: dict):
    status, _, err = fake["run"]("--cuda-memory-usage=true", "--pytorch=autograd-nvtx", "tiny", "64",
                                 FAKE_NSYS_PROFILE_OPTIONS="--cuda-memory-usage")
    assert status == 2 and len(err.strip().splitlines()) == 1
    assert "2023.4.4" in err and "does not know --pytorch" in err and not profiled_reports(fake)


@pytest.mark.parametrize("args, message", [
    (["tiny"], "usage"), (["tiny", "0"], "CTX"), (["tiny", "64", "inference"], "MODE"),
    (["tiny", "64", "--", "--context-length", "128"], "--context-length after -- would reach bench_e2e.py"),
    (["tiny", "64", "--", "--dtype", "fp32", "bf16"], "one --dtype"),
    (["tiny", "64", "--", "--context", "128"], "--context after --: spell out --context-length"),
    (["tiny", "64", "--", "--dt=bf16"], "--dt after --: spell out --dtype"),
    (["--handout", "2024", "tiny", "64"], "invalid choice: '2024'"),
    (["tiny", "64", "--", "--handout", "2025"], "give sizes, contexts, modes, --handout"),
    (["tiny", "64", "--mode", "forward"], "not both"),
    (["--size", "--context-length", "64"], "--size: expected at least one argument"),
    (["--size", "tiny", "--context-length", "64", "0"], "CTX must be a positive integer"),
    (["--size", "tiny", "--mode", "forward", "inference"], "'inference'"),
    (["--size", "tiny", "--", "--compile", "off", "on"], "one --compile at a time"),
    (["--cuda-memory-usage=maybe", "tiny", "64"], "--cuda-memory-usage: invalid choice: 'maybe'"),
    (["tiny", "64", "--pytorch="], "--pytorch needs a value"),
    (["tiny", "64", "--", "--dry-run"], "--dry-run after --"), (["tiny", "64", "--", "--out=x"], "--out after --"),
    (["huge", "64"], "unknown preset 'huge'"),
    (["../../escaped", "64"], "SIZE must be a preset name"),  # names that would leave the results folder
    (["tiny", "64", "--", "--dtype", "../../../escaped"], "--dtype must be"),
])
def test_usage_errors_exit_2_in_one_line_before_nsys_is_asked(fake: dict, args: list[str], message: str):
    status, _, err = fake["run"](*args)
    assert status == 2 and message in err and len(err.strip().splitlines()) == 1
    assert not fake["log"].exists() and not fake["results"].exists()


def test_with_no_configuration_the_handouts_nsys_profile_plans():
    plan_2025 = runner.parse_nsys_run_args(["--handout", "2025"]).plan
    sizes_2025 = ("small", "medium", "large", "xl", "2.7B")
    assert [(c.size, c.context_length, c.mode) for c in plan_2025] == [
        (s, ctx, m) for s in sizes_2025 for ctx in (128, 256, 512, 1024) for m in ("forward", "train")]
    assert Path(plan_2025[0].report).name == "small_ctx128_forward_h2025"
    plan_2026 = runner.parse_nsys_run_args([]).plan
    assert [(c.size, c.context_length) for c in plan_2026[::2]] == [(s, c) for s in ("small", "medium") for c in (256, 512, 1024)]


def test_missing_nsys_exits_2_with_what_to_install_and_the_torch_profiler_command(fake: dict, tmp_path: Path):
    status, _, err = fake["run"]("tiny", "64", PATH=str(tmp_path / "nothing"))
    assert status == 2 and "Nsight Systems" in err and "install" in err
    assert "python3 bench_e2e.py --size tiny --context-length 64 --mode train --profile" in err
    status, _, err = fake["run"]("tiny", "64", NSYS=str(tmp_path / "no-such-nsys"))
    assert status == 2 and "NSYS=" in err and not fake["log"].exists()


@pytest.mark.parametrize("env, status, message", [
    ({"FAKE_NSYS_APP_STATUS": "7"}, 7, "failed with exit status 7"),
    ({"FAKE_NSYS_RECORD": json.dumps(e2e_record(status="OOM"))}, 1, '"status": "OOM"'),
    ({"FAKE_NSYS_NO_CAPTURE": "1"}, 1, "the 'measure' range never started"),
])
def test_a_configuration_without_a_report_says_why_and_is_not_exported(fake: dict, env: dict, status: int,
                                                                        message: str):
    result, _, err = fake["run"]("tiny", "64", **env)
    assert result == status and message in err and not calls(fake, "export")


def test_several_configurations_one_nsys_run_each_then_one_summary(fake: dict):
    status, out, err = fake["run"]("--size", "tiny", "small", "--context-length", "64", "32", "--mode", "train")
    assert status == 0, err
    plan = [f"{size}_ctx{ctx}_train" for size in ("tiny", "small") for ctx in (32, 64)]
    assert profiled_reports(fake) == plan  # contexts ascending within a size, so that an OOM can skip the larger ones
    assert [Path(argv[-1]).name for argv in calls(fake, "export")] == [f"{name}.nsys-rep" for name in plan]
    (rows,) = summaries(fake)
    assert [(row["size"], row["context_length"]) for row in rows] == [("tiny", 32), ("tiny", 64), ("small", 32),
                                                                       ("small", 64)]
    assert all(row["runs"] == {"train": "ok"} and row["forward_from"] == "train" and row["matmul_pct_train_step"]
               for row in rows)
    assert "### nsys_run.sh summary" in out


def test_reports_are_reused_replaced_with_force_and_kept_when_made_with_other_arguments(fake: dict):
    args = ("--size", "tiny", "--context-length", "32", "64", "--mode", "forward")
    assert fake["run"](*args)[0] == 0
    status, out, err = fake["run"](*args)
    assert status == 0 and err.count("reusing") == 2 and out.count("### 1. Phase times") >= 2
    assert profiled_reports(fake) == ["tiny_ctx32_forward", "tiny_ctx64_forward"] and len(summaries(fake)) == 2
    report = fake["folder"] / "tiny_ctx64_forward"
    made_with = Path(f"{report}.args").read_text()
    status, _, err = fake["run"]("tiny", "64", "forward", "--", "--steps", "3")
    assert status == 1 and "made with other arguments" in err and "--force" in err
    assert len(err.strip().splitlines()) == 1, err  # one configuration refused: one line
    assert len(profiled_reports(fake)) == 2 and Path(f"{report}.args").read_text() == made_with
    assert fake["run"]("--force", "tiny", "64", "forward", "--", "--steps", "3")[0] == 0
    assert profiled_reports(fake)[2:] == ["tiny_ctx64_forward"] and "--steps 3" in Path(f"{report}.args").read_text()


def test_a_reused_reports_tables_replace_a_link_at_its_md_never_the_file_it_names(fake: dict, tmp_path: Path):
    assert fake["run"]("tiny", "64")[0] == 0
    notes, md = tmp_path / "notes.md", fake["folder"] / "tiny_ctx64_train.md"
    notes.write_text("the student's writeup\n")
    md.unlink()
    md.symlink_to(notes)
    status, _, err = fake["run"]("tiny", "64")
    assert status == 0 and "reusing" in err and notes.read_text() == "the student's writeup\n"
    assert not md.is_symlink() and "### 1. Phase times" in md.read_text()


def test_a_broken_export_beside_a_reused_report_says_what_works_here(fake: dict):
    assert fake["run"]("tiny", "64")[0] == 0
    export = fake["folder"] / "tiny_ctx64_train.sqlite"
    export.write_bytes(b"not sqlite at all")
    status, _, err = fake["run"]("tiny", "64")
    assert status == 1 and "move it away for a fresh export" in err and "--export-dir" not in err
    export.unlink()  # the advice, followed
    assert fake["run"]("tiny", "64")[0] == 0 and export.is_file()


def test_an_oom_skips_the_larger_contexts_of_that_size_and_mode_unless_no_skip(fake: dict):
    oom = json.dumps(e2e_record(status="OOM"))
    args = ("--size", "tiny", "--context-length", "16", "32", "64", "--mode", "forward", "train")
    status, _, err = fake["run"](*args, FAKE_NSYS_MATCH="ctx32_forward", FAKE_NSYS_OOM_RECORD=oom)
    assert status == 1  # not every configuration has its tables
    assert profiled_reports(fake) == ["tiny_ctx16_forward", "tiny_ctx16_train", "tiny_ctx32_forward",
                                      "tiny_ctx32_train", "tiny_ctx64_train"]  # per size and mode
    assert "tiny ctx=64 forward: skipped: OOM at context_length=32" in err
    (rows,) = summaries(fake)
    assert [row["runs"]["forward"] for row in rows] == ["ok", "OOM", "skipped: OOM at context_length=32"]
    assert fake["run"]("--no-skip", "--force", *args, FAKE_NSYS_MATCH="ctx32_forward", FAKE_NSYS_OOM_RECORD=oom)[0] == 1
    assert len(profiled_reports(fake)) == 11


def test_a_failing_configuration_loses_none_of_the_others_and_a_refusal_leaves_nothing(fake: dict):
    args = ("--size", "tiny", "--context-length", "32", "64", "--mode", "train")
    status, _, _ = fake["run"](*args, FAKE_NSYS_APP_STATUS="7", FAKE_NSYS_MATCH="ctx32")
    assert status == 7  # the first failure's status, after every configuration ran
    assert profiled_reports(fake) == ["tiny_ctx32_train", "tiny_ctx64_train"]
    (rows,) = summaries(fake)
    assert [row["runs"]["train"] for row in rows] == ["failed: the profiled run's exit status was 7", "ok"]
    # bench_e2e's usage error (exit 2): nothing of a refused configuration is kept, the earlier profile stays as it
    # was, and the summary says so
    earlier = {p.name: p.read_bytes() for p in fake["folder"].glob("tiny_ctx*_train*")}
    status, _, err = fake["run"]("--force", *args, FAKE_NSYS_APP_STATUS="2")
    assert status == 2 and "refused its arguments" in err and len(profiled_reports(fake)) == 4
    assert {p.name: p.read_bytes() for p in fake["folder"].glob("*_train*")} == earlier and ".tiny_ctx64" not in str(
        list(fake["folder"].iterdir())) and "tiny_ctx64_train.nsys-rep" in earlier
    assert [row["runs"]["train"] for row in summaries(fake)[1]] == ["refused: bench_e2e.py's usage error (exit "
                                                                    "status 2)"] * 2


def test_a_staging_folder_left_by_kill_9_is_removed_by_the_next_run_and_no_other(fake: dict):
    """kill -9 leaves the hidden folder a profile was made in; the next run of that report removes it when its
    process on this machine is gone, and leaves a live run's, another machine's and a folder not named by us."""
    gone = subprocess.Popen([sys.executable, "-c", ""])
    gone.wait()
    host = socket.gethostname()
    fake["folder"].mkdir(parents=True)
    names = {"dead": f".tiny_ctx64_train.partial-{host}-{gone.pid}-abc_1234", "mine": f".tiny_ctx64_train.partial-"
             f"{host}-{os.getpid()}-abc_1234", "elsewhere": f".tiny_ctx64_train.partial-other-host-{gone.pid}-x",
             "unnamed": ".tiny_ctx64_train.partial-abc_1234", "other report": f".tiny_ctx32_train.partial-{host}-"
             f"{gone.pid}-abc_1234"}
    for name in names.values():
        (fake["folder"] / name).mkdir()
        (fake["folder"] / name / "tiny_ctx64_train.nsys-rep").write_bytes(b"partial")
    assert fake["run"]("tiny", "64")[0] == 0
    left = {p.name for p in fake["folder"].iterdir() if ".partial-" in p.name}
    assert left == {names[k] for k in ("mine", "elsewhere", "unnamed", "other report")}


def test_an_earlier_profile_is_replaced_only_once_the_new_one_exists_and_an_orphan_is_never_reused(
        fake: dict, monkeypatch):
    """The student's earlier report, export and tables stay as they were through a profile interrupted in nsys,
    one that failed, and one whose wrapper was killed (its report left where nsys wrote it, no marker)."""
    assert fake["run"]("tiny", "64")[0] == 0
    earlier = {p.name: p.read_bytes() for p in fake["folder"].iterdir()}
    assert set(earlier) == {f"tiny_ctx64_train{s}" for s in (".nsys-rep", ".sqlite", ".md", ".args", "_e2e.jsonl")}
    profile = runner.run_under_nsys

    def interrupted(config, args, nsys, staging) -> int:
        profile(config, args, nsys, staging)  # nsys has written the new report beside
        assert (staging / "tiny_ctx64_train.nsys-rep").is_file()
        raise KeyboardInterrupt

    monkeypatch.setattr(runner, "run_under_nsys", interrupted)
    assert fake["run"]("--force", "tiny", "64")[0] == 130
    monkeypatch.setattr(runner, "run_under_nsys", profile)
    assert fake["run"]("--force", "tiny", "64", FAKE_NSYS_APP_STATUS="7")[0] == 7
    assert {p.name: p.read_bytes() for p in fake["folder"].iterdir()} == earlier  # no staging folder left either
    # a wrapper killed with -9 after nsys wrote the report: the .args of an older layout, or a marker for another
    # report, never makes it ours: it is kept, and the profile takes the next name
    report, args = fake["folder"] / "tiny_ctx64_train.nsys-rep", fake["folder"] / "tiny_ctx64_train.args"
    args.write_text(args.read_text().splitlines()[0] + "\n")
    status, _, err = fake["run"]("tiny", "64")
    assert status == 0 and "not made by nsys_run.sh" in err and profiled_reports(fake)[3:] == ["tiny_ctx64_train-2"]
    args.write_bytes(earlier["tiny_ctx64_train.args"])
    report.write_bytes(report.read_bytes() + b"more than the complete one held")
    status, _, err = fake["run"]("tiny", "64")
    assert status == 0 and "reusing" in err and "tiny_ctx64_train-2" in err and len(profiled_reports(fake)) == 4
    assert (fake["folder"] / "tiny_ctx64_train.md").read_bytes() == earlier["tiny_ctx64_train.md"]


def test_a_students_files_at_a_reports_name_are_kept_and_the_profile_takes_the_next_name(fake: dict, monkeypatch):
    """Files nsys_run.sh did not make (no completion marker names a report beside them), there before the sweep or
    made during it, are never replaced, with --force too: the profile is <name>-2, said in one line, and reused
    under that name."""
    fake["folder"].mkdir(parents=True)
    mine = {"tiny_ctx16_train.sqlite": b"my own export", "tiny_ctx16_train.md": b"# my notes\n",
            "tiny_ctx16_train.args": b"my arguments\n"}
    for name, data in mine.items():
        (fake["folder"] / name).write_bytes(data)
    profile = runner.run_under_nsys

    def a_students_file_meanwhile(config: runner.NsysConfig, *args) -> int:
        (fake["folder"] / "tiny_ctx32_train.md").write_bytes(b"written during the sweep\n")
        return profile(config, *args)

    monkeypatch.setattr(runner, "run_under_nsys", a_students_file_meanwhile)
    status, out, err = fake["run"]("--size", "tiny", "--context-length", "16", "32", "--mode", "train")
    monkeypatch.setattr(runner, "run_under_nsys", profile)
    mine["tiny_ctx32_train.md"] = b"written during the sweep\n"
    assert status == 0, err
    assert profiled_reports(fake) == ["tiny_ctx16_train-2", "tiny_ctx32_train-2"]
    (note,) = [line for line in err.splitlines() if "tiny_ctx16" in line and "profiling" not in line]
    assert "tiny_ctx16_train.sqlite" in note and "not made by nsys_run.sh" in note and note.endswith(
        f"this profile is {fake['folder'] / 'tiny_ctx16_train-2'}")
    assert (fake["folder"] / "tiny_ctx16_train-2.md").read_text().startswith("device: ")
    assert [(row["size"], row["context_length"]) for row in summaries(fake)[0]] == [("tiny", 16), ("tiny", 32)]
    status, out, _ = fake["run"]("--dry-run", "tiny", "16")
    assert status == 0 and "-> " + str(fake["folder"] / "tiny_ctx16_train-2") + ": reuse" in out
    assert fake["run"]("--force", "tiny", "16")[0] == 0
    assert profiled_reports(fake)[2:] == ["tiny_ctx16_train-2"]
    assert {name: (fake["folder"] / name).read_bytes() for name in mine} == mine


def test_an_interrupted_sweep_keeps_the_summary_of_the_reports_made(fake: dict, monkeypatch):
    profile = runner.run_under_nsys

    def interrupted_at_64(config: runner.NsysConfig, *args) -> int:
        if config.context_length == 64:
            raise KeyboardInterrupt  # Ctrl-C while nsys runs
        return profile(config, *args)

    monkeypatch.setattr(runner, "run_under_nsys", interrupted_at_64)
    status, _, err = fake["run"]("--size", "tiny", "--context-length", "32", "64", "--mode", "train")
    assert status == 130 and "nsys and the profiled run stopped" in err
    (rows,) = summaries(fake)  # written as each report finished
    assert [(row["context_length"], row["runs"]) for row in rows] == [(32, {"train": "ok"})]
    (md,) = fake["folder"].glob("summary-*.md")
    assert "| tiny   |    32 |" in md.read_text()
    assert not list(fake["folder"].glob("tiny_ctx64_train*"))  # nothing of the interrupted profile


def test_dry_run_lists_the_plan_checked_by_bench_e2e_and_a_bad_option_fails_before_nsys(fake: dict):
    assert fake["run"]("tiny", "32", "forward")[0] == 0
    status, out, err = fake["run"]("--dry-run", "--size", "tiny", "--context-length", "64", "32", "--mode",
                                   "forward", "train", check=True)
    assert status == 0, err
    lines = [re.sub(r"^\s*\d+\. (.*) -> \S+: (.*)$", r"\1: \2", line) for line in out.splitlines()
             if re.match(r"^\s*\d+\. .* -> ", line)]
    assert lines == ["tiny ctx=32 forward: reuse the existing report", "tiny ctx=32 train: profile",
                     "tiny ctx=64 forward: profile", "tiny ctx=64 train: profile"]
    assert "configurations would run" in out and "nothing was profiled or written" in out
    assert "checked by bench_e2e.py --dry-run (its plan for --mode forward alone" in out.split("would run")[0]
    assert len(profiled_reports(fake)) == 1  # nsys not asked to profile anything more
    status, _, err = fake["run"]("--size", "tiny", "--context-length", "16", "32", "--", "--no-such-option",
                                 check=True)
    assert status == 2 and "--no-such-option" in err and len(profiled_reports(fake)) == 1
    status, _, err = fake["run"]("tiny", "16", "--", "--no-such-option", check=True)  # one configuration too
    assert status == 2 and len(err.strip().splitlines()) == 1 and len(profiled_reports(fake)) == 1, err


def test_help_runs_with_the_interpreter_named_by_python(tmp_path: Path):
    env = {**os.environ, "PYTHON": sys.executable, "PATH": str(tmp_path)}  # no python3 on PATH
    result = subprocess.run(["/bin/bash", str(SCRIPT), "--help"], capture_output=True, text=True, env=env, timeout=60)
    assert result.returncode == 0 and "nsys_run.sh" in result.stdout and "--cuda-memory-usage" in result.stdout
    env["PYTHON"] = "/nonexistent/python3"
    result = subprocess.run(["/bin/bash", str(SCRIPT), "tiny", "16"], capture_output=True, text=True, env=env)
    assert result.returncode == 2 and "PYTHON=/nonexistent/python3 is not a Python interpreter" in result.stderr


# ---- signals: nsys and the profiled run stopped, the temporary folder gone (real nsys where there is one) ----


def live_processes_naming(marker: str) -> list[str]:
    """Command lines of the running (not zombie) processes that hold `marker`."""
    found = []
    for proc in Path("/proc").iterdir():
        try:
            if proc.name.isdigit() and int(proc.name) != os.getpid() and \
                    (proc / "stat").read_text().rsplit(")", 1)[1].split()[0] != "Z":
                cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
                found += [cmdline] if marker in cmdline else []
        except OSError:
            continue
    return found


def hangup_as_in_a_terminal() -> None:
    """SIGHUP's and SIGINT's default actions in the child, as in a terminal, also when the tests run under nohup
    (which ignores SIGHUP) or in the background of a script (which ignores SIGINT)."""
    signal.signal(signal.SIGHUP, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@pytest.fixture(scope="module")
def nsys() -> Path:
    path, reason = find_real_nsys()
    if path is None:
        pytest.skip(reason)
    return path


@pytest.fixture(scope="module")
def real_env(nsys: Path, tmp_path_factory) -> dict[str, str]:
    """The environment of a real nsys_run.sh on the CPU: the real nsys and an NVTX library built for it."""
    nvtx = nvtx_env(nsys, tmp_path_factory.mktemp("nvtx"))
    return {**os.environ, "NSYS": str(nsys), "PYTHON": sys.executable, **nvtx}


SIGNALS = [signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGKILL]


def test_a_signal_stops_nsys_and_the_profiled_run_and_removes_the_temporary_folder(tmp_path: Path, request):
    """Each signal to its own nsys_run.sh, the four run side by side (each is seconds of imports)."""
    if find_real_nsys()[0] is not None:
        env = request.getfixturevalue("real_env")
    else:
        env = {**fake_nsys(tmp_path / "fake"), "FAKE_NSYS_RUN_APP": "1"}
    runs = {}
    for sig in SIGNALS:
        folder = tmp_path / sig.name
        (folder / "tmp").mkdir(parents=True)
        runs[sig] = folder, subprocess.Popen(
            ["bash", str(SCRIPT), "--results-dir", str(folder / "results"), "tiny", "16", "--", *APP_ARGS,
             "--steps", "1000000"], env={**env, "TMPDIR": str(folder / "tmp")}, stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE, text=True, preexec_fn=hangup_as_in_a_terminal)
    try:
        for sig, (folder, proc) in runs.items():
            deadline = time.monotonic() + 120
            while not [c for c in live_processes_naming(str(folder / "tmp")) if "bench_e2e.py" in c]:
                assert proc.poll() is None and time.monotonic() < deadline, \
                    (sig.name, proc.stderr.read() if proc.poll() else "timeout")
                time.sleep(0.2)
        time.sleep(1)  # the profiled runs are under way
        for sig, (_, proc) in runs.items():
            proc.send_signal(sig)
        for sig, (folder, proc) in runs.items():
            _, err = proc.communicate(timeout=120)
            if sig == signal.SIGKILL:  # nothing of it runs on: its watchdog stops nsys's process group
                deadline = time.monotonic() + 60
                while live_processes_naming(str(folder)) and time.monotonic() < deadline:
                    time.sleep(0.2)
                assert live_processes_naming(str(folder)) == []
                assert not list((folder / "results" / "nsys").glob("tiny*"))  # no report, no marker to reuse
                continue
            assert proc.returncode == 128 + (signal.SIGINT if sig == signal.SIGINT else sig), (sig.name, err)
            assert "nsys and the profiled run stopped" in err, sig.name
            time.sleep(0.5)
            assert live_processes_naming(str(folder)) == [], sig.name  # nsys, bench_e2e and their children
            assert list((folder / "tmp").glob("nsys_run-*")) == [], sig.name  # the run's temporary folder is gone
            assert not (folder / "results").exists(), sig.name  # a partial report is no report to reuse
    finally:  # a failed check leaves no run behind
        for _, proc in runs.values():
            if proc.poll() is None:
                proc.kill()
                proc.wait()


# ---- the real nsys on the CPU: a real report, its export, and what nsys refuses ----


@pytest.fixture(scope="module")
def profiled(real_env: dict, tmp_path_factory) -> dict:
    """One real nsys_run.sh of a tiny training step on the CPU, shared by the tests below."""
    folder = tmp_path_factory.mktemp("results")
    result = subprocess.run(["bash", str(SCRIPT), "--results-dir", str(folder), "tiny", "16", "train", "--",
                             *APP_ARGS], capture_output=True, text=True, env=real_env, timeout=300)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return {"result": result, "report": folder / "nsys" / "tiny_ctx16_train", "folder": folder / "nsys"}


def test_a_real_run_leaves_the_report_its_export_the_record_and_the_tables(profiled: dict):
    report, result = profiled["report"], profiled["result"]
    assert {p.name for p in profiled["folder"].iterdir()} == {f"{report.name}{s}" for s in (
        ".nsys-rep", ".sqlite", ".md", ".args", "_e2e.jsonl", "_e2e.md")}
    assert f"report: {report}.nsys-rep" in result.stdout and f"wrote {report}_e2e.md" in result.stdout
    assert "nsys_run-" not in result.stdout + result.stderr  # never the temporary folder's name
    assert "fwd ms" in Path(f"{report}_e2e.md").read_text()  # bench_e2e's own table, kept beside


def test_the_capture_holds_the_measured_steps_and_no_warmup(profiled: dict):
    profile = kt.load_nsys(f"{profiled['report']}.sqlite")  # nsys 2023.4.4's own export
    names = [r.name for r in profile.ranges]
    assert names.count("measure") == 1 and "warmup" not in names  # the capture range is "measure"
    assert all(names.count(phase) == STEPS for phase in kt.PHASES)  # the warm-up's steps are not in the report
    (record,) = read_records(f"{profiled['report']}_e2e.jsonl")
    assert record["config"]["warmup"] == WARMUP and len(record["step_ms"]) == STEPS


def real_tables(report: Path) -> tuple:
    """The real report's export, its bench_e2e record, and the tables kernel_tables builds from the two."""
    profile, (record,) = kt.load_nsys(f"{report}.sqlite"), read_records(f"{report}_e2e.jsonl")
    return profile, record, kt.build_tables(profile, kt.stopwatch_ms(record))


def test_real_nvtx_ranges_make_the_phase_table_beside_the_stopwatch(profiled: dict):
    report = profiled["report"]
    profile, record, tables = real_tables(report)
    phases = {row["phase"]: row for row in tables["phases"]}
    assert list(phases) == ["forward", "backward", "optimizer", "step"] and tables["steps"] == STEPS
    for name, row in phases.items():
        if name != "step":  # each NVTX range holds its stopwatch's interval, and the verdict follows the ratio
            ranges_ms = [r.duration_ns / 1e6 for r in sorted(profile.ranges, key=lambda r: r.start_ns)
                         if r.name == name]
            ratios = [r / s for r, s in zip(ranges_ms, record[f"{name}_ms"], strict=True)]
            # a step preempted between the push and the clock passes 10% on a loaded machine; not the least disturbed
            assert min(ratios) >= 0.999 and min(ratios) - 1 < kt.AGREEMENT, (name, ratios)
            assert row["agrees"] == ("yes" if abs(row["ratio"] - 1) <= kt.AGREEMENT else "NO"), row
        else:  # the measured region over the steps also holds what runs between them: only ever longer
            assert 0.95 < row["ratio"] < 2.0 and "step = the measured region" in tables["ranges_used"], row
    md = Path(f"{report}.md").read_text()
    assert md.startswith("device: ") and "### 1. Phase times (mean per step over 3 steps)" in md
    assert kt.NO_KERNELS in md and "### 2." not in md  # a CPU: no kernels, said rather than tabulated


def test_the_summary_of_a_real_report_says_why_the_kernel_columns_are_empty(profiled: dict, tmp_path: Path, capsys):
    assert kt.main(["--summary", str(profiled["report"]), "--results-dir", str(tmp_path)]) == 0
    (row,) = kt.summary_rows(read_records(next((tmp_path / "nsys").glob("summary-*.jsonl"))))
    assert row["runs"]["train"] in ("ok", "noisy") and row["forward_from"] == "train"
    # the phase table's forward row, whose agreement with the stopwatch the test above checks
    forward = next(r for r in real_tables(profiled["report"])[2]["phases"] if r["phase"] == "forward")
    assert (row["forward_nsight_ms"], row["forward_stopwatch_ms"]) == (forward["range_ms"], forward["stopwatch_ms"])
    assert row["top_forward_kernel"] is None and row["matmul_pct_forward"] is None
    assert "no CUDA kernel data in these reports" in capsys.readouterr().out


def test_kernel_tables_exports_a_real_report_and_refuses_in_one_line_what_nsys_cannot_read(
        profiled: dict, nsys: Path, tmp_path: Path, monkeypatch, capsys):
    monkeypatch.setenv("NSYS", str(nsys))
    report = tmp_path / "someone_elses.nsys-rep"
    shutil.copy(f"{profiled['report']}.nsys-rep", report)  # the report alone: no export, no record
    assert kt.main([str(report)]) == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["someone_elses.nsys-rep", "someone_elses.sqlite"]
    assert "forward = 'forward' x3" in capsys.readouterr().out
    # written by a newer nsys (its first bytes carry the version): one line naming both versions
    data = report.read_bytes()
    written = re.search(rb"20\d\d@\d+@\d+@[0-9a-z-]+", data[:200]).group(0)
    newer = tmp_path / "newer.nsys-rep"
    newer.write_bytes(data.replace(written, b"2026@1@1@12-361234567890v0", 1))
    assert kt.main([str(newer)]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1
    assert "written by Nsight Systems 2026.1.1, newer than this nsys (2023.4.4" in err
    # no report at all, beside a student's older export and CSV: one line, their files as they were
    (tmp_path / "junk.sqlite").write_bytes(b"the student's export")
    (tmp_path / "junk_cuda_gpu_trace.csv").write_text("the student's CSV\n")
    os.utime(tmp_path / "junk.sqlite", (1, 1))
    (tmp_path / "junk.nsys-rep").write_bytes(b"not a report at all")
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    assert kt.main([str(tmp_path / "junk.nsys-rep")]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "could not read" in err
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before


def test_arguments_the_profiled_run_refuses_exit_2_and_leave_nothing_behind(real_env: dict, tmp_path: Path):
    result = subprocess.run(["bash", str(SCRIPT), "--results-dir", str(tmp_path), "tiny", "16", "--", *APP_ARGS,
                             "--steps", "0"], capture_output=True, text=True, env=real_env, timeout=300)
    assert result.returncode == 2  # bench_e2e's own exit status for its usage error, before nsys starts
    assert "bench_e2e.py: error: argument --steps" in result.stderr and len(result.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "nsys").exists()  # no .args, no report folder


def test_nsys_2023_4_knows_cuda_memory_usage_but_not_pytorch(real_env: dict, nsys: Path, tmp_path: Path):
    known = subprocess.run([str(nsys), "profile", "--help"], capture_output=True, text=True, timeout=60).stdout
    assert "--cuda-memory-usage=" in known
    if "--pytorch=" in known:
        pytest.skip(f"this nsys ({nsys}) knows --pytorch; the refusal is tested against the fake")
    result = subprocess.run(["bash", str(SCRIPT), "--results-dir", str(tmp_path), "--cuda-memory-usage=true",
                             "--pytorch=autograd-nvtx", "tiny", "16"], capture_output=True, text=True, env=real_env,
                            timeout=120)
    assert result.returncode == 2 and len(result.stderr.strip().splitlines()) == 1
    assert "does not know --pytorch" in result.stderr and "Nsight Systems version" in result.stderr
    assert not (tmp_path / "nsys").exists()
