"""kernel_tables.py and profile_readers.py: the scenario fixtures (an nsys capture as `nsys stats` writes its CSVs,
as an SQLite export, as a torch.profiler trace), nsys CSV parsing (real report shapes and their quirks), the
command line (--stopwatch, --ranges, no nsys here, malformed input), --summary, and bench_e2e.py --profile on CPU.
The tables themselves: test_profile_tables.py; the classifier: test_kernel_categories.py."""
from __future__ import annotations

import csv
import json
import sqlite3
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

import bench_e2e
import common
import kernel_categories as kc
import kernel_tables as kt
import profile_readers as pr
import profile_tables as pt
import results

HERE = Path(__file__).resolve().parent

# ---- an nsys capture in the shapes `nsys stats --format csv` writes ----
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


# ---- the scenario as `nsys stats --format csv` writes it (2023.4.4; test_nsys_real.py checks it against the
# real nsys run on the same scenario as an SQLite export) ----

GPU = "NVIDIA H100 80GB HBM3"
GPU_TRACE_HEADER = ["Start (ns)", "Duration (ns)", "CorrId", "GrdX", "GrdY", "GrdZ", "BlkX", "BlkY", "BlkZ",
                    "Reg/Trd", "StcSMem (MB)", "DymSMem (MB)", "Bytes (MB)", "Throughput (MB/s)", "SrcMemKd",
                    "DstMemKd", "Device", "Ctx", "GreenCtx", "Strm", "Name"]
API_TRACE_HEADER = ["Start (ns)", "Duration (ns)", "Name", "Result", "CorrID", "Pid", "Tid", "T-Pri", "Thread Name"]
NVTX_TRACE_HEADER = ["Start (ns)", "End (ns)", "Duration (ns)", "DurChild (ns)", "DurNonChild (ns)", "Name", "PID",
                     "TID", "Lvl", "NumChild", "RangeId", "ParentId", "RangeStack", "NameTree"]
KERN_SUM_HEADER = ["Time (%)", "Total Time (ns)", "Instances", "Avg (ns)", "Med (ns)", "Min (ns)", "Max (ns)",
                   "StdDev (ns)", "Name"]
MEMSET_BYTES = 1024
API_NS = 3_000  # duration of every launch call
SYNC = (MEASURE[1] - 5_000, 4_000, 9_999)  # a cudaDeviceSynchronize: (start, duration, correlation id)
FIXTURE_REPORTS = ("cuda_gpu_trace", "cuda_api_trace", "nvtx_pushpop_trace", "cuda_gpu_kern_sum")


def nsys_csv(header: list[str], rows: list[list]) -> str:
    """A report as nsys writes it: the header first (no console lines), a field holding a comma quoted without
    doubling the quotes inside it, and an empty file for a report without rows."""
    def field(value) -> str:
        text = "" if value is None else str(value)
        return f'"{text}"' if "," in text else text
    if not rows:
        return ""
    return "".join(",".join(field(v) for v in row) + "\n" for row in [header, *rows])


def nvtx_rows(ranges: list[tuple], name_prefix: str = "") -> list[list]:
    """nvtx_pushpop_trace rows: per thread, each range's parent is the innermost range that contains it."""
    ordered = sorted(ranges, key=lambda r: (r[1], -r[2]))
    ids = {id(r): i + 1 for i, r in enumerate(ordered)}
    parent = {}
    for r in ordered:
        enclosing = [o for o in ordered if o is not r and o[3] == r[3] and o[1] <= r[1] and r[2] <= o[2]]
        parent[id(r)] = min(enclosing, key=lambda o: o[2] - o[1]) if enclosing else None
    rows = []
    for r in ordered:
        name, start, end, tid, _ = r
        children = [c for c in ordered if parent[id(c)] is r]
        stack, node = [], r
        while node is not None:
            stack.insert(0, ids[id(node)])
            node = parent[id(node)]
        child_ns = sum(c[2] - c[1] for c in children)
        rows.append([start, end, end - start, child_ns, end - start - child_ns, name_prefix + name, PID, tid,
                     len(stack) - 1, len(children), ids[id(r)], ids[id(parent[id(r)])] if parent[id(r)] else None,
                     "".join(f":{i}" for i in stack), "--" * (len(stack) - 1) + name_prefix + name])
    return rows


def kernel_summary_rows(launches: list[tuple]) -> list[list]:
    durations: dict[str, list[int]] = {}
    for _, _, _, name, _, dur in launches:
        if name != MEMSET:
            durations.setdefault(name, []).append(dur)
    total = sum(sum(d) for d in durations.values())
    rows = []
    for name, d in durations.items():
        mean = sum(d) / len(d)
        std = (sum((x - mean) ** 2 for x in d) / (len(d) - 1)) ** 0.5 if len(d) > 1 else 0.0
        rows.append([f"{100 * sum(d) / total:.1f}", sum(d), len(d), f"{mean:.1f}", f"{statistics.median(d):.1f}",
                     min(d), max(d), f"{std:.1f}", name])
    return sorted(rows, key=lambda row: (-row[1], row[2], row[8]))


def write_nsys_fixture(folder: Path, stem: str = "report", name_prefix: str = "") -> Path:
    """The reports kernel_tables reads, as `nsys stats --format csv --output folder/stem` writes them for the
    scenario. name_prefix=":" gives range names as newer nsys report scripts print them (':forward'; nsys
    2023.4 prints 'forward'). Returns the prefix."""
    ranges, launches = scenario()
    gpu_rows = []
    for corr, _, _, name, start, dur in sorted(launches, key=lambda launch: launch[4]):
        if name == MEMSET:
            gpu_rows.append([start, dur, corr, *[None] * 7, None, None, f"{MEMSET_BYTES / 1e6:.3f}",
                             f"{MEMSET_BYTES * (1e9 / dur) / 1e6:.3f}", "Device", None, f"{GPU} (0)", 1, None, 7,
                             name])
        else:
            gpu_rows.append([start, dur, corr, 128, 1, 1, 256, 1, 1, 32, "0.000", "0.000", None, None, None, None,
                             f"{GPU} (0)", 1, None, 7, name])
    api_rows = [[start, API_NS, "cudaMemsetAsync" if name == MEMSET else "cudaLaunchKernel", 0, corr, PID, tid, 20,
                 "python" if tid == MAIN else "pt_autograd_0"] for corr, start, tid, name, _, _ in launches]
    api_rows.append([SYNC[0], SYNC[1], "cudaDeviceSynchronize", 0, SYNC[2], PID, MAIN, 20, "python"])
    texts = {"cuda_gpu_trace": nsys_csv(GPU_TRACE_HEADER, gpu_rows),
             "cuda_api_trace": nsys_csv(API_TRACE_HEADER, sorted(api_rows, key=lambda row: row[0])),
             "nvtx_pushpop_trace": nsys_csv(NVTX_TRACE_HEADER, nvtx_rows(ranges, name_prefix)),
             "cuda_gpu_kern_sum": nsys_csv(KERN_SUM_HEADER, kernel_summary_rows(launches))}
    prefix = folder / stem
    for report, text in texts.items():
        pr.nsys_report_path(prefix, report).write_text(text)
    return prefix


def write_nsys_sqlite(path: Path) -> Path:
    """The scenario as the SQLite export `nsys stats` reads: the tables and columns its report scripts query
    (nsys 2023.4's CUPTI_ACTIVITY_KIND_*, NVTX_EVENTS, StringIds, ThreadNames, TARGET_INFO_GPU), for running the
    real nsys stats on the very events the CSV fixture describes."""
    ranges, launches = scenario()
    db = sqlite3.connect(path)
    db.executescript("""
        CREATE TABLE StringIds (id INTEGER PRIMARY KEY, value TEXT NOT NULL);
        CREATE TABLE ThreadNames (nameId INTEGER NOT NULL, priority INTEGER, globalTid INTEGER);
        CREATE TABLE TARGET_INFO_GPU (id INTEGER NOT NULL, name TEXT);
        CREATE TABLE ENUM_CUDA_MEM_KIND (id INTEGER PRIMARY KEY, name TEXT NOT NULL, label TEXT NOT NULL);
        CREATE TABLE CUPTI_ACTIVITY_KIND_KERNEL (start INTEGER NOT NULL, end INTEGER NOT NULL,
            deviceId INTEGER NOT NULL, contextId INTEGER NOT NULL, greenContextId INTEGER, streamId INTEGER NOT NULL,
            correlationId INTEGER, globalPid INTEGER, demangledName INTEGER NOT NULL, shortName INTEGER NOT NULL,
            mangledName INTEGER, gridX INTEGER, gridY INTEGER, gridZ INTEGER, blockX INTEGER, blockY INTEGER,
            blockZ INTEGER, registersPerThread INTEGER, staticSharedMemory INTEGER, dynamicSharedMemory INTEGER);
        CREATE TABLE CUPTI_ACTIVITY_KIND_MEMSET (start INTEGER NOT NULL, end INTEGER NOT NULL,
            deviceId INTEGER NOT NULL, contextId INTEGER NOT NULL, greenContextId INTEGER, streamId INTEGER NOT NULL,
            correlationId INTEGER, globalPid INTEGER, value INTEGER, bytes INTEGER, memKind INTEGER);
        CREATE TABLE CUPTI_ACTIVITY_KIND_RUNTIME (start INTEGER NOT NULL, end INTEGER NOT NULL, eventClass INTEGER,
            globalTid INTEGER, correlationId INTEGER, nameId INTEGER NOT NULL, returnValue INTEGER NOT NULL,
            callchainId INTEGER);
        CREATE TABLE NVTX_EVENTS (start INTEGER NOT NULL, end INTEGER, eventType INTEGER NOT NULL, rangeId INTEGER,
            category INTEGER, color INTEGER, text TEXT, globalTid INTEGER, endGlobalTid INTEGER, textId INTEGER,
            domainId INTEGER, uint64Value INTEGER, int64Value INTEGER, doubleValue REAL, uint32Value INTEGER,
            int32Value INTEGER, floatValue REAL, jsonTextId INTEGER, jsonText TEXT);
    """)
    strings: dict[str, int] = {}

    def string_id(text: str) -> int:
        if text not in strings:
            strings[text] = len(strings) + 1
            db.execute("INSERT INTO StringIds VALUES (?, ?)", (strings[text], text))
        return strings[text]

    def global_tid(tid: int) -> int:  # nsys packs the process and thread ids into one integer
        return (PID << 24) | tid

    db.execute("INSERT INTO TARGET_INFO_GPU VALUES (0, ?)", (GPU,))
    db.execute("INSERT INTO ENUM_CUDA_MEM_KIND VALUES (3, 'CUDA_MEMOPR_MEMORY_KIND_DEVICE', 'Device')")
    for tid, name in ((MAIN, "python"), (AUTOGRAD, "pt_autograd_0")):
        db.execute("INSERT INTO ThreadNames VALUES (?, 20, ?)", (string_id(name), global_tid(tid)))
    for corr, at, tid, name, start, dur in launches:
        api = "cudaMemsetAsync_v3020" if name == MEMSET else "cudaLaunchKernel_v7000"
        db.execute("INSERT INTO CUPTI_ACTIVITY_KIND_RUNTIME VALUES (?, ?, 1, ?, ?, ?, 0, NULL)",
                   (at, at + API_NS, global_tid(tid), corr, string_id(api)))
        if name == MEMSET:
            db.execute("INSERT INTO CUPTI_ACTIVITY_KIND_MEMSET VALUES (?, ?, 0, 1, 0, 7, ?, ?, 0, ?, 3)",
                       (start, start + dur, corr, PID << 24, MEMSET_BYTES))
        else:
            db.execute("INSERT INTO CUPTI_ACTIVITY_KIND_KERNEL VALUES "
                       "(?, ?, 0, 1, 0, 7, ?, ?, ?, ?, NULL, 128, 1, 1, 256, 1, 1, 32, 0, 0)",
                       (start, start + dur, corr, PID << 24, string_id(name), string_id(name)))
    db.execute("INSERT INTO CUPTI_ACTIVITY_KIND_RUNTIME VALUES (?, ?, 1, ?, ?, ?, 0, NULL)",
               (SYNC[0], SYNC[0] + SYNC[1], global_tid(MAIN), SYNC[2], string_id("cudaDeviceSynchronize_v3020")))
    for name, start, end, tid, _ in sorted(ranges, key=lambda r: (r[1], -r[2])):
        db.execute("INSERT INTO NVTX_EVENTS (start, end, eventType, text, globalTid, domainId) "
                   "VALUES (?, ?, 59, ?, ?, 0)", (start, end, name, global_tid(tid)))  # 59: push/pop range
    db.commit()
    db.close()
    return path


def torch_gpu_trace(path: Path) -> Path:
    """The fixture's scenario as a torch.profiler Chrome trace (µs): runtime calls on the launching threads,
    kernels on a stream, correlation ids joining them."""
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
    """A bench_e2e JSONL record for the fixture's run: 2 steps whose stopwatch agrees with the ranges."""
    record = {"config": {"size": "tiny", "batch_size": 2, "attn": "naive",
                         "model": {"d_model": 64, "d_ff": 128, "num_layers": 1, "num_heads": 4, "context_length": 32}},
              "status": "ok", "environment": common.environment(common.resolve_device("cpu")),
              "forward_ms": [0.300, 0.300], "backward_ms": [0.400, 0.400], "optimizer_ms": [0.200, 0.200],
              "step_ms": [1.0, 1.0]}
    record.update(overrides)
    return record


@pytest.fixture
def nsys_prefix(tmp_path: Path) -> Path:
    return write_nsys_fixture(tmp_path)


# ---- parsing the reports ----


def test_reader_keeps_commas_and_the_quotes_nsys_does_not_escape(nsys_prefix: Path):
    trace = pr.nsys_report_path(nsys_prefix, "cuda_gpu_trace")
    assert trace.read_text().startswith("Start (ns),Duration (ns),CorrId,")  # the file starts at its header
    rows = pr.read_nsys_csv(trace, ("Start (ns)", "CorrId", "Name"))
    names = {row["name"] for row in rows}
    assert COMMA_KERNEL in names and QUOTE_KERNEL in names
    assert len(rows) == 1 + 2 * len(STEP_LAUNCHES)
    kern_sum = pr.read_nsys_csv(pr.nsys_report_path(nsys_prefix, "cuda_gpu_kern_sum"), ("Total Time (ns)", "Name"))
    assert QUOTE_KERNEL in {r["name"] for r in kern_sum}
    # nsys writes that name as "void my_kernel<"a, b">(int)", which the csv module splits in the wrong places
    quoted_line = next(line for line in trace.read_text().splitlines() if "my_kernel" in line)
    assert next(csv.reader([quoted_line]))[-1] != QUOTE_KERNEL
    assert pr.split_nsys_csv_line(quoted_line)[-1] == QUOTE_KERNEL
    assert pr.split_nsys_csv_line('"a ""b"", c",,x') == ['a "b", c', "", "x"]  # escaped quotes, should nsys


@pytest.mark.parametrize("name_prefix", ["", ":"])  # nsys 2023.4 writes 'forward', newer report scripts ':forward'
def test_range_names_with_and_without_the_default_domain_prefix(tmp_path: Path, name_prefix: str):
    prefix = write_nsys_fixture(tmp_path, name_prefix=name_prefix)
    first = pr.read_nsys_csv(pr.nsys_report_path(prefix, "nvtx_pushpop_trace"), ("Name",))[0]["name"]
    assert first == name_prefix + "forward"  # the warm-up forward, the earliest range
    profile = pr.load_nsys(prefix)
    assert {r.name for r in profile.ranges} == {"measure", "forward", "backward", "optimizer", "final matmul",
                                                "scaled dot product attention", "computing attention scores",
                                                "computing softmax"}
    assert pr.strip_domain("aten::mm") == "aten::mm"  # only the empty default domain's leading colon goes


def test_reader_errors_name_the_missing_columns_and_empty_reports_have_no_rows(tmp_path: Path):
    bad = tmp_path / "x_cuda_gpu_trace.csv"
    bad.write_text("Start (us),Duration (us),CorrId,Name\n1,2,3,k\n")
    with pytest.raises(pr.ProfileFormatError, match="start \\(ns\\)"):
        pr.read_nsys_csv(bad, ("Start (ns)", "Name"))
    console = tmp_path / "console.csv"  # what the old fake fixtures had: console lines inside the file
    console.write_text("Generating SQLite file r.sqlite from r.nsys-rep\nStart (ns),Name\n1,k\n")
    with pytest.raises(pr.ProfileFormatError, match="no column"):
        pr.read_nsys_csv(console, ("Start (ns)", "Name"))
    shifted = tmp_path / "shifted.csv"
    shifted.write_text('Start (ns),Name\n1,"a",b"\n')
    with pytest.raises(pr.ProfileFormatError, match="3 fields where the header has 2"):
        pr.read_nsys_csv(shifted, ("Name",))
    empty = tmp_path / "y_cuda_gpu_trace.csv"
    empty.write_text("")  # nsys: "SKIPPED: y.sqlite does not contain CUDA kernel data." on the console
    assert pr.read_nsys_csv(empty, ("Name",)) == []


def test_a_report_without_kernels_gives_the_phase_ranges_and_says_why_there_is_nothing_else(nsys_prefix: Path):
    for report in ("cuda_gpu_trace", "cuda_api_trace", "cuda_gpu_kern_sum"):  # as nsys writes them on a CPU
        pr.nsys_report_path(nsys_prefix, report).write_text("")
    profile = pr.load_nsys(nsys_prefix)
    assert profile.activities == [] and pr.nsys_kernel_total_check(nsys_prefix, profile) is None
    tables = pt.build_tables(profile, pt.stopwatch_ms(e2e_record()), pt.attention_shape(e2e_record()["config"]))
    phases = {row["phase"]: row for row in tables["phases"]}
    assert phases["forward"]["range_ms"] == pytest.approx(0.3) and phases["forward"]["agrees"] == "yes"
    assert all(row["work_ms"] is None for row in tables["phases"])  # unknown, not zero
    assert tables["top"] == {} and tables["categories"] == [] and tables["attention"] == []
    assert pt.NO_KERNELS in tables["notes"]
    text = pt.render_tables(tables)
    assert "### 1. Phase times" in text and "### 2." not in text and "### 3." not in text
    assert "no CUDA kernel data in this report" in text


def test_cli_on_nsys_report_writes_markdown(nsys_prefix: Path, tmp_path: Path, capsys):
    jsonl = tmp_path / "e2e.jsonl"
    jsonl.write_text(json.dumps(e2e_record()) + "\n")
    md = tmp_path / "report.md"
    assert kt.main([f"{nsys_prefix}.nsys-rep", "--e2e-jsonl", str(jsonl), "--md", str(md)]) == 0
    out = capsys.readouterr().out
    assert out.startswith("device: ") and "### 2. Top kernels by GPU time: backward" in out
    assert md.read_text().strip() == out.split("\nwrote ")[0].strip()
    jsonl.write_text(json.dumps(e2e_record(status="OOM")) + "\n")
    assert kt.main([str(nsys_prefix), "--e2e-jsonl", str(jsonl)]) == 1


def test_cli_usage_errors_exit_2(tmp_path: Path):
    missing = subprocess.run([sys.executable, str(HERE / "kernel_tables.py"), str(tmp_path / "nothing.nsys-rep")],
                             capture_output=True, text=True)
    assert missing.returncode == 2 and "cuda_gpu_trace.csv" in missing.stderr
    assert len(missing.stderr.strip().splitlines()) == 1


def test_a_report_without_an_nsys_here_reads_its_earlier_csvs_or_says_what_to_install(nsys_prefix: Path,
                                                                                      monkeypatch, capsys):
    monkeypatch.delenv("NSYS", raising=False)
    monkeypatch.setenv("PATH", str(nsys_prefix.parent))  # no nsys on it
    report = Path(f"{nsys_prefix}.nsys-rep")
    report.write_bytes(b"NVIDIA Tegra Profiler Report 2023@4@4@54-234433681190v0.\n")
    assert kt.main([str(report)]) == 0
    captured = capsys.readouterr()
    assert "nsys (Nsight Systems) is not on PATH: reading the CSVs exported earlier" in captured.err
    assert "### 2. Top kernels by GPU time" in captured.out
    for csv in nsys_prefix.parent.glob("*.csv"):
        csv.unlink()
    assert kt.main([str(report)]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "needs nsys stats to be read" in err and "install" in err


@pytest.mark.parametrize("args, message", [
    (["--stopwatch", "forward"], "give KEY=MS with KEY one of forward, backward, optimizer, step"),
    (["--stopwatch", "fwd=3"], "got 'fwd=3'"),
    (["--stopwatch", "forward=fast"], "times are milliseconds"),
    (["--stopwatch", "forward=-1"], "positive finite"),
    (["--stopwatch", "forward=1,forward=2"], "forward given twice"),
    (["--ranges", "forward"], "give KEY=NAME with KEY one of forward, backward, optimizer, step, measure"),
    (["--ranges", "warmup=x"], "got 'warmup=x'"),
])
def test_stopwatch_and_ranges_usage_errors_exit_2(nsys_prefix: Path, capsys, args: list[str], message: str):
    with pytest.raises(SystemExit) as exit_info:
        kt.parse_args([str(nsys_prefix), *args])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and message in err and len(err.strip().splitlines()) == 1


def test_stopwatch_given_by_hand_fills_table_1(nsys_prefix: Path, capsys):
    assert kt.main([str(nsys_prefix), "--stopwatch", "forward=0.3,backward=0.4", "optimizer=0.5"]) == 0
    out = capsys.readouterr().out
    assert "profiler ranges vs your stopwatch (--stopwatch)" in out
    table_1 = out[out.index("### 1."):out.index("### 2.")]
    rows = {line.split("|")[1].strip(): line for line in table_1.splitlines() if line.startswith("| ")}
    assert "| yes" in rows["forward"] and "| NO" in rows["optimizer"]  # the range is 0.2 ms: 0.4x of 0.5
    with pytest.raises(SystemExit):
        kt.parse_args([str(nsys_prefix), "--stopwatch", "forward=1", "--e2e-jsonl", str(nsys_prefix)])
    assert "not both" in capsys.readouterr().err


def test_help_starts_without_torch():
    """A reader of traces and records: `kernel_tables.py --help` (and nsys_run.sh's Python side) never import
    torch (docs/nsys_run.md has its start time)."""
    probe = ("import sys; sys.argv = [sys.argv[0], '--help']\n"
             "import {module}\n"
             "try:\n    {module}.main()\nexcept SystemExit as exc:\n    assert exc.code == 0\n"
             "print('torch' in sys.modules, sorted(m for m in sys.modules if m.split('.')[0] == 'torch')[:3])")
    for module in ("kernel_tables", "nsys_sweep"):
        result = subprocess.run([sys.executable, "-c", probe.format(module=module)], capture_output=True, text=True,
                                cwd=HERE, timeout=60)
        assert result.returncode == 0, result.stderr
        assert result.stdout.strip().splitlines()[-1] == "False []", module
        assert "usage:" in result.stdout


# ---- --summary: one table across several reports ----


def write_report(folder: Path, name: str, **record) -> Path:
    """A report as nsys_run.sh leaves it: the CSVs and the profiled run's record (<report>_e2e.jsonl)."""
    prefix = write_nsys_fixture(folder, name)
    Path(f"{prefix}_e2e.jsonl").write_text(json.dumps(e2e_record(**record)) + "\n")
    return prefix


def summary_records(results_dir: Path) -> list[dict]:
    (jsonl,) = (results_dir / "nsys").glob("summary-*.jsonl")
    assert jsonl.with_suffix(".md").read_text().startswith("device: ")
    return results.read_records(jsonl)


def test_summary_puts_the_forward_only_and_training_runs_side_by_side(tmp_path: Path, capsys):
    forward, train = write_report(tmp_path, "tiny_ctx32_forward"), write_report(tmp_path, "tiny_ctx32_train")
    oom = tmp_path / "tiny_ctx64_forward"
    Path(f"{oom}_e2e.jsonl").write_text(json.dumps(e2e_record(status="OOM")) + "\n")  # no report: OOM first
    skipped = tmp_path / "tiny_ctx64_train"
    results = tmp_path / "results"
    assert kt.main(["--summary", f"{forward}.nsys-rep", str(train), str(oom), str(skipped),
                    "--status", f"{skipped}=skipped: OOM at context_length=64", "--results-dir", str(results)]) == 0
    row32, row64 = summary_records(results)
    assert (row32["size"], row32["context_length"], row32["variant"]) == ("tiny", 32, "")
    assert row32["runs"] == {"forward": "ok", "train": "ok"} and row32["forward_from"] == "forward"
    # per forward pass (2 measured steps): the forward range lasts 300 µs, as the stopwatch says
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
    assert row64["runs"] == {"forward": "OOM", "train": "skipped: OOM at context_length=64"}
    assert "forward_nsight_ms" not in row64
    out = capsys.readouterr().out
    assert "fwd ms Nsight" in out and "matmul % train step" in out
    assert "forward OOM, train skipped: OOM at context_length=64" in out and "ampere_sgemm_128x64_tn" in out


def test_summary_without_a_forward_only_run_reads_the_training_runs_forward_phase(tmp_path: Path, capsys):
    train = write_report(tmp_path, "small_ctx128_train_bf16_h2025")
    results = tmp_path / "results"
    assert kt.main(["--summary", str(train), "--results-dir", str(results)]) == 0
    (row,) = summary_records(results)
    assert (row["size"], row["context_length"], row["variant"]) == ("small", 128, "bf16_h2025")
    assert row["forward_from"] == "train" and row["top_forward_kernel"] == SGEMM
    assert row["matmul_pct_forward"] == pytest.approx(100 * 40 / 58)
    assert "forward phase of their training" in capsys.readouterr().out


def test_summary_usage_errors_exit_2(tmp_path: Path, capsys):
    report = write_report(tmp_path, "tiny_ctx32_train")
    for argv, message in [
        (["--summary", str(tmp_path / "renamed")], "not a report name that nsys_run.sh writes"),
        (["--summary", str(report), "--status", f"{tmp_path / 'tiny_ctx64_train'}=skipped"], "names none of"),
        (["--summary", str(report), "--md", str(tmp_path / "x.md")], "no --e2e-jsonl, --md"),
        ([str(report), str(report)], "one report or trace at a time"),
        ([str(report), "--status", f"{report}=x"], "go with --summary"),
    ]:
        with pytest.raises(SystemExit) as exit_info:
            kt.main(argv)
        assert exit_info.value.code == 2
        err = capsys.readouterr().err
        assert message in err and len(err.strip().splitlines()) == 1


# ---- malformed input: one line, exit 2 ----


@pytest.mark.parametrize("content", [
    b'{"traceEvents": [{"ph": "X", "name": "a", ',  # truncated (the profiler was killed while writing)
    b"[1, 2, 3]",  # JSON, but not an object
    b'{"traceEvents": 5}',
    b'{"traceEvents": [{"ph": "X", "cat": "cpu_op", "name": "a", "ts": "soon", "dur": 1}]}',
    b"\xff\xfe not text",
    b"",
], ids=["truncated", "not-an-object", "events-not-a-list", "field-of-wrong-type", "not-utf8", "empty"])
def test_malformed_trace_is_one_line_exit_2(content: bytes, tmp_path: Path, capsys):
    trace = tmp_path / "t.json"
    trace.write_bytes(content)
    assert kt.main([str(trace)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and len(err.strip().splitlines()) == 1


def test_malformed_gzip_trace_is_one_line_exit_2(tmp_path: Path, capsys):
    trace = tmp_path / "t.json.gz"
    trace.write_bytes(b"not gzip at all")
    assert kt.main([str(trace)]) == 2
    assert len(capsys.readouterr().err.strip().splitlines()) == 1


@pytest.mark.parametrize("content", ["", "not json\n", "[1, 2]\n", '{"environment": 5, "status": "ok"}\n',
                                     '{"step_ms": "fast", "status": "ok"}\n'],
                         ids=["empty", "not-json", "not-an-object", "environment-not-an-object", "samples-not-numbers"])
def test_malformed_e2e_jsonl_is_one_line_exit_2(content: str, tmp_path: Path, capsys):
    jsonl = tmp_path / "e2e.jsonl"
    jsonl.write_text(content)
    assert kt.main([str(torch_gpu_trace(tmp_path / "t.json")), "--e2e-jsonl", str(jsonl)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and len(err.strip().splitlines()) == 1


def test_e2e_jsonl_that_is_a_folder_is_one_line_exit_2(tmp_path: Path, capsys):
    (tmp_path / "dir.jsonl").mkdir()
    assert kt.main([str(torch_gpu_trace(tmp_path / "t.json")), "--e2e-jsonl", str(tmp_path / "dir.jsonl")]) == 2
    assert len(capsys.readouterr().err.strip().splitlines()) == 1


def test_md_must_name_a_file_in_an_existing_folder(tmp_path: Path, capsys):
    trace = str(torch_gpu_trace(tmp_path / "t.json"))
    for md in (str(tmp_path), str(tmp_path / "missing" / "t.md"), ""):
        with pytest.raises(SystemExit) as exit_:
            kt.main([trace, "--md", md])
        assert exit_.value.code == 2 and len(capsys.readouterr().err.strip().splitlines()) == 1
    assert not (tmp_path / "missing").exists()


# ---- bench_e2e.py --profile on the CPU ----

SMALL_MODEL = ["--device", "cpu",
               "--size", "tiny", "--num-layers", "2", "--d-model", "64", "--d-ff", "128", "--num-heads", "4",
               "--vocab-size", "256", "--context-length", "16", "--batch-size", "2", "--warmup", "1", "--steps", "2"]


def test_bench_e2e_profile_on_cpu(tmp_path: Path, capsys):
    # runs in the default spawn child: the trace path and the table rows must come back in the record
    assert bench_e2e.main(SMALL_MODEL + ["--profile", "--results-dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    (record,) = results.read_records(next((tmp_path / "e2e").glob("*.jsonl")))
    tables = record["profile"]["tables"]
    assert tables["device"] == "cpu" and tables["steps"] == 2
    assert [row["phase"] for row in tables["phases"]] == ["forward", "backward", "optimizer", "step"]
    for row in tables["phases"]:
        assert row["range_ms"] > 0 and row["stopwatch_ms"] > 0 and row["work_ms"] > 0
    for scope in ("all", "forward", "backward", "optimizer"):
        assert tables["top"][scope], scope
        assert sum(r["share_pct"] for r in tables["top"][scope]) == pytest.approx(100)
    for row in tables["categories"]:
        assert sum(row[c] for c in kc.CATEGORIES) == pytest.approx(100)
    assert {row["scope"]: row["matrix multiply"] for row in tables["categories"]}["forward"] > 0
    attention = {row["sub_step"]: row for row in tables["attention"]}
    assert set(attention) == set(pt.ATTENTION_STEPS)
    assert all(row["calls_per_step"] == 2 and row["ms_per_call"] > 0 for row in attention.values())  # 2 layers
    trace = Path(record["profile"]["trace"])
    assert trace.parent == tmp_path / "profile"
    assert json.loads(trace.read_text())["traceEvents"]
    assert "### 1. Phase times" in out and "### 4. Inside attention" in out and str(trace) in out
    assert "### 3. Category shares" in next((tmp_path / "e2e").glob("*.md")).read_text()
