"""GPU smoke tests: the CUDA paths for real, on the first GPU machine that runs the suite (skipped elsewhere).
Tiny shapes, a few seconds each: MFU and peak memory, NVTX, fp16 with the gradient scaler, the snapshot's peak
check, the sdpa backend, CUDA autocast dtypes, nsys_run.sh with real kernels when nsys is present, and your own
code on the GPU: the flash_benchmarking grid with a stand-in kernel (checked, then timed by do_bench when triton
imports, CUDA events otherwise), both timing methods on real kernels, and a stand-in model with counted FLOPs."""
from __future__ import annotations

import importlib.util
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import bench_attention
import bench_e2e
import common
import mem_profile
import results
import runner
import kernel_tables as kt
from model import STAFF_MODEL_KEYWORDS, build_model, build_optimizer
import toy_autocast
from results import read_records
from test_bench_attention import student  # noqa: F401 - a fixture: the stand-in attention in the current directory
from test_user_code import STUDENT_LM, tiny_lm_train_flops

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

HERE = Path(__file__).resolve().parent
E2E_SMALL = ["--device", "cuda", "--size", "tiny", "--context-length", "64", "--batch-size", "2", "--warmup", "2",
             "--steps", "3", "--in-process"]


def only_record(folder: Path) -> dict:
    (jsonl,) = folder.glob("*.jsonl")
    (record,) = read_records(jsonl)
    return record


def test_bench_e2e_on_cuda_has_mfu_and_peak_memory(tmp_path):
    assert bench_e2e.main([*E2E_SMALL, "--results-dir", str(tmp_path)]) == 0
    record = only_record(tmp_path / "e2e")
    assert record["status"] in ("ok", "noisy") and record["environment"]["device"].startswith("cuda")
    assert 0 < record["peak_mem_allocated_bytes"] <= record["peak_mem_reserved_bytes"]
    name = record["environment"]["device_name"]
    peak, label = common.peak_tflops(name, record["mfu_precision"])
    assert record["peak_tflops"] == peak and record["peak_source"] == label
    if peak is None:
        assert record["mfu"] is None  # an unlisted GPU: no MFU rather than a guess
    else:
        assert 0 < record["mfu"] < 1, (name, record["mfu"])


def test_nvtx_ranges_through_torch_on_cuda(tmp_path):
    push, pop = common.nvtx_functions()
    assert push is torch.cuda.nvtx.range_push and pop is torch.cuda.nvtx.range_pop
    assert bench_e2e.main([*E2E_SMALL, "--nvtx", "--results-dir", str(tmp_path)]) == 0
    assert only_record(tmp_path / "e2e")["status"] in ("ok", "noisy")


def test_fp16_training_steps_through_the_gradient_scaler():
    run = runner.RunConfig(size="tiny", model=results.get_config("tiny", context_length=64), batch_size=2,
                              dtype="fp16", device="cuda")
    work = runner.Workload(run)
    assert work.scaler is not None and work.scaler.is_enabled()
    for _ in range(3):
        times = runner.run_step(work)
    assert all(t > 0 for t in times.values())
    assert math.isfinite(work.scaler.get_scale()) and work.scaler.get_scale() > 0
    assert all(torch.isfinite(p).all() for p in work.model.parameters())  # fp32 master weights, updated
    assert all(p.dtype == torch.float32 for p in work.model.parameters())


def test_snapshot_peak_matches_the_requested_peak(tmp_path):
    argv = ["--device", "cuda", "--size", "tiny", "--context-length", "64", "--mode", "train", "--batch-size", "2",
            "--warmup", "1", "--steps", "2", "--snapshot", "--in-process", "--results-dir", str(tmp_path)]
    assert mem_profile.main(argv) == 0
    record = only_record(tmp_path / "memory")
    assert record["status"] == "ok" and record["peak_mem_allocated_bytes"] > 0
    check = record["snapshot_peak_check"]
    assert check["status"].startswith("ok"), check  # rebuilt from the trace == requested_bytes.all.peak
    for key in ("snapshot_path", "snapshot_png", "snapshot_html"):  # pickle, timeline, torch's interactive view
        assert Path(record[key]).is_file(), key


def test_compiled_block_saves_what_its_autograd_node_holds():
    """mem_profile --compile on a real GPU: torch.compile(block, fullgraph=True) keeps fewer bytes for backward
    than the eager block (the partitioner recomputes pointwise ops), and both are counted."""
    cfg = results.get_config("tiny", context_length=64)
    run = mem_profile.MemConfig("tiny", cfg, batch_size=2, mode="forward", compile=True, device="cuda")
    record = mem_profile.compiled_block_record(run)
    assert 0 < record["block_compiled_saved_bytes"] < record["block_eager_saved_bytes"]
    assert 0 < record["block_compiled_saved_tensors"] < record["block_eager_saved_tensors"]


@pytest.mark.parametrize("dtype, allowed", [("fp32", {"efficient", "cudnn", "math"}),  # flash needs 16-bit
                                            ("bf16", {"flash", "efficient", "cudnn"})])
def test_sdpa_backend_on_cuda_is_named(tmp_path, dtype, allowed):
    argv = ["--device", "cuda", "--impl", "sdpa", "--seq-len", "256", "--d", "64", "--batch-size", "2", "--iters",
            "3", "--warmup", "1", "--dtype", dtype, "--in-process", "--results-dir", str(tmp_path)]
    assert bench_attention.main(argv) == 0
    record = only_record(tmp_path / "attention")
    assert record["status"] == "ok" and record["sdpa_backend"] in allowed, record["sdpa_backend"]
    assert record["peak_mem_allocated_bytes"] > 0


def test_cuda_autocast_keeps_layernorm_in_float32(tmp_path):
    assert toy_autocast.main(["--device", "cuda", "--dtype", "fp16", "--results-dir", str(tmp_path)]) == 0
    seen = only_record(tmp_path / "precision")["dtypes"]
    assert seen["fc1 output"] == "float16" and seen["logits (fc2 output)"] == "float16"
    assert seen["LayerNorm output"] == "float32"  # CUDA autocast runs layer_norm in float32 (unlike the CPU)
    assert seen["loss (cross_entropy)"] == "float32"
    assert all(dtype == "float32" for label, dtype in seen.items() if label.startswith(("parameter", "gradient")))


def test_nsys_run_profiles_real_kernels(tmp_path):
    nsys = os.environ.get("REAL_NSYS") or subprocess.run(["bash", "-c", "command -v nsys"], capture_output=True,
                                                        text=True).stdout.strip()
    if not nsys:
        pytest.skip("no nsys: set REAL_NSYS or put nsys on PATH")
    env = {**os.environ, "NSYS": nsys, "PYTHON": sys.executable}
    result = subprocess.run(["bash", str(HERE / "nsys_run.sh"), "--results-dir", str(tmp_path), "tiny", "64", "--",
                             "--batch-size", "2", "--warmup", "2", "--steps", "3"], capture_output=True, text=True,
                            env=env, timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    report = tmp_path / "nsys" / "tiny_ctx64_train"
    md = Path(f"{report}.md").read_text()
    assert kt.NO_KERNELS not in md and "### 2. Top kernels by GPU time: forward" in md
    tables = kt.build_tables(kt.load_nsys(report))
    assert tables["steps"] == 3
    categories = {row["scope"]: row for row in tables["categories"]}
    assert categories["forward"]["matrix multiply"] > 0 and categories["optimizer"]["elementwise"] > 0
    others = [row["name"] for row in tables["top"]["all"] if row["category"] == "other"]
    assert categories["all"]["other"] < 25, f"unclassified kernels: {others}"
    assert {row["sub_step"] for row in tables["attention"]} == set(kt.ATTENTION_STEPS)


# ---- your own code on the GPU ----

HAS_TRITON = importlib.util.find_spec("triton") is not None


def test_flash_grid_on_cuda_checks_then_times_your_kernel(student, tmp_path):  # noqa: F811
    yours = "student_attention:FlashAttentionPytorch"
    argv = ["--grid", "flash", "--device", "cuda", "--impl", yours, "sdpa", "--seq-len", "128", "256", "--d", "16",
            "64", "--rep-ms", "20", "--warmup-ms", "5", "--in-process", "--results-dir", str(tmp_path)]
    assert bench_attention.main(argv) == 0
    (jsonl,) = (tmp_path / "attention").glob("*.jsonl")
    records = read_records(jsonl)
    assert len(records) == 2 * 2 * 2 * 3  # dtype x d x seq x (naive first, yours, sdpa)
    method = "triton.testing.do_bench" if HAS_TRITON else "cuda events"
    for r in records:
        assert r["status"] == "ok" and r["config"]["batch_size"] == 1, r["label"]
        assert r["check"]["ok"], (r["label"], r["check"])  # bf16 and fp32, on the GPU's kernels
        assert r["timing"]["method"] == method
        assert all(min(r[f"{phase}_ms"]) > 0 for phase in bench_attention.ATTENTION_PHASE_SHORT)
        assert 0 < r["mem_before_backward_bytes"] <= r["peak_mem_allocated_bytes"]


def test_cuda_events_time_real_kernels(monkeypatch):
    monkeypatch.setattr(common, "triton_do_bench", lambda: None)  # as on a machine without triton
    a = torch.randn(1024, 1024, device="cuda")
    samples = bench_attention.time_calls(lambda: a @ a, "mm", torch.device("cuda"), 2, 5, 5, 20)
    assert len(samples) == 5 and all(0 < ms < 1000 for ms in samples)


@pytest.mark.skipif(not HAS_TRITON, reason="triton is not installed")
def test_do_bench_times_real_kernels():
    a = torch.randn(1024, 1024, device="cuda")
    samples = bench_attention.time_calls(lambda: a @ a, "mm", torch.device("cuda"), 2, 5, 5, 20)
    assert len(samples) >= 1 and all(0 < ms < 1000 for ms in samples)  # do_bench sizes its own repetitions


def test_your_model_on_cuda_with_counted_flops_and_mfu(tmp_path, monkeypatch):
    (tmp_path / "student_lm.py").write_text(STUDENT_LM)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))
    argv = [*E2E_SMALL, "--model", "student_lm:TinyLM", "--flops", "counted", "--results-dir", str(tmp_path)]
    assert bench_e2e.main(argv) == 0
    record = only_record(tmp_path / "e2e")
    assert record["status"] in ("ok", "noisy") and record["peak_mem_allocated_bytes"] > 0
    cfg = results.ModelConfig(**record["config"]["model"])
    assert record["step_flops"] == tiny_lm_train_flops(cfg, record["config"]["batch_size"])
    if record["peak_tflops"] is not None:
        assert 0 < record["mfu"] < 1
