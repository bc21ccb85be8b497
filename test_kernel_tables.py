"""kernel_tables.py: reading nsys SQLite exports (a scenario written in the real export's schema, checked against
../shared/realdata's) and torch.profiler traces; the classifier on every family of real kernel names; phases from
anyone's range names; the four tables; the command line, what it exports and never touches (#28), and --summary.
nsys_run.sh itself: test_nsys.py."""
from __future__ import annotations

import gzip
import json
import os
import re
import sqlite3
import subprocess
import sys
import zlib
from pathlib import Path

import pytest

import bench_e2e
import common
import kernel_tables as kt
import results
from kernel_tables import Activity, Profile, Range

HERE = Path(__file__).resolve().parent
REALDATA = next((f for f in (HERE.parent / "shared" / "realdata", HERE.parent.parent / "shared" / "realdata")
                 if f.is_dir()), None)

# ---- the scenario: an nsys capture of two measured train steps ----
# Two measured train steps. Backward kernels are launched from the autograd worker thread (AUTOGRAD), not the
# thread that opened the "backward" range (MAIN); one of them runs on the GPU after that range has closed.
MAIN, AUTOGRAD, PID = 4242, 4250, 4242
STEP_NS = 1_000_000
MEASURE = (1_000_000, 3_000_000)
COMMA_KERNEL = ("void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float>, "
                "at::detail::Array<char *, 3>>(int, at::native::CUDAFunctor_add<float>, at::detail::Array<char *, 3>)")
QUOTE_KERNEL = 'void my_kernel<"a, b">(int)'
SGEMM = "ampere_sgemm_128x64_tn"
XMMA = ("sm80_xmma_gemm_f32f32_f32f32_f32_nn_n_tilesize128x128x8_stage3_warpsize2x2x1_ffma_aligna4_alignc4_"
        "execute_kernel__5x_cublas")
WHERE_KERNEL = ("void at::native::elementwise_kernel<128, 2, at::native::gpu_kernel_impl_nocast<"
                "at::native::where_kernel_impl(at::TensorIterator&)::{lambda()#1}::operator()() const::"
                "{lambda(bool, float, float)#1}>(at::TensorIteratorBase&, const at::native::where_kernel_impl("
                "at::TensorIterator&)::{lambda()#1}::operator()() const::{lambda(bool, float, float)#1} &)::"
                "{lambda(int)#1}>(int, T3)")
MAX_REDUCE = ("void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float, at::native::MaxOps<float>, "
              "unsigned int, float, 4>>(T3)")
SOFTMAX = ("void at::native::(anonymous namespace)::cunn_SoftMaxForward<4, float, float, float, "
           "at::native::(anonymous namespace)::SoftMaxForwardEpilogue>(T4 *, const T2 *, int)")
SUM_REDUCE = ("void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float, at::native::func_wrapper_t<float, "
              "at::native::sum_functor<float, float, float>::operator ()(at::TensorIterator &)::{lambda(float, "
              "float)#1}>, unsigned int, float, 4>>(T3)")
DIRECT_COPY = ("void at::native::elementwise_kernel<128, 2, at::native::gpu_kernel_impl_nocast<"
               "at::native::direct_copy_kernel_cuda(at::TensorIteratorBase &)::{lambda()#3}::operator ()() const::"
               "{lambda()#7}::operator ()() const::{lambda(float)#1}>(at::TensorIteratorBase &, const T1 &)::"
               "{lambda(int)#1}>(int, T3)")
FOREACH = ("void at::native::<unnamed>::multi_tensor_apply_kernel<at::native::<unnamed>::TensorListMetadata<2>, "
           "at::native::<unnamed>::BinaryOpListAlphaFunctor<float, 2, 2, 0>, std::plus<float>, float>(T1, T2, T3, T4)")
MEMSET = "[CUDA memset]"

# (offset in the step, launching thread, name, GPU start offset, duration ns), the range that contains the launch
STEP_LAUNCHES = [
    (20_000, MAIN, COMMA_KERNEL, 25_000, 5_000),  # forward
    (70_000, MAIN, SGEMM, 72_000, 20_000),  # computing attention scores
    (90_000, MAIN, WHERE_KERNEL, 93_000, 2_000),  # computing attention scores (the mask)
    (120_000, MAIN, MAX_REDUCE, 121_000, 4_000),  # computing softmax
    (130_000, MAIN, SOFTMAX, 131_000, 6_000),  # computing softmax
    (170_000, MAIN, SGEMM, 172_000, 20_000),  # final matmul
    (250_000, MAIN, QUOTE_KERNEL, 251_000, 1_000),  # forward
    (350_000, AUTOGRAD, XMMA, 352_000, 40_000),  # backward, from the autograd thread
    (400_000, AUTOGRAD, SUM_REDUCE, 402_000, 8_000),  # backward
    (690_000, AUTOGRAD, DIRECT_COPY, 720_000, 10_000),  # backward launch, runs after the range closed
    (750_000, MAIN, FOREACH, 751_000, 30_000),  # optimizer
    (950_000, MAIN, MEMSET, 951_000, 1_000),  # between steps: inside measure, outside the phases
]
STEP_RANGES = [  # (name, start offset, end offset, nesting level)
    ("forward", 0, 300_000, 1), ("scaled dot product attention", 50_000, 200_000, 2),
    ("computing attention scores", 60_000, 100_000, 3), ("computing softmax", 110_000, 150_000, 3),
    ("final matmul", 160_000, 190_000, 3), ("backward", 300_000, 700_000, 1), ("optimizer", 700_000, 900_000, 1),
]
WARMUP_KERNEL_NS = 999_000  # launched in a warm-up forward before "measure": must never be counted


def scenario() -> tuple[list[tuple], list[tuple]]:
    """(ranges as (name, start, end, tid, level), launches as (corr, api start, tid, name, gpu start, dur))."""
    ranges = [("forward", 100_000, 200_000, MAIN, 0), ("measure", *MEASURE, MAIN, 0)]
    launches = [(1, 150_000, MAIN, SGEMM, 160_000, WARMUP_KERNEL_NS)]
    for step in range(2):
        base = MEASURE[0] + step * STEP_NS + 10_000
        ranges += [(name, base + a, base + b, MAIN, level) for name, a, b, level in STEP_RANGES]
        launches += [(100 + 20 * step + i, base + at, tid, name, base + gpu, dur)
                     for i, (at, tid, name, gpu, dur) in enumerate(STEP_LAUNCHES)]
    return ranges, launches


API_NS = 3_000  # duration of every launch call
GPU = "NVIDIA H100 80GB HBM3"
# The columns kernel_tables reads, a subset of a real export's (test_the_fixture_has_the_columns_of_a_real_export)
SCHEMA = {
    "StringIds": "id INTEGER PRIMARY KEY, value TEXT NOT NULL",
    "CUPTI_ACTIVITY_KIND_KERNEL": "start INTEGER NOT NULL, end INTEGER NOT NULL, correlationId INTEGER, "
                                  "globalPid INTEGER, demangledName INTEGER NOT NULL, shortName INTEGER NOT NULL",
    "CUPTI_ACTIVITY_KIND_MEMSET": "start INTEGER NOT NULL, end INTEGER NOT NULL, correlationId INTEGER, "
                                  "globalPid INTEGER, bytes INTEGER",
    "CUPTI_ACTIVITY_KIND_RUNTIME": "start INTEGER NOT NULL, end INTEGER NOT NULL, globalTid INTEGER, "
                                   "correlationId INTEGER, nameId INTEGER NOT NULL",
    "NVTX_EVENTS": "start INTEGER NOT NULL, end INTEGER, eventType INTEGER NOT NULL, text TEXT, globalTid INTEGER, "
                   "textId INTEGER, domainId INTEGER",
}


def write_nsys_sqlite(path: Path, ranges: bool = True) -> Path:
    """The scenario as nsys exports it to SQLite: strings in StringIds, process and thread packed into globalTid
    (pid << 24 | tid), NVTX push/pop ranges as eventType 59 (one by a registered string, textId), plus an NVTX
    mark (eventType 34) and a range never closed, neither of which is a range."""
    scenario_ranges, launches = scenario()
    db = sqlite3.connect(path)
    db.executescript("".join(f"CREATE TABLE {name} ({columns});" for name, columns in SCHEMA.items()))
    strings: dict[str, int] = {}

    def string_id(text: str) -> int:
        if text not in strings:
            strings[text] = len(strings) + 1
            db.execute("INSERT INTO StringIds VALUES (?, ?)", (strings[text], text))
        return strings[text]

    for corr, at, tid, name, start, dur in launches:
        api = "cudaMemsetAsync_v3020" if name == MEMSET else "cudaLaunchKernel_v7000"
        db.execute("INSERT INTO CUPTI_ACTIVITY_KIND_RUNTIME VALUES (?, ?, ?, ?, ?)",
                   (at, at + API_NS, PID << 24 | tid, corr, string_id(api)))
        if name == MEMSET:
            db.execute("INSERT INTO CUPTI_ACTIVITY_KIND_MEMSET VALUES (?, ?, ?, ?, 1024)", (start, start + dur, corr,
                                                                                           PID << 24))
        else:
            db.execute("INSERT INTO CUPTI_ACTIVITY_KIND_KERNEL VALUES (?, ?, ?, ?, ?, ?)",
                       (start, start + dur, corr, PID << 24, string_id(name), string_id(name[:10])))
    for i, (name, start, end, tid, _) in enumerate(scenario_ranges if ranges else []):
        registered = i == 0
        db.execute("INSERT INTO NVTX_EVENTS VALUES (?, ?, 59, ?, ?, ?, 0)",
                   (start, end, None if registered else name, PID << 24 | tid, string_id(name) if registered else None))
    db.execute("INSERT INTO NVTX_EVENTS VALUES (5, NULL, 34, 'a mark', 0, NULL, 0)")
    db.execute("INSERT INTO NVTX_EVENTS VALUES (6, NULL, 59, 'never closed', 0, NULL, 0)")
    db.commit()
    db.close()
    return path


def torch_gpu_trace(path: Path) -> Path:
    """The scenario as a torch.profiler Chrome trace (µs): runtime calls on the launching threads, kernels on a
    stream, correlation ids joining them."""
    ranges, launches = scenario()
    events = [{"ph": "X", "cat": "user_annotation", "name": name, "pid": PID, "tid": tid, "ts": a / 1e3,
               "dur": (b - a) / 1e3, "args": {}} for name, a, b, tid, _ in ranges]
    for corr, at, tid, name, start, dur in launches:
        memset = name == MEMSET
        events.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaMemsetAsync" if memset else "cudaLaunchKernel",
                       "pid": PID, "tid": tid, "ts": at / 1e3, "dur": 3.0, "args": {"correlation": corr}})
        events.append({"ph": "X", "cat": "gpu_memset" if memset else "kernel", "name": name, "pid": 0, "tid": 7,
                       "ts": start / 1e3, "dur": dur / 1e3, "args": {"correlation": corr, "stream": 7}})
    events.append({"ph": "X", "cat": "gpu_user_annotation", "name": "forward", "pid": 0, "tid": 7, "ts": 1.0,
                   "dur": 5e3, "args": {}})  # the GPU-side projection of a range: not a range to attribute by
    path.write_text(json.dumps({"traceEvents": events}))
    return path


def e2e_record(**overrides) -> dict:
    """A bench_e2e record of the scenario's run: 2 steps whose stopwatch agrees with the ranges."""
    record = {"config": {"size": "tiny", "batch_size": 2, "attn": "naive",
                         "model": {"d_model": 64, "d_ff": 128, "num_layers": 1, "num_heads": 4, "context_length": 32}},
              "status": "ok", "environment": common.environment(common.resolve_device("cpu")),
              "forward_ms": [0.300, 0.300], "backward_ms": [0.400, 0.400], "optimizer_ms": [0.200, 0.200],
              "step_ms": [1.0, 1.0]}
    return {**record, **overrides}


# A stand-in for nsys, for the paths a test needs without a real one (test_nsys.py runs the real one). Each call is
# logged as a JSON line to FAKE_NSYS_LOG. `--version` answers as 2023.4.4 (or FAKE_NSYS_VERSION); `profile --help`
# lists FAKE_NSYS_PROFILE_OPTIONS. `export` copies FAKE_NSYS_EXPORT (an SQLite file) to --output, refusing an
# existing one as nsys does, or fails as nsys does on a file that is no report (first bytes not a report header).
# `profile` exits FAKE_NSYS_APP_STATUS for the reports whose name holds FAKE_NSYS_MATCH (all when unset); else writes
# the app's record where its --results-dir points (FAKE_NSYS_RECORD, FAKE_NSYS_OOM_RECORD for the matching reports)
# and the report (none with FAKE_NSYS_NO_CAPTURE); with FAKE_NSYS_RUN_APP it runs the real app (without --nvtx) in
# its own process group, and writes the report when the app's record says it measured its steps.
FAKE_NSYS = r"""#!{python}
import json, os, shutil, subprocess, sys
from pathlib import Path
argv, env = sys.argv[1:], os.environ
with open(env["FAKE_NSYS_LOG"], "a") as log:
    log.write(json.dumps({{"argv": argv, "register_only": env.get("NSYS_NVTX_PROFILER_REGISTER_ONLY")}}) + "\n")
option = lambda name: next(a.split("=", 1)[1] for a in argv if a.startswith(name + "="))
if argv == ["--version"]:
    print("NVIDIA Nsight Systems version " + env.get("FAKE_NSYS_VERSION", "2023.4.4.54-234433681190v0"))
elif argv == ["profile", "--help"]:
    print("".join(f"\t{{name}}=\n\n" for name in env.get("FAKE_NSYS_PROFILE_OPTIONS", "").split()))
elif argv[0] == "export":
    out, report = Path(option("--output")), Path(argv[-1])
    if out.exists():
        sys.exit(f"Exportation error: File already exists: '{{out}}'.")
    if not report.read_bytes().startswith(b"NVIDIA Tegra Profiler Report"):
        sys.exit("Exportation error: Cannot read from stream.")
    shutil.copy(env["FAKE_NSYS_EXPORT"], out)
elif argv[0] == "profile":
    matches = env.get("FAKE_NSYS_MATCH", "") in Path(option("--output")).name
    if env.get("FAKE_NSYS_APP_STATUS") and matches:
        sys.exit(int(env["FAKE_NSYS_APP_STATUS"]))
    e2e = Path(argv[argv.index("--results-dir") + 1]) / "e2e"
    if env.get("FAKE_NSYS_RUN_APP"):
        app = argv[next(i for i, a in enumerate(argv) if i and not a.startswith("-")):]
        status = subprocess.run([a for a in app if a != "--nvtx"]).returncode
        if status:
            sys.exit(status)
        measured = json.loads((e2e / "e2e.jsonl").read_text().splitlines()[-1])["status"] in ("ok", "noisy")
    else:
        e2e.mkdir(parents=True)
        record = env["FAKE_NSYS_OOM_RECORD"] if matches and "FAKE_NSYS_OOM_RECORD" in env else env["FAKE_NSYS_RECORD"]
        (e2e / "e2e.jsonl").write_text(record + "\n")
        measured = json.loads(record)["status"] == "ok" and not env.get("FAKE_NSYS_NO_CAPTURE")
    if measured:
        Path(option("--output") + ".nsys-rep").write_bytes(b"NVIDIA Tegra Profiler Report 2023@4@4@54-x\n")
"""


def fake_nsys(folder: Path) -> dict[str, str]:
    """A bin folder holding the fake nsys, and the environment that puts it first on PATH."""
    (folder / "bin").mkdir(parents=True)
    nsys = folder / "bin" / "nsys"
    nsys.write_text(FAKE_NSYS.format(python=sys.executable))
    nsys.chmod(0o755)
    env = {**os.environ, "PATH": f"{nsys.parent}{os.pathsep}{os.environ['PATH']}", "PYTHON": sys.executable,
           "FAKE_NSYS_LOG": str(folder / "calls.jsonl"), "FAKE_NSYS_RECORD": json.dumps(e2e_record()),
           "FAKE_NSYS_EXPORT": str(write_nsys_sqlite(folder / "fixture.sqlite"))}
    for name in ("NSYS", "NSYS_NVTX_PROFILER_REGISTER_ONLY"):
        env.pop(name, None)
    return env


@pytest.fixture
def export(tmp_path: Path) -> Path:
    return write_nsys_sqlite(tmp_path / "report.sqlite")


@pytest.fixture
def with_fake_nsys(tmp_path: Path, monkeypatch) -> Path:
    """The fake nsys on PATH for this process; returns its call log."""
    for name, value in fake_nsys(tmp_path / "fake").items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("NSYS", raising=False)
    return tmp_path / "fake" / "calls.jsonl"


def realdata(name: str) -> Path:
    if REALDATA is None or not (REALDATA / name).is_file():
        pytest.skip(f"no {name}: the real GPU material is read from ../shared/realdata, absent here")
    return REALDATA / name


# ---- reading an export ----


def test_the_fixture_has_the_columns_of_a_real_export(export: Path):
    real = realdata("rtx3070ti_train_nsys2025.1.3.sqlite")
    with sqlite3.connect(f"{real.resolve().as_uri()}?mode=ro", uri=True) as db:
        for table in SCHEMA:
            columns = {row[1] for row in db.execute(f"PRAGMA table_info({table})")}
            assert {c.split()[0] for c in SCHEMA[table].split(", ")} <= columns, table


def test_each_kernel_is_joined_to_its_launch_and_ranges_come_from_text_or_string_ids(export: Path):
    profile = kt.load_nsys(export)
    _, launches = scenario()
    assert sorted((a.name, a.duration_ns, a.launch_ns) for a in profile.activities) == sorted(
        (name, dur, at) for _, at, _, name, _, dur in launches)  # the launch, not the GPU start
    assert profile.notes == [] and profile.device == "gpu"
    assert {r.name for r in profile.ranges} == {"measure", "forward", "backward", "optimizer", "final matmul",
                                                "scaled dot product attention", "computing attention scores",
                                                "computing softmax"}  # no mark, no unclosed range
    assert kt.load_nsys(export.with_suffix("")).activities == profile.activities  # the prefix X reads X.sqlite


def test_a_cpu_only_export_has_ranges_and_no_work_and_the_tables_say_so(tmp_path: Path):
    db = sqlite3.connect(tmp_path / "cpu.sqlite")  # a CPU run's export: no CUPTI tables at all
    db.executescript(f"CREATE TABLE StringIds ({SCHEMA['StringIds']}); CREATE TABLE NVTX_EVENTS "
                     f"({SCHEMA['NVTX_EVENTS']}); "
                     "INSERT INTO NVTX_EVENTS VALUES (0, 300000, 59, 'forward', 0, NULL, 0);")
    db.commit()
    db.close()
    tables = kt.build_tables(kt.load_nsys(tmp_path / "cpu.sqlite"), {"forward": 0.3})
    assert tables["phases"][0]["agrees"] == "yes" and tables["phases"][0]["work_ms"] is None  # unknown, not 0
    assert tables["top"] == {} and kt.NO_KERNELS in tables["notes"]
    text = kt.render_tables(tables)
    assert "### 1. Phase times" in text and "### 2." not in text and "no CUDA kernel data" in text


@pytest.mark.parametrize("content", [b"", b"not sqlite at all"])
def test_a_file_that_is_no_export_is_one_line_exit_2_never_no_gpu_work(tmp_path: Path, content: bytes, capsys):
    (tmp_path / "x.sqlite").write_bytes(content)  # e.g. what a refused export left behind
    (tmp_path / "x.nsys-rep").write_bytes(REPORT_BYTES)
    os.utime(tmp_path / "x.nsys-rep", (1, 1))  # older than the file beside it, which is read as its export
    for source, hint in (("x.sqlite", ""), ("x.nsys-rep", "move it away for a fresh export")):
        assert kt.main([str(tmp_path / source)]) == 2
        err = capsys.readouterr().err
        assert len(err.strip().splitlines()) == 1 and "SQLite export" in err and hint in err
        assert "no GPU work" not in err and (tmp_path / "x.sqlite").read_bytes() == content


# ---- attribution and the four tables ----


def test_kernels_go_to_the_phase_whose_window_holds_their_launch(export: Path):
    chosen = kt.select_measured(kt.load_nsys(export))
    groups = kt.attribute(chosen.activities, chosen.ranges, kt.PHASES)
    # launched by the autograd thread, which never opened "backward"; the copy ran after the range closed
    assert sorted(a.name for a in groups["backward"]) == sorted([XMMA, SUM_REDUCE, DIRECT_COPY] * 2)
    assert [a.name for a in groups["optimizer"]] == [FOREACH] * 2
    assert [a.name for a in groups[kt.OUTSIDE]] == [MEMSET] * 2
    assert all(a.duration_ns != WARMUP_KERNEL_NS for a in chosen.activities)  # warm-up is outside "measure"


def test_the_four_tables_of_the_scenario(export: Path):
    tables = kt.build_tables(kt.load_nsys(export), kt.stopwatch_ms(e2e_record()),
                             kt.attention_shape(e2e_record()["config"]), top=3)
    assert tables["steps"] == 2 and tables["device"] == "gpu"
    phases = {row["phase"]: row for row in tables["phases"]}
    assert phases["forward"]["range_ms"] == pytest.approx(0.3) and phases["forward"]["ratio"] == pytest.approx(1.0)
    assert phases["backward"]["work_ms"] == pytest.approx(0.058)  # 40 + 8 + 10 µs per step
    assert phases["step"]["range_ms"] == pytest.approx(1.0)  # the 2 ms measure range over 2 steps
    top_forward = tables["top"]["forward"]
    assert top_forward[0]["name"] == SGEMM and top_forward[0]["per_step"] == 2  # scores + final matmul
    assert top_forward[-1]["name"] == "(3 others)"  # 6 distinct forward kernels, top 3 shown
    assert sum(r["share_pct"] for r in top_forward) == pytest.approx(100)
    categories = {row["scope"]: row for row in tables["categories"]}
    assert all(sum(row[c] for c in kt.CATEGORIES) == pytest.approx(100) for row in categories.values())
    # nothing counted twice, nothing lost: the phases and the gap between them make up the whole
    parts = sum(categories[s]["ms_per_step"] for s in ("forward", "backward", "optimizer", kt.OUTSIDE))
    assert parts == pytest.approx(categories["all"]["ms_per_step"]) == pytest.approx(0.147)
    assert categories["optimizer"]["elementwise"] == pytest.approx(100)
    attention = {row["sub_step"]: row for row in tables["attention"]}
    assert attention["computing softmax"]["ms_per_call"] == pytest.approx(0.010)  # reduce + softmax kernels
    assert attention["final matmul"]["calls_per_step"] == 1
    assert attention["final matmul"]["gflop_per_call"] == pytest.approx(2 * 2 * 32 * 32 * 64 / 1e9)  # 2·B·S²·d
    assert attention["computing softmax"]["gflop_per_call"] == pytest.approx(5 * 2 * 4 * 32 * 32 / 1e9)  # 5·B·H·S²
    assert any(note.startswith("softmax takes") for note in tables["notes"])
    text = kt.render_tables(tables)
    assert "### 4. Inside attention" in text and "ampere_sgemm_128x64_tn" in text


def test_without_ranges_the_kernels_are_one_scope_and_a_row_says_why(tmp_path: Path):
    tables = kt.build_tables(kt.load_nsys(write_nsys_sqlite(tmp_path / "r.sqlite", ranges=False)))
    assert [row["phase"] for row in tables["phases"]] == ["no phase range found"]  # a row, not an empty header
    assert kt.NO_PHASE in tables["notes"] and "--ranges forward=NAME" in kt.NO_PHASE
    assert tables["top"]["all"] and "| no phase range found |" in kt.render_tables(tables)


def test_compiled_runs_say_why_the_attention_table_is_absent(export: Path):
    profile = kt.load_nsys(export)
    profile.ranges = [r for r in profile.ranges if r.name not in kt.ATTENTION_STEPS]  # what --compile records
    compiled = kt.build_tables(profile, compiled=True)
    assert compiled["attention"] == [] and any("torch.compile" in note for note in compiled["notes"])
    assert not any("torch.compile" in note for note in kt.build_tables(profile)["notes"])


def test_torch_gpu_trace_gives_the_same_tables_as_nsys(export: Path, tmp_path: Path):
    from_torch = kt.build_tables(kt.load_torch_trace(torch_gpu_trace(tmp_path / "t.json")))
    from_nsys = kt.build_tables(kt.load_nsys(export))
    assert from_torch["device"] == "gpu"
    for key in ("categories", "attention"):  # lists of rows: pytest.approx takes no nested data
        assert_same_rows(from_torch[key], from_nsys[key])
    assert_same_rows(from_torch["top"]["backward"], from_nsys["top"]["backward"])


def assert_same_rows(got, want) -> None:
    got, want = (list(rows.values()) if isinstance(rows, dict) else rows for rows in (got, want))
    assert len(got) == len(want)
    for a, b in zip(got, want):
        assert a.keys() == b.keys()
        for k in a:
            assert a[k] == (pytest.approx(b[k]) if isinstance(b[k], float) else b[k]), k


def test_cpu_self_time_subtracts_direct_children_per_thread():
    def op(name, ts, dur, tid=1):
        return {"ph": "X", "cat": "cpu_op", "name": name, "pid": 1, "tid": tid, "ts": ts, "dur": dur}
    events = [op("aten::linear", 0, 100), op("aten::matmul", 5, 90), op("aten::mm", 10, 80),
              op("aten::add", 0, 50, tid=2), op("aten::t", 96, 2)]
    self_us = {a.name: a.duration_ns / 1e3 for a in kt.cpu_self_times(events)}
    assert self_us == {"aten::linear": 8, "aten::matmul": 10, "aten::mm": 80, "aten::add": 50, "aten::t": 2}


# ---- phases from anyone's ranges ----


@pytest.mark.parametrize("name, phase", [
    ("forward", "forward"), ("Forward", "forward"), ("FWD", "forward"), ("forward_pass", "forward"),
    ("Forward 3", "forward"), ("backward", "backward"), ("Backward Pass", "backward"), ("bwd", "backward"),
    ("optimizer", "optimizer"), ("Optimizer Step", "optimizer"), ("optimizer.step", "optimizer"),
    ("opt", "optimizer"), ("optimizer_step", "optimizer"), ("step", "step"), ("Step 3", "step"),
    ("train-step", "step"), ("Training Step 12", "step"), ("train_step", "step"),
    ("Benchmark Forward Only", None), ("Run Benchmark", None), ("computing softmax", None), ("measure", None),
    ("forwarding", None), ("Initialize Model", None), ("ProfilerStep#12", "step"),
])
def test_the_usual_spellings_of_a_phase_in_any_case(name: str, phase: str | None):
    assert kt.phase_of(name, {}) == phase


def test_warmup_ranges_in_any_spelling():
    assert all(kt.is_warmup(name) for name in ("warmup", "Warm-up", "Warm-up Step 3", "WARM_UP", "warm up 2"))
    assert not any(kt.is_warmup(name) for name in ("forward", "Warmed", "swarmup"))


def student_profile() -> Profile:
    """Shaped as the student's own export in realdata: model set-up, warm-up steps holding Forward and Backward,
    then three benchmarked Forward passes; kernels in each, and one after the benchmark."""
    ranges = [Range("Run Benchmark", 0, 1000), Range("Initialize Model", 0, 100), Range("Warm-up", 100, 400)]
    activities = [Activity("init_kernel", 7, 50)]
    for i, start in enumerate((100, 250)):
        ranges += [Range(f"Warm-up Step {i + 1}", start, start + 150), Range("Forward", start, start + 60),
                   Range("Backward", start + 60, start + 150)]
        activities += [Activity("warmup_kernel", 1000, start + 10), Activity("warmup_kernel", 1000, start + 70)]
    ranges.append(Range("Benchmark Forward Only", 400, 900))
    for start in (410, 560, 710):
        ranges.append(Range("Forward", start, start + 100 + start // 100))  # 104, 105, 107 ns
        activities += [Activity("ampere_sgemm_128x64_tn", 80, start + 5), Activity("[CUDA memset]", 3, start + 120)]
    activities.append(Activity("teardown_kernel", 500, 950))  # after the last pass
    return Profile(activities, ranges, "gpu", "student")


def test_a_students_own_ranges_fill_table_1_and_say_which_were_used():
    tables = kt.build_tables(student_profile())
    (forward,) = tables["phases"]  # no measured Backward: those were all inside warm-up ranges
    assert forward["phase"] == "forward" and forward["range_ms"] == pytest.approx((104 + 105 + 107) / 3 / 1e6)
    assert forward["work_ms"] == pytest.approx(80 / 1e6)  # per step: the sgemm; no warm-up, set-up or teardown
    assert {r["name"] for r in tables["top"]["all"]} == {"ampere_sgemm_128x64_tn", "[CUDA memset]"}
    assert tables["ranges_used"] == ("ranges used: forward = 'Forward' x3 (left out, inside warm-up ranges: 2 "
                                     "forward, 2 backward); 3 steps (the forward ranges); measured region: from the "
                                     "first to the last phase range, warm-up ranges left out")
    assert kt.NO_STOPWATCH in kt.render_tables(tables)


def test_ranges_given_by_name_replace_the_usual_spellings_and_an_unknown_name_is_said():
    profile = student_profile()
    profile.ranges = [Range("Model Fwd Pass" if r.name == "Forward" else r.name, r.start_ns, r.end_ns)
                      for r in profile.ranges]
    assert [row["phase"] for row in kt.build_tables(profile)["phases"]] == ["no phase range found"]
    given = kt.build_tables(profile, ranges={"forward": "Model Fwd Pass"})
    assert given["steps"] == 3 and given["phases"][0]["phase"] == "forward"
    benchmark = kt.build_tables(student_profile(), ranges={"measure": "Benchmark Forward Only"})
    assert benchmark["phases"][-1]["phase"] == "step"  # the measure range over the 3 steps
    assert benchmark["phases"][-1]["range_ms"] == pytest.approx(500 / 3 / 1e6)
    # forward given a name nothing has: not silently dropped, the notes say so and list the names there are
    renamed = kt.build_tables(student_profile(), ranges={"forward": "NoSuch"})
    assert [row["phase"] for row in renamed["phases"]] == ["no phase range found"]
    (note,) = [n for n in renamed["notes"] if n.startswith("--ranges")]
    assert "forward='NoSuch': no range of that name" in note and "'Forward'" not in note and "Forward" in note
    # a range spelled "forward" inside the named one does not join it: forward is the outer range alone
    outer = student_profile()
    outer.ranges += [Range("Model Forward", r.start_ns, r.end_ns + 50) for r in outer.ranges
                     if r.name == "Forward" and r.start_ns >= 400]
    outer.ranges = [Range("forward", r.start_ns, r.end_ns) if r.name == "Forward" else r for r in outer.ranges]
    (forward,) = kt.build_tables(outer, ranges={"forward": "Model Forward"})["phases"]
    assert forward["range_ms"] == pytest.approx((154 + 155 + 157) / 3 / 1e6)


def test_torch_profilers_own_step_ranges_are_the_steps_only_without_the_runs_own():
    """ProfilerStep#N: one per prof.step() under a torch.profiler schedule, around whatever the run's own ranges."""
    steps = [Range(f"ProfilerStep#{i}", 100 * i, 100 * i + 90) for i in (2, 3, 4)]
    plain = Profile([Activity("aten::mm", 40, 100 * i + 5) for i in (2, 3, 4)], steps, "cpu", "plain")
    tables = kt.build_tables(plain)
    assert tables["steps"] == 3 and [row["phase"] for row in tables["phases"]] == ["step"]
    both = Profile(plain.activities, steps + [Range("train_step", 100 * i + 1, 100 * i + 80) for i in (2, 3, 4)],
                   "cpu", "both")
    tables = kt.build_tables(both)
    assert tables["steps"] == 3 and "ProfilerStep" not in tables["ranges_used"]  # not 6 steps
    assert tables["phases"][0]["range_ms"] == pytest.approx(79 / 1e6)


def test_step_ranges_count_the_steps_and_give_the_step_row():
    ranges, activities = [], []
    for start in (0, 300):
        ranges += [Range("train_step", start, start + 250), Range("fwd", start, start + 100),
                   Range("bwd", start + 100, start + 200), Range("Optimizer Step", start + 200, start + 250)]
        activities.append(Activity("ampere_sgemm_128x64_tn", 50, start + 10))
    tables = kt.build_tables(Profile(activities, ranges, "gpu", "x"), {"step": 0.00025})
    assert tables["steps"] == 2 and "2 steps (the step ranges)" in tables["ranges_used"]
    rows = {row["phase"]: row for row in tables["phases"]}
    assert list(rows) == ["forward", "backward", "optimizer", "step"]
    assert rows["step"]["range_ms"] == pytest.approx(250 / 1e6) and rows["step"]["agrees"] == "yes"


def test_gradient_accumulation_two_forwards_a_step_counts_per_step():
    ranges, activities = [], []
    for start in (0, 1000):
        for micro in (0, 300):
            ranges += [Range("forward", start + micro, start + micro + 100),
                       Range("backward", start + micro + 100, start + micro + 300)]
            activities.append(Activity("ampere_sgemm_128x64_tn", 90, start + micro + 10))
        ranges.append(Range("optimizer", start + 600, start + 700))
    tables = kt.build_tables(Profile(activities, ranges, "gpu", "x"), {"forward": 0.0002})
    assert tables["steps"] == 2 and "2 steps (the optimizer ranges)" in tables["ranges_used"]
    rows = {row["phase"]: row for row in tables["phases"]}
    assert rows["forward"]["range_ms"] == pytest.approx(200 / 1e6)  # two 100 ns ranges a step
    assert rows["forward"]["work_pct_of_range"] == pytest.approx(90.0)  # 180 ns of sgemm in 200 ns of forward
    assert rows["forward"]["agrees"] == "yes" and rows["backward"]["range_ms"] == pytest.approx(400 / 1e6)


# ---- the classifier: every family of real kernel names ----

REAL_NAMES = {
    "matrix multiply": [
        "ampere_sgemm_128x64_tn", "volta_sgemm_128x64_nn", XMMA,
        "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1_execute_segment_k_off_"
        "kernel__5x_cublas",
        "void cutlass::Kernel2<cutlass_80_tensorop_s1688gemm_64x64_32x6_nn_align4>(T1::Params)",
        "nvjet_tst_128x256_64x4_1x2_h_bz_coopA_TNT", "ampere_bf16_s16816gemm_bf16_128x128_ldg8_f2f_stages_64x3_tn",
        "void splitKreduce_kernel<32, 16, int, float, float, float, float, true, false, false>(cublasSplitKParams<T6>, "
        "const T4 *, const T5 *, T5 *, const T6 *, const T6 *, const T7 *, const T4 *, T7 *, void *, long, T6 *, "
        "int *)",
        "triton_tem_fused_mm_0", "void pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits<64, 128, 128, 4, "
        "false, false, cutlass::bfloat16_t>, false, true, false, false, false, true, false>(Flash_fwd_params)",
        # fused attention of every kind: cuDNN's (sm80/sm90/sm100, forward and backward), FlashAttention for
        # Hopper/Blackwell, memory-efficient (CUTLASS fmha): their time is their two matmuls
        "cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma_f16_knob_7_64x128x128_4x1x1_kernel0_0",
        "cudnn_generated_fort_native_sdpa_sm90_flash_bprop_wgmma_f16_knob_26_64x64x128_1x1x1_kernel0_0",
        "cudnn_generated_fort_native_sdpa_sm80_flash_fprop_wmma_f16_knob_3_64x64x128_4x1x1_kernel0_0",
        "cudnn_generated_fort_native_sdpa_sm100_flash_fprop_f16_knob_1_128x128x128_4x1x1_kernel0_0",
        "flash::FlashAttentionForwardSm100<cute::tuple<cute::C<128>, cute::C<128>, cute::C<128>>>",
        "fmha_cutlassF_f16_aligned_64x128_rf_sm80(PyTorchMemEffAttention::AttentionKernel<cutlass::half_t, "
        "cutlass::arch::Sm80, true, 64, 128, 128, true, true>::Params)",
        "fmha_cutlassB_f16_aligned_128x128_k128_sm80(PyTorchMemEffAttention::AttentionBackwardKernel<cutlass::arch::"
        "Sm80, cutlass::half_t, true, false, false, 128, 128, 128, false>::Params)",
        "aten::mm", "aten::bmm", "aten::addmm", "aten::_scaled_dot_product_flash_attention_for_cpu",
        "aten::_scaled_dot_product_flash_attention_for_cpu_backward"],  # --attn sdpa's backward on a CPU
    "elementwise": [
        COMMA_KERNEL, WHERE_KERNEL, FOREACH, "triton_poi_fused_add_mul_silu_0",
        "void at::native::unrolled_elementwise_kernel<at::native::exp_kernel_cuda(at::TensorIteratorBase &)::"
        "{lambda()#2}::operator ()() const::{lambda()#2}::operator ()() const::{lambda(float)#1}, "
        "at::detail::Array<char *, 2>, TrivialOffsetCalculator<1, unsigned int>>(int, T1, T2, T3)",
        "triton_for_fused_0",  # inductor's foreach (the compiled optimizer step)
        "void at::native::amp_update_scale_cuda_kernel(float *, int *, const float *, double, double, int)",
        "void at::native::<unnamed>::multi_tensor_apply_kernel<at::native::<unnamed>::TensorListMetadata<1>, "
        "at::native::<unnamed>::UnaryOpFunctor<float, 1, 1, 0>, at::native::_amp_foreach_non_finite_check_and_"
        "unscale_cuda_(c10::ArrayRef<at::Tensor>, at::Tensor &, const at::Tensor &)::{lambda()#1}::operator ()() "
        "const::{lambda()#2}::operator ()() const::{lambda(float)#1}>(int, T1, T2, T3)",
        "aten::mul", "aten::add_", "aten::_foreach_mul_", "aten::addcdiv_",
        # inductor's prefix decides, whatever ops the name lists after fused_ (index_put here)
        "triton_poi_fused_arange_ge_index_put_lift_fresh_0", "triton_poi_fused_gather_scatter_copy_0",
        # random numbers, one per element (the data's randint, weight initialisation)
        "void at::native::<unnamed>::distribution_elementwise_grid_stride_kernel<float, 4, at::native::templates::"
        "cuda::uniform_and_transform<float, float, at::CUDAGeneratorImpl *, at::native::templates::cuda::"
        "normal_kernel<at::CUDAGeneratorImpl *>(const at::TensorBase &, double, double, T1)::{lambda()#1}::operator ()"
        "() const::{lambda()#2}::operator ()() const::{lambda(float)#1}>(at::TensorIteratorBase &, T3, T4)::{lambda"
        "(curandStatePhilox4_32_10 *)#2}, at::native::<unnamed>::distribution_nullary_kernel<float, float, float4, "
        "at::CUDAGeneratorImpl *, >(long, at::PhiloxCudaState, T3, T4)",
        "aten::randint", "aten::normal_"],
    "reduction/softmax": [
        MAX_REDUCE, SUM_REDUCE, SOFTMAX, "triton_red_fused__softmax_0", "triton_per_fused_mean_pow_rsqrt_0",
        "void <unnamed>::softmax_warp_forward<float, float, float, 9, false, false>(T2 *, const T1 *, int, int, int, "
        "const bool *, int, bool)", "aten::_softmax", "aten::amax", "aten::sum",
        # scans (cumsum): ATen's, cub's, inductor's
        "void at::native::tensor_kernel_scan_innermost_dim<float, std::plus<float>>(T1 *, const T1 *, unsigned int, "
        "unsigned int, unsigned int, T1, T2)",
        "void at_cuda_detail::cub::DeviceScanKernel<at_cuda_detail::cub::DeviceScanPolicy<long, std::plus<long>>::"
        "Policy900, const long *, long *, at_cuda_detail::cub::ScanTileState<long, true>, std::plus<long>, "
        "at_cuda_detail::cub::NullType, int, long>(T2, T3, T4, int, T5, T6, T7)",
        "triton_spl_fused_cumsum_0", "aten::cumsum",
        # indexing that ADDS rows sharing an index: the embedding backward (index_put_ with accumulate sorts the
        # token ids and sums their gradient rows), scatter_add / index_add; the cross-entropy's nll_loss
        "void at::native::<unnamed>::indexing_backward_kernel<float, 4>(const long *, const long *, "
        "const T1 *, T1 *, long, long, long, long, bool)",
        "void at::native::_scatter_gather_elementwise_kernel<128, 4, at::native::_cuda_scatter_gather_internal_kernel"
        "<true, float>::operator ()<at::native::ReduceAdd>(at::TensorIterator &, long, long, long, const T1 &)::"
        "{lambda(int)#1}>(int, T3)",
        "void at::native::indexFuncLargeIndex<float, long, unsigned int, 2, 2, -2, true>(at::cuda::detail::TensorInfo"
        "<T1, T3>, at::cuda::detail::TensorInfo<const T1, T3>, at::cuda::detail::TensorInfo<const T2, T3>, int, int, "
        "T3, T3, long, long, const T1 &, T1)",
        "void at::native::<unnamed>::nll_loss_forward_reduce_cuda_kernel_2d<float, float, long>(T1 *, T1 *, const "
        "T1 *, const T3 *, const T1 *, bool, long, long, long, long)",
        "aten::embedding_dense_backward", "aten::scatter_add_", "aten::index_add_", "aten::nll_loss_forward"],
    "memory copy/set": [
        DIRECT_COPY, MEMSET, "[CUDA memcpy Device-to-Device]", "Memcpy DtoD (Device -> Device)",
        "void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>, at::detail::Array<char *, "
        "1>>(int, T2, T3)", "void at::native::<unnamed>::CatArrayBatchedCopy<at::native::<unnamed>::OpaqueType<4>, "
        "unsigned int, 3, 64, 64>(T1 *, CatArrInputTensorMetadata<T1, T2, T4, T5>, TensorSizeStride<T2, 4>, int, T2)",
        "aten::copy_", "aten::zero_", "aten::clone",
        # indexing that only moves data: the embedding lookup, cross_entropy's gather, scatter (assign)
        "void at::native::index_elementwise_kernel<128, 4, at::native::gpu_index_kernel<at::native::index_kernel_"
        "impl<at::native::OpaqueType<4>>(at::TensorIteratorBase &, c10::ArrayRef<long>, c10::ArrayRef<long>)::"
        "{lambda(char *, const char *, long)#1}>(at::TensorIteratorBase &, c10::ArrayRef<long>, c10::ArrayRef<long>, "
        "const T1 &, bool)::{lambda(int)#1}>(long, T3)",
        "void at::native::_scatter_gather_elementwise_kernel<128, 4, at::native::_cuda_scatter_gather_internal_kernel"
        "<false, float>::operator ()<at::native::TensorAssign>(at::TensorIterator &, long, long, long, const T1 &)::"
        "{lambda(int)#1}>(int, T3)",
        "void at::native::vectorized_gather_kernel<16, long>(char *, char *, T2 *, int, long, long, long, long, bool)",
        "aten::index", "aten::gather", "aten::embedding", "aten::index_select"],
    # NCCL's kernels (a torch.profiler trace's, with parameters; nsys's), and the c10d operators that hand gloo its work
    "communication": [
        "ncclKernel_AllReduce_RING_LL_Sum_float(ncclDevComm*, unsigned long, ncclWork*)",
        "ncclDevKernel_AllReduce_Sum_f32_RING_LL", "c10d::allreduce_", "c10d::broadcast_"],
    "other": [
        QUOTE_KERNEL, "autograd::engine::evaluate_function: MmBackward0", "triton_unk_fused_0",
        # sorting (the embedding backward sorts the token ids first): none of the four, by decision
        "void at_cuda_detail::cub::DeviceRadixSortSingleTileKernel<at_cuda_detail::cub::DeviceRadixSortPolicy<long, "
        "at::cuda::cub::detail::OpaqueType<8>, unsigned long long>::Policy900, false, long, at::cuda::cub::detail::"
        "OpaqueType<8>, unsigned long long>(const T3 *, T3 *, const T4 *, T4 *, T5, int, int)",
        "aten::sort"],
}


@pytest.mark.parametrize("category", list(REAL_NAMES))
def test_classifier_knows_the_real_families(category: str):
    assert {name: kt.classify_kernel(name) for name in REAL_NAMES[category]} == dict.fromkeys(
        REAL_NAMES[category], category)


def test_a_copy_beside_a_collective_hides_none_of_it_and_is_counted_on_its_own():
    """As Holistic Trace Analysis counts: an NCCL kernel over 0-100 µs, a matmul over 0-30 (hidden: 30), a memcpy
    over 20-60 and a memset over 90-100 (beside copies: 30-60 and 90-100, 40), nothing at 60-90."""
    us = 1e3
    work = [("ncclDevKernel_AllReduce_Sum_f32_RING_LL", 0, 100 * us), (SGEMM, 0, 30 * us),
            ("Memcpy DtoD (Device -> Device)", 20 * us, 60 * us), (MEMSET, 90 * us, 100 * us)]
    rows = kt.communication_rows(kt.gpu_profile(work, [0.0] * len(work), [], "t"))
    (step,) = [r for r in rows if r["step"] == 1 and r["phase"] == kt.WHOLE_STEP]
    assert [step[k] for k in ("comm_ms", "hidden_ms", "exposed_ms", "copies_ms")] == pytest.approx([0.1, 0.03, 0.07,
                                                                                                    0.04])
    assert "|   beside copies ms |" in kt.render_communication(rows, gpu=True)


def test_short_name_drops_parameters_and_truncates():
    assert kt.short_name("void foo<int, 4>(float *, int)") == "foo<int, 4>"
    assert kt.short_name(XMMA, width=20) == XMMA[:19] + "…"



def test_names_that_shorten_alike_keep_the_part_that_tells_them_apart():
    overloads = [f"void k<{'x' * 100}>(float *)", f"void k<{'x' * 100}>(double *)"]  # alike without parameters
    names = [WHERE_KERNEL, DIRECT_COPY, DIRECT_COPY.replace("(float)", "(double)"), SGEMM, *overloads]
    shown = kt.short_names(names)
    assert len(set(shown)) == len(names) and max(map(len, shown)) <= 90
    assert shown[0] == kt.short_name(WHERE_KERNEL) and shown[3] == SGEMM  # no rival: as short_name has it
    assert "(double)" in shown[2] and shown[5].endswith(">(double *)")


def test_no_two_rows_of_a_real_exports_tables_print_the_same_name(capsys):
    assert kt.main([str(realdata("rtx3070ti_train_nsys2025.1.3.sqlite")), "--top", "30"]) == 0
    for table in capsys.readouterr().out.split("\n### ")[1:]:
        names = [line.split("|")[1].strip() for line in table.splitlines()[4:] if line.startswith("| ")]
        assert len(names) == len(set(names)), table

# ---- the command line ----


def test_an_export_with_a_record_gives_the_tables_printed_and_saved(export: Path, tmp_path: Path, capsys):
    jsonl = tmp_path / "e2e.jsonl"
    jsonl.write_text(json.dumps(e2e_record()) + "\n")
    md = tmp_path / "report.md"
    assert kt.main([str(export), "--e2e-jsonl", str(jsonl), "--md", str(md)]) == 0
    out = capsys.readouterr().out
    assert out.startswith("device: ") and "### 2. Top kernels by GPU time: backward" in out
    assert md.read_text().strip() == out.split("\nwrote ")[0].strip()
    jsonl.write_text(json.dumps(e2e_record(status="OOM")) + "\n")
    assert kt.main([str(export), "--e2e-jsonl", str(jsonl)]) == 1


@pytest.mark.parametrize("args, message", [
    (["--stopwatch", "forward"], "give KEY=MS with KEY one of forward, backward, optimizer, step"),
    (["--stopwatch", "fwd=3"], "got 'fwd=3'"),
    (["--stopwatch", "forward=fast"], "times are milliseconds"),
    (["--stopwatch", "forward=-1"], "positive finite"),
    (["--stopwatch", "forward=1,forward=2"], "forward given twice"),
    (["--ranges", "forward"], "give KEY=NAME with KEY one of forward, backward, optimizer, step, measure"),
    (["--ranges", "warmup=x"], "got 'warmup=x'"),
    (["--stopwatch", "forward=1", "--e2e-jsonl", "x"], "not both"),
    (["--md", "."], "--md must name a file"), (["--md", "missing/t.md"], "--md must name a file"),
    (["--out", "x"], "--out and --results-dir go with --summary"), (["--results-dir", "r"], "with --md FILE"),
])
def test_usage_errors_exit_2_in_one_line(export: Path, capsys, args: list[str], message: str):
    with pytest.raises(SystemExit) as exit_info:
        kt.parse_args([str(export), *args])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and message in err and len(err.strip().splitlines()) == 1


def test_stopwatch_given_by_hand_fills_table_1(export: Path, capsys):
    assert kt.main([str(export), "--stopwatch", "forward=0.3,backward=0.4", "optimizer=0.5"]) == 0
    out = capsys.readouterr().out
    assert "profiler ranges vs your stopwatch (--stopwatch)" in out
    table_1 = out[out.index("### 1."):out.index("### 2.")]
    rows = {line.split("|")[1].strip(): line for line in table_1.splitlines() if line.startswith("| ")}
    assert "| yes" in rows["forward"] and "| NO" in rows["optimizer"]  # the range is 0.2 ms: 0.4x of 0.5


@pytest.mark.parametrize("content", [
    b'{"traceEvents": [{"ph": "X", "name": "a", ',  # truncated (the profiler was killed while writing)
    b"[1, 2, 3]", b'{"traceEvents": 5}',
    b'{"traceEvents": [{"ph": "X", "cat": "cpu_op", "name": "a", "ts": "soon", "dur": 1}]}',
    b"\xff\xfe not text", b"", b"[" * 100_000 + b"]" * 100_000,
], ids=["truncated", "not-an-object", "events-not-a-list", "field-of-wrong-type", "not-utf8", "empty", "too-deep"])
def test_malformed_trace_is_one_line_exit_2(content: bytes, tmp_path: Path, capsys):
    for name in ("t.json", "t.json.gz"):
        (tmp_path / name).write_bytes(content)
        assert kt.main([str(tmp_path / name)]) == 2
        err = capsys.readouterr().err
        assert err.startswith("error: ") and len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("content", ["", "not json\n", "[1, 2]\n", '{"environment": 5, "status": "ok"}\n',
                                     '{"step_ms": "fast", "status": "ok"}\n', None, "[" * 100_000 + "]" * 100_000],
                         ids=["empty", "not-json", "not-an-object", "environment-not-an-object", "samples-not-numbers",
                              "a-folder", "too-deep"])
def test_malformed_e2e_jsonl_is_one_line_exit_2(content: str | None, tmp_path: Path, capsys):
    jsonl = tmp_path / "e2e.jsonl"
    jsonl.mkdir() if content is None else jsonl.write_text(content)
    assert kt.main([str(torch_gpu_trace(tmp_path / "t.json")), "--e2e-jsonl", str(jsonl)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and len(err.strip().splitlines()) == 1


def test_help_starts_without_torch():
    probe = ("import sys, time; start = time.process_time(); sys.argv = ['kernel_tables.py', '--help']\n"
             "import kernel_tables\ntry:\n    kernel_tables.main()\nexcept SystemExit:\n    pass\n"
             "print(time.process_time() - start, 'torch' in sys.modules)")  # CPU seconds: the load adds none
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd=HERE, timeout=60)
    seconds, torch_loaded = result.stdout.split()[-2:]
    assert "usage:" in result.stdout and torch_loaded == "False"
    assert float(seconds) < 1.0  # about 0.15 s at idle: room for a loaded machine, none for importing torch


# ---- a .nsys-rep: exported where the toolkit owns the name, the student's files never touched (#28) ----

REPORT_BYTES = b"NVIDIA Tegra Profiler Report 2023@4@4@54-234433681190v0\n"


def calls(log: Path) -> list[list[str]]:
    return [json.loads(line)["argv"] for line in log.read_text().splitlines()] if log.exists() else []


def snapshot(folder: Path) -> dict[str, tuple[bytes, int]]:
    return {p.name: (p.read_bytes(), p.stat().st_mtime_ns) for p in folder.iterdir()}


def test_a_report_is_exported_once_beside_it_then_read_there(with_fake_nsys: Path, tmp_path: Path, capsys):
    report = tmp_path / "run" / "r.nsys-rep"
    report.parent.mkdir()
    report.write_bytes(REPORT_BYTES)
    assert kt.main([str(report)]) == 0
    assert sorted(p.name for p in report.parent.iterdir()) == ["r.nsys-rep", "r.sqlite"]  # nothing else left
    assert kt.main([str(report)]) == 0  # the export is as new as the report: read, not exported again
    assert [argv[0] for argv in calls(with_fake_nsys)] == ["export"]
    assert "### 2. Top kernels by GPU time: backward" in capsys.readouterr().out


def test_a_report_named_like_an_option_is_a_file_to_nsys(with_fake_nsys: Path, tmp_path: Path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    Path("-g.nsys-rep").write_bytes(REPORT_BYTES)
    assert kt.main(["--", "-g.nsys-rep"]) == 0
    assert calls(with_fake_nsys)[0][-1] == "./-g.nsys-rep" and Path("-g.sqlite").is_file()
    assert "### 2. Top kernels by GPU time: backward" in capsys.readouterr().out


def test_a_students_older_export_and_csvs_are_left_as_they_are(with_fake_nsys: Path, tmp_path: Path, capsys):
    student = tmp_path / "student"
    student.mkdir()
    report = student / "r.nsys-rep"
    report.write_bytes(REPORT_BYTES)
    (student / "r.sqlite").write_bytes(b"the student's own export")
    (student / "r_cuda_gpu_trace.csv").write_text("the student's own CSV\n")
    os.utime(student / "r.sqlite", (1, 1))  # older than the report
    before = snapshot(student)
    assert kt.main([str(report)]) == 0  # a fresh export, read from a temporary folder
    captured = capsys.readouterr()
    assert "older than r.nsys-rep: left as it is" in captured.out and "### 3. Category shares" in captured.out
    assert snapshot(student) == before
    report.write_bytes(b"not a report nsys can read")  # a failed export: one line, their files as they were
    assert kt.main([str(report)]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "Cannot read from stream" in err
    assert snapshot(student) == {**before, "r.nsys-rep": snapshot(student)["r.nsys-rep"]}


def test_without_nsys_an_export_beside_is_read_else_what_to_install(tmp_path: Path, monkeypatch, capsys):
    monkeypatch.delenv("NSYS", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path / "nothing"))
    report = tmp_path / "r.nsys-rep"
    report.write_bytes(REPORT_BYTES)
    assert kt.main([str(report)]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "needs nsys to be exported" in err and "install" in err
    write_nsys_sqlite(tmp_path / "r.sqlite")
    os.utime(tmp_path / "r.sqlite", (1, 1))
    assert kt.main([str(report)]) == 0
    assert "is older than r.nsys-rep and nsys (Nsight Systems) is not on PATH: read as it is" in \
        capsys.readouterr().out


def test_the_export_folder_must_be_a_writable_folder(tmp_path: Path, capsys):
    report = tmp_path / "r.nsys-rep"
    report.write_bytes(REPORT_BYTES)
    (tmp_path / "afile").write_text("")
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o500)
    for folder, why in ((tmp_path / "afile" / "sub", "not a folder"), (locked / "sub", "not writable")):
        if why == "not writable" and os.access(locked, os.W_OK):
            continue  # root writes anywhere
        with pytest.raises(SystemExit) as exit_info:
            kt.parse_args([str(report), "--export-dir", str(folder)])
        err = capsys.readouterr().err
        assert exit_info.value.code == 2 and why in err and len(err.strip().splitlines()) == 1


def test_an_export_dir_gets_the_export_and_the_reports_folder_nothing(with_fake_nsys: Path, tmp_path: Path):
    report = tmp_path / "r.nsys-rep"
    report.write_bytes(REPORT_BYTES)
    assert kt.main([str(report), "--export-dir", str(tmp_path / "out" / "new")]) == 0
    assert (tmp_path / "out" / "new" / "r.sqlite").is_file() and not (tmp_path / "r.sqlite").exists()


# ---- --summary: one table across nsys_run.sh's reports ----


def write_report(folder: Path, name: str, **record) -> Path:
    """A report as nsys_run.sh leaves it: its export and the profiled run's record (<report>_e2e.jsonl)."""
    write_nsys_sqlite(folder / f"{name}.sqlite")
    (folder / f"{name}_e2e.jsonl").write_text(json.dumps(e2e_record(**record)) + "\n")
    return folder / name


def summary_records(results_dir: Path) -> list[dict]:
    (jsonl,) = (results_dir / "nsys").glob("summary-*.jsonl")
    assert jsonl.with_suffix(".md").read_text().startswith("device: ")
    return kt.summary_rows(results.read_records(jsonl))


def test_summary_puts_the_forward_only_and_training_runs_side_by_side(tmp_path: Path, capsys):
    forward, train = write_report(tmp_path, "tiny_ctx32_forward"), write_report(tmp_path, "tiny_ctx32_train")
    oom = tmp_path / "tiny_ctx64_forward"
    Path(f"{oom}_e2e.jsonl").write_text(json.dumps(e2e_record(status="OOM")) + "\n")  # no report: OOM first
    out_dir = tmp_path / "results"
    kt.write_summary([forward, train, oom], str(out_dir))
    row32, row64 = summary_records(out_dir)
    assert (row32["size"], row32["context_length"], row32["variant"]) == ("tiny", 32, "")
    assert row32["runs"] == {"forward": "ok", "train": "ok"} and row32["forward_from"] == "forward"
    assert row32["forward_nsight_ms"] == pytest.approx(0.3) and row32["forward_stopwatch_ms"] == pytest.approx(0.3)
    # the sgemm runs twice per forward pass (scores and final matmul), 40 of the forward's 58 µs of kernels;
    # a training step has 147 µs, 80 of them matmuls (the sgemms and the backward's xmma gemm)
    assert row32["top_forward_kernel"] == SGEMM and row32["top_forward_kernel_calls_per_forward"] == 2
    assert row32["matmul_pct_forward"] == pytest.approx(100 * 40 / 58)
    assert row32["matmul_pct_train_step"] == pytest.approx(100 * 80 / 147)
    assert row32["top_forward_backward_kernel"] in (SGEMM, XMMA)  # 80 µs each over forward + backward: a tie
    # softmax: 10 µs per call against 22 and 20 µs for the two matmuls; FLOPs 5·B·H·S² against 2·B·S²·d_model
    assert row32["softmax_matmul_time_ratio"] == pytest.approx(10 / 21)
    assert row32["softmax_matmul_flop_ratio"] == pytest.approx(5 * 4 / (2 * 64))
    assert row64["runs"] == {"forward": "OOM"}
    assert "forward_nsight_ms" not in row64
    out = capsys.readouterr().out
    assert "fwd ms Nsight" in out and "matmul % train step" in out
    assert "| forward OOM " in out and "ampere_sgemm_128x64_tn" in out


def test_summary_without_a_forward_only_run_reads_the_training_runs_forward_phase(tmp_path: Path, capsys):
    train = write_report(tmp_path, "small_ctx128_train_bf16_h2025")
    assert kt.main(["--summary", f"{train}.sqlite", "--results-dir", str(tmp_path / "results")]) == 0
    (row,) = summary_records(tmp_path / "results")
    assert (row["size"], row["context_length"], row["variant"]) == ("small", 128, "bf16_h2025")
    assert row["forward_from"] == "train" and row["top_forward_kernel"] == SGEMM
    assert "forward phase of their training" in capsys.readouterr().out


def test_summary_out_names_its_files_in_any_format(tmp_path: Path):
    report = write_report(tmp_path, "tiny_ctx32_train")
    argv = ["--summary", str(report), "--fmt", "latex_booktabs", "--out", "ktl", "--results-dir", str(tmp_path)]
    assert kt.main(argv) == 0
    assert sorted(p.name for p in (tmp_path / "nsys").iterdir()) == ["ktl.jsonl", "ktl.md", "ktl.tex"]
    assert "\\toprule" in (tmp_path / "nsys" / "ktl.tex").read_text()


def test_summary_usage_errors_exit_2(tmp_path: Path, capsys):
    report = write_report(tmp_path, "tiny_ctx32_train")
    trace = torch_gpu_trace(tmp_path / "tiny_ctx128_train_fp32-20250101-120000.json")
    for argv, message in [
        (["--summary", str(tmp_path / "renamed")], "--summary reads nsys_run.sh's reports"),
        (["--summary", str(trace)], "a torch.profiler trace"),  # never an all-blank summary
        (["--summary", str(report), "--md", str(tmp_path / "x.md")], "no --e2e-jsonl, --stopwatch"),
        ([str(report), str(report)], "one report or trace at a time"),
    ]:
        with pytest.raises(SystemExit) as exit_info:
            kt.main(argv)
        err = capsys.readouterr().err
        assert exit_info.value.code == 2 and message in err and len(err.strip().splitlines()) == 1


def test_the_help_says_which_options_go_with_summary_and_the_refusals_agree(tmp_path: Path, capsys):
    report = write_report(tmp_path, "tiny_ctx32_train")
    with pytest.raises(SystemExit):
        kt.parse_args(["--help"])
    text = capsys.readouterr().out
    one, summary = text.split("one report or trace (not with --summary):")[1].split("with --summary only:")
    values = {"--e2e-jsonl": "x.jsonl", "--stopwatch": "forward=1", "--ranges": "forward=F", "--export-dir": "d",
              "--top": "3", "--md": "x.md", "--out": "o", "--results-dir": str(tmp_path)}
    for flags, argv in ((re.findall(r"^  (--[a-z0-9-]+)", one, re.MULTILINE), ["--summary", str(report)]),
                        (re.findall(r"^  (--[a-z0-9-]+)", summary, re.MULTILINE), [str(report)])):
        assert flags and set(flags) - {"--fmt"} <= set(values)
        for flag in (f for f in flags if f != "--fmt"):  # the table format goes with either
            with pytest.raises(SystemExit) as exit_info:
                kt.parse_args([*argv, flag, values[flag]])
            err = capsys.readouterr().err
            assert exit_info.value.code == 2 and flag in err and "--summary" in err, flag
    assert kt.parse_args([str(report), "--fmt", "plain"]).fmt == kt.parse_args(["--summary", str(report), "--fmt",
                                                                                "plain"]).fmt == "plain"


# ---- bench_e2e.py --profile: a real torch.profiler trace on the CPU ----


def test_bench_e2e_profile_on_cpu(tmp_path: Path, capsys):
    argv = ["--device", "cpu", "--size", "tiny", "--num-layers", "2", "--d-model", "64", "--d-ff", "128",
            "--num-heads", "4", "--vocab-size", "256", "--context-length", "16", "--batch-size", "2", "--warmup", "1",
            "--steps", "2", "--profile", "--in-process", "--results-dir", str(tmp_path)]
    assert bench_e2e.main(argv) == 0
    (record,) = results.read_records(next((tmp_path / "e2e").glob("*.jsonl")))
    tables = record["profile"]["tables"]
    assert tables["device"] == "cpu" and tables["steps"] == 2
    assert [row["phase"] for row in tables["phases"]] == ["forward", "backward", "optimizer", "step"]
    assert all(row["range_ms"] > 0 and row["stopwatch_ms"] > 0 and row["work_ms"] > 0 for row in tables["phases"])
    for scope in ("all", "forward", "backward", "optimizer"):
        assert sum(r["share_pct"] for r in tables["top"][scope]) == pytest.approx(100)
    assert {row["scope"]: row["matrix multiply"] for row in tables["categories"]}["forward"] > 0
    attention = {row["sub_step"]: row for row in tables["attention"]}
    assert set(attention) == set(kt.ATTENTION_STEPS)
    assert all(row["calls_per_step"] == 2 and row["ms_per_call"] > 0 for row in attention.values())  # 2 layers
    trace = Path(record["profile"]["trace"])
    assert trace.name.startswith("tiny_ctx16_train_fp32_naive_warmup_1")  # a variant's trace says which it is
    assert kt.build_tables(kt.load_torch_trace(trace))["steps"] == 2  # the saved trace, read again
    out = capsys.readouterr().out
    assert "### 1. Phase times" in out and "### 4. Inside attention" in out and str(trace) in out


def test_a_gzip_bomb_stops_at_the_read_limit_as_it_expands(tmp_path: Path):
    """A .json.gz that expands to 128 MiB, read under `ulimit -v` 256 MiB and no CS336_READ_LIMIT_MB: the default
    limit (a twentieth of that, 12 MiB) stops the expansion: one line, exit 2, resident memory about the limit (a
    1 MiB bomb was a MemoryError traceback at 2 GiB)."""
    bomb, squeeze = tmp_path / "t.json.gz", zlib.compressobj(1, zlib.DEFLATED, 31)  # 31: gzip's framing
    with bomb.open("wb") as f:
        f.write(squeeze.compress(b'{"traceEvents": ['))
        for _ in range(128):
            f.write(squeeze.compress(b" " * (1 << 20)))  # whitespace: read whole, it would be a valid trace
        f.write(squeeze.compress(b"]}") + squeeze.flush())
    child = ("import resource, sys; resource.setrlimit(resource.RLIMIT_AS, (256 << 20,) * 2); import kernel_tables\n"
             "try: sys.exit(kernel_tables.main(sys.argv[1:]))\n"  # VmHWM: the peak resident kB of this program
             "finally: print(open('/proc/self/status').read().split('VmHWM:')[1].split()[0])")  # (ru_maxrss
    # keeps the forking pytest's)
    env = {k: v for k, v in os.environ.items() if k != results.READ_LIMIT_ENV}
    done = subprocess.run([sys.executable, "-c", child, str(bomb)], cwd=HERE, env=env, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1, done.stderr[-2000:]
    assert "the trace expanded holds more than 12 MiB (a twentieth of the memory this process may use" in done.stderr
    assert int(done.stdout) < 100_000, done.stdout  # kB: the limit and Python, not the bomb's 128 MiB


def test_a_trace_that_expands_past_the_read_limit_is_one_line_exit_2(tmp_path: Path, capsys, monkeypatch):
    """A 2 KiB .json.gz that expands to 2 MiB, read under a 1 MiB limit (by default a twentieth of the memory)."""
    monkeypatch.setenv(results.READ_LIMIT_ENV, "1")
    bomb = tmp_path / "t.json.gz"
    bomb.write_bytes(gzip.compress(b'{"traceEvents": [' + b" " * (2 << 20) + b"]}"))
    assert bomb.stat().st_size < 10_000 and kt.main([str(bomb)]) == 2
    err = capsys.readouterr().err
    assert "holds more than 1 MiB (CS336_READ_LIMIT_MB=1)" in err and len(err.strip().splitlines()) == 1
    record = tmp_path / "e2e.jsonl"
    record.write_text('{"status": "ok"}\n' * 100_000)  # 1.7 MB of rows
    assert kt.main([str(torch_gpu_trace(tmp_path / "t.json")), "--e2e-jsonl", str(record)]) == 2
    assert "the record file holds more than 1 MiB" in capsys.readouterr().err
