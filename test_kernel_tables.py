"""kernel_tables.py: nsys CSV parsing (real report shapes and their quirks), launch-window attribution across
threads, the four tables, the kernel-name classifier, torch.profiler traces, and bench_e2e.py --profile on CPU."""
from __future__ import annotations

import csv
import io
import json
import subprocess
import sys
from pathlib import Path

import pytest

import bench_e2e
import common
import kernel_tables as kt

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


def _csv(header: str, rows: list[list], preamble: str = "") -> str:
    out = io.StringIO()
    out.write(preamble)
    out.write(header + "\n")
    csv.writer(out, lineterminator="\n").writerows(rows)
    return out.getvalue()


def _summary(values_by_name: dict[str, list[int]]) -> list[list]:
    total = sum(sum(v) for v in values_by_name.values())
    rows = []
    for name, v in sorted(values_by_name.items(), key=lambda kv: -sum(kv[1])):
        mean = sum(v) / len(v)
        rows.append([f"{100 * sum(v) / total:.1f}", sum(v), len(v), f"{mean:.1f}", f"{sorted(v)[len(v) // 2]:.1f}",
                     min(v), max(v), "0.0", name])
    return rows


SUM_HEADER = "Time (%),Total Time (ns),Instances,Avg (ns),Med (ns),Min (ns),Max (ns),StdDev (ns)"


def write_nsys_fixture(folder: Path, stem: str = "report") -> Path:
    """The six CSVs nsys_run.sh asks `nsys stats --output folder/stem` for, in their real column sets (nsys
    2024-2026), with informational lines before some headers and CSV-quoted names. Returns the prefix."""
    ranges, launches = scenario()
    prefix = folder / stem
    gpu_rows = []
    for corr, _, _, name, start, dur in launches:
        if name == MEMSET:
            gpu_rows.append([start, dur, corr, "", "", "", "", "", "", "", "", "", "0.001", "1000.0", "Device", "",
                             "NVIDIA H100 80GB HBM3 (0)", 1, "", 7, name])
        else:
            gpu_rows.append([start, dur, corr, 128, 1, 1, 256, 1, 1, 32, "0.000", "0.000", "", "", "", "",
                             "NVIDIA H100 80GB HBM3 (0)", 1, "", 7, name])
    preamble = ("Generating SQLite file report.sqlite from report.nsys-rep\n"
                "Processing [report.sqlite] with [/opt/nvidia/nsight-systems/2025.3.2/host-linux-x64/reports/"
                "cuda_gpu_trace.py]... \n")
    files = {
        "cuda_gpu_trace": _csv("Start (ns),Duration (ns),CorrId,GrdX,GrdY,GrdZ,BlkX,BlkY,BlkZ,Reg/Trd,StcSMem (MB),"
                               "DymSMem (MB),Bytes (MB),Throughput (MB/s),SrcMemKd,DstMemKd,Device,Ctx,GreenCtx,Strm,Name",
                               gpu_rows, preamble),
        "cuda_api_trace": _csv("Start (ns),Duration (ns),Name,Result,CorrID,Pid,Tid,T-Pri,Thread Name",
                               [[start, 3_000, "cudaMemsetAsync" if name == MEMSET else "cudaLaunchKernel", 0, corr,
                                 PID, tid, 20, "python" if tid == MAIN else "pt_autograd_0"]
                                for corr, start, tid, name, _, _ in launches]
                               + [[MEASURE[1] - 5_000, 4_000, "cudaDeviceSynchronize", 0, 9_999, PID, MAIN, 20, "python"]]),
        "nvtx_pushpop_trace": _csv("Start (ns),End (ns),Duration (ns),DurChild (ns),DurNonChild (ns),Name,PID,TID,Lvl,"
                                   "NumChild,RangeId,ParentId,RangeStack,NameTree",
                                   [[a, b, b - a, 0, b - a, f":{name}", PID, tid, level, 0, i + 1, "", f":{i + 1}",
                                     "--" * level + f":{name}"]
                                    for i, (name, a, b, tid, level) in enumerate(sorted(ranges, key=lambda r: r[1]))]),
    }
    kernels: dict[str, list[int]] = {}
    for _, _, _, name, _, dur in launches:
        if name != MEMSET:
            kernels.setdefault(name, []).append(dur)
    range_durations: dict[str, list[int]] = {}
    for name, a, b, _, _ in ranges:
        range_durations.setdefault(f":{name}", []).append(b - a)
    files["cuda_gpu_kern_sum"] = _csv(SUM_HEADER + ",Name", _summary(kernels))
    files["nvtx_sum"] = _csv(SUM_HEADER + ",Style,Range", [row[:-1] + ["PushPop", row[-1]]
                                                           for row in _summary(range_durations)],
                             "NOTICE: Existing SQLite export found: report.sqlite\n")
    # nvtx_kern_sum groups by the LAUNCHING thread's range stack: the autograd thread's kernels have none
    files["nvtx_kern_sum"] = _csv(
        "NVTX Range,Style,PID,TID,NVTX Inst,Kern Inst,Total Time (ns),Avg (ns),Med (ns),Min (ns),Max (ns),"
        "StdDev (ns),Kernel Name",
        [[":forward", "PushPop", PID, MAIN, 2, 2, 10_000, "5000.0", "5000.0", 5_000, 5_000, "0.0", COMMA_KERNEL],
         [":forward", "PushPop", PID, MAIN, 2, 2, 2_000, "1000.0", "1000.0", 1_000, 1_000, "0.0", QUOTE_KERNEL]])
    for report, text in files.items():
        kt.nsys_report_path(prefix, report).write_text(text)
    return prefix


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


def test_reader_skips_informational_lines_and_keeps_commas_and_quotes(nsys_prefix: Path):
    rows = kt.read_nsys_csv(kt.nsys_report_path(nsys_prefix, "cuda_gpu_trace"), ("Start (ns)", "CorrId", "Name"))
    names = {row["name"] for row in rows}
    assert COMMA_KERNEL in names and QUOTE_KERNEL in names
    assert len(rows) == 1 + 2 * len(STEP_LAUNCHES)
    kern_sum = kt.read_nsys_csv(kt.nsys_report_path(nsys_prefix, "nvtx_kern_sum"), ("NVTX Range", "Kernel Name"))
    assert {r["kernel name"] for r in kern_sum} == {COMMA_KERNEL, QUOTE_KERNEL}


def test_domain_prefix_is_stripped_from_range_names(nsys_prefix: Path):
    nvtx_sum = kt.read_nsys_csv(kt.nsys_report_path(nsys_prefix, "nvtx_sum"), ("Range", "Instances"))
    assert {kt.strip_domain(r["range"]) for r in nvtx_sum} >= {"forward", "backward", "optimizer", "measure"}
    assert kt.strip_domain("aten::mm") == "aten::mm"  # only the empty default domain's leading colon goes
    profile = kt.load_nsys(nsys_prefix)
    assert {r.name for r in profile.ranges} == {"measure", "forward", "backward", "optimizer", "final matmul",
                                                "scaled dot product attention", "computing attention scores",
                                                "computing softmax"}


def test_reader_errors_name_the_missing_columns(tmp_path: Path):
    bad = tmp_path / "x_cuda_gpu_trace.csv"
    bad.write_text("Start (us),Duration (us),CorrId,Name\n1,2,3,k\n")
    with pytest.raises(kt.ProfileFormatError, match="start \\(ns\\)"):
        kt.read_nsys_csv(bad, ("Start (ns)", "Name"))
    skipped = tmp_path / "y.csv"
    skipped.write_text("SKIPPED: report.sqlite does not contain CUDA kernel data.\n")
    assert kt.read_nsys_csv(skipped, ("Name",)) == []


# ---- attribution and the tables on the nsys fixture ----


def test_kernels_go_to_the_phase_whose_window_holds_their_launch(nsys_prefix: Path):
    activities, ranges = kt.measured(kt.load_nsys(nsys_prefix))
    groups = kt.attribute(activities, ranges, kt.PHASES)
    backward = [a.name for a in groups["backward"]]
    # launched by the autograd thread, which never opened "backward"; the copy ran after the range closed
    assert sorted(backward) == sorted([XMMA, SUM_REDUCE, DIRECT_COPY] * 2)
    assert [a.name for a in groups["optimizer"]] == [FOREACH] * 2
    assert [a.name for a in groups[kt.OUTSIDE]] == [MEMSET] * 2
    assert all(a.duration_ns != WARMUP_KERNEL_NS for a in activities)  # warm-up is outside "measure"


def test_tables_from_nsys_fixture(nsys_prefix: Path):
    tables = kt.build_tables(kt.load_nsys(nsys_prefix), kt.stopwatch_ms(e2e_record()),
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
    for row in categories.values():
        assert sum(row[c] for c in kt.CATEGORIES) == pytest.approx(100)
    # nothing counted twice, nothing lost: the phases and the gap between them make up the whole
    parts = sum(categories[s]["ms_per_step"] for s in ("forward", "backward", "optimizer", kt.OUTSIDE))
    assert parts == pytest.approx(categories["all"]["ms_per_step"]) == pytest.approx(0.147)
    assert categories["optimizer"]["elementwise"] == pytest.approx(100)
    attention = {row["sub_step"]: row for row in tables["attention"]}
    assert attention["computing softmax"]["ms_per_call"] == pytest.approx(0.010)  # reduce + softmax kernels
    assert attention["final matmul"]["calls_per_step"] == 1
    assert attention["final matmul"]["gflop_per_call"] == pytest.approx(2 * 2 * 32 * 32 * 64 / 1e9)
    assert attention["computing softmax"]["gflop_per_call"] == pytest.approx(5 * 2 * 4 * 32 * 32 / 1e9)
    assert any(note.startswith("softmax takes") for note in tables["notes"])
    text = kt.render_tables(tables)
    assert "### 4. Inside attention" in text and "ampere_sgemm_128x64_tn" in text


def test_kernel_summary_cross_check(nsys_prefix: Path):
    profile = kt.load_nsys(nsys_prefix)
    assert kt.nsys_kernel_total_check(nsys_prefix, profile) is None
    truncated = kt.Profile(profile.activities[:5], profile.ranges, "gpu", "x")
    assert "do not match" in kt.nsys_kernel_total_check(nsys_prefix, truncated)


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


# ---- torch.profiler traces ----


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


def test_torch_gpu_trace_gives_the_same_tables_as_nsys(nsys_prefix: Path, tmp_path: Path):
    from_torch = kt.build_tables(kt.load_torch_trace(torch_gpu_trace(tmp_path / "t.json")))
    from_nsys = kt.build_tables(kt.load_nsys(nsys_prefix))
    assert from_torch["device"] == "gpu"
    for key in ("categories", "attention"):
        assert from_torch[key] == pytest.approx(from_nsys[key])
    assert from_torch["top"]["backward"] == pytest.approx(from_nsys["top"]["backward"])


def test_cpu_self_time_subtracts_direct_children_per_thread():
    def op(name, ts, dur, tid=1):
        return {"ph": "X", "cat": "cpu_op", "name": name, "pid": 1, "tid": tid, "ts": ts, "dur": dur}
    events = [op("aten::linear", 0, 100), op("aten::matmul", 5, 90), op("aten::mm", 10, 80),
              op("aten::add", 0, 50, tid=2), op("aten::t", 96, 2)]
    self_us = {a.name: a.duration_ns / 1e3 for a in kt.cpu_self_times(events)}
    assert self_us == {"aten::linear": 8, "aten::matmul": 10, "aten::mm": 80, "aten::add": 50, "aten::t": 2}


# ---- the classifier ----

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
        "aten::mm", "aten::bmm", "aten::addmm"],
    "elementwise": [
        COMMA_KERNEL, WHERE_KERNEL, FOREACH, "triton_poi_fused_add_mul_silu_0",
        "void at::native::unrolled_elementwise_kernel<at::native::exp_kernel_cuda(at::TensorIteratorBase &)::"
        "{lambda()#2}::operator ()() const::{lambda()#2}::operator ()() const::{lambda(float)#1}, "
        "at::detail::Array<char *, 2>, TrivialOffsetCalculator<1, unsigned int>>(int, T1, T2, T3)",
        "aten::mul", "aten::add_", "aten::_foreach_mul_", "aten::addcdiv_"],
    "reduction/softmax": [
        MAX_REDUCE, SUM_REDUCE, SOFTMAX, "triton_red_fused__softmax_0", "triton_per_fused_mean_pow_rsqrt_0",
        "void <unnamed>::softmax_warp_forward<float, float, float, 9, false, false>(T2 *, const T1 *, int, int, int, "
        "const bool *, int, bool)", "aten::_softmax", "aten::amax", "aten::sum"],
    "memory copy/set": [
        DIRECT_COPY, MEMSET, "[CUDA memcpy Device-to-Device]", "Memcpy DtoD (Device -> Device)",
        "void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>, at::detail::Array<char *, "
        "1>>(int, T2, T3)", "void at::native::<unnamed>::CatArrayBatchedCopy<at::native::<unnamed>::OpaqueType<4>, "
        "unsigned int, 3, 64, 64>(T1 *, CatArrInputTensorMetadata<T1, T2, T4, T5>, TensorSizeStride<T2, 4>, int, T2)",
        "aten::copy_", "aten::zero_", "aten::clone"],
    "other": [
        QUOTE_KERNEL, "void at::native::<unnamed>::indexing_backward_kernel<float, 4>(const long *, const long *, "
        "const T1 *, T1 *, long, long, long, long, bool)",
        "aten::index", "autograd::engine::evaluate_function: MmBackward0"],
}


@pytest.mark.parametrize("category", list(REAL_NAMES))
def test_classifier_knows_the_real_families(category: str):
    assert {name: kt.classify_kernel(name) for name in REAL_NAMES[category]} == dict.fromkeys(REAL_NAMES[category],
                                                                                             category)


def test_short_name_drops_parameters_and_truncates():
    assert kt.short_name("void foo<int, 4>(float *, int)") == "foo<int, 4>"
    assert kt.short_name(XMMA, width=20) == XMMA[:19] + "…"


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

SMALL_MODEL = ["--size", "tiny", "--num-layers", "2", "--d-model", "64", "--d-ff", "128", "--num-heads", "4",
               "--vocab-size", "256", "--context-length", "16", "--batch-size", "2", "--warmup", "1", "--steps", "2"]


def test_bench_e2e_profile_on_cpu(tmp_path: Path, capsys):
    # runs in the default spawn child: the trace path and the table rows must come back in the record
    assert bench_e2e.main(SMALL_MODEL + ["--profile", "--results-dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    (record,) = common.read_records(next((tmp_path / "e2e").glob("*.jsonl")))
    tables = record["profile"]["tables"]
    assert tables["device"] == "cpu" and tables["steps"] == 2
    assert [row["phase"] for row in tables["phases"]] == ["forward", "backward", "optimizer", "step"]
    for row in tables["phases"]:
        assert row["range_ms"] > 0 and row["stopwatch_ms"] > 0 and row["work_ms"] > 0
    for scope in ("all", "forward", "backward", "optimizer"):
        assert tables["top"][scope], scope
        assert sum(r["share_pct"] for r in tables["top"][scope]) == pytest.approx(100)
    for row in tables["categories"]:
        assert sum(row[c] for c in kt.CATEGORIES) == pytest.approx(100)
    assert {row["scope"]: row["matrix multiply"] for row in tables["categories"]}["forward"] > 0
    attention = {row["sub_step"]: row for row in tables["attention"]}
    assert set(attention) == set(kt.ATTENTION_STEPS)
    assert all(row["calls_per_step"] == 2 and row["ms_per_call"] > 0 for row in attention.values())  # 2 layers
    trace = Path(record["profile"]["trace"])
    assert trace.parent == tmp_path / "profile"
    assert json.loads(trace.read_text())["traceEvents"]
    assert "### 1. Phase times" in out and "### 4. Inside attention" in out and str(trace) in out
    assert "### 3. Category shares" in next((tmp_path / "e2e").glob("*.md")).read_text()
