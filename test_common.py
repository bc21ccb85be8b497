"""common.py: timer synchronisation, precision contexts, ranges, peaks, memory helpers, result files, fault hook."""
import time

import pytest
import torch

import common
from common import (ResultFiles, SyncTimer, annotate, get_config, matmul_precision_key, peak_tflops,
                    precision_context, render_table, resolve_device, set_ranges, summarize)


def test_timer_synchronises_before_reading_the_clock_at_both_ends(monkeypatch):
    events = []
    clock = iter([10.0, 10.5])
    monkeypatch.setattr(common.timeit, "default_timer", lambda: events.append("clock") or next(clock))
    with SyncTimer(sync=lambda: events.append("sync")) as t:
        events.append("work")
    assert events == ["sync", "clock", "work", "sync", "clock"]
    assert t.elapsed_s == 0.5


def test_timer_uses_cuda_synchronize_for_a_cuda_device(monkeypatch):
    calls = []
    monkeypatch.setattr(common.torch.cuda, "synchronize", lambda device=None: calls.append(device))
    timer = SyncTimer(torch.device("cuda:0"))
    result, seconds = timer.time(lambda: 42)
    assert result == 42 and seconds >= 0 and len(calls) == 2
    SyncTimer(torch.device("cpu")).time(lambda: None)
    assert len(calls) == 2  # nothing to wait for on the CPU


def test_timer_measures_real_time():
    _, seconds = SyncTimer().time(lambda: time.sleep(0.05))
    assert 0.045 < seconds < 0.5


def test_precision_context_dtypes_on_cpu():
    a, b = torch.randn(4, 4), torch.randn(4, 4)
    cpu = torch.device("cpu")
    with precision_context(cpu, "fp32"):
        assert (a @ b).dtype == torch.float32
    with precision_context(cpu, "bf16"):
        assert (a @ b).dtype == torch.bfloat16
    with precision_context(cpu, "fp16"):
        assert (a @ b).dtype == torch.float16
    with pytest.raises(ValueError, match="unknown dtype"):
        precision_context(cpu, "fp8")


def test_ranges_are_free_no_ops_when_off_and_on_a_cpu_build():
    set_ranges(nvtx=False, profiler=False)
    assert annotate("a") is annotate("b")  # one shared null context: no allocation per call
    if not torch.cuda.is_available():
        with pytest.raises(RuntimeError):  # what the helper protects us from
            torch.cuda.nvtx.range_push("x")
        try:
            set_ranges(nvtx=True)  # asking for NVTX on a CPU build stays a no-op
            with annotate("forward"):
                pass
            assert annotate("a") is annotate("b")
        finally:
            set_ranges()


def test_profiler_ranges_show_up_in_torch_profiler():
    try:
        set_ranges(profiler=True)
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
            with annotate("my_region"):
                torch.randn(8, 8) @ torch.randn(8, 8)
    finally:
        set_ranges()
    assert any(e.name == "my_region" for e in prof.events())


def test_resolve_device():
    assert resolve_device("cpu").type == "cpu"
    assert resolve_device("auto").type == ("cuda" if torch.cuda.is_available() else "cpu")
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="CUDA is not available"):
            resolve_device("cuda")
    with pytest.raises(ValueError):
        resolve_device("tpu")


def test_peak_table_matches_device_names_and_never_guesses():
    assert peak_tflops("NVIDIA H100 80GB HBM3", "bf16") == (989.4, "H100 SXM")
    assert peak_tflops("NVIDIA H100 PCIe", "bf16")[1] == "H100 PCIe"
    assert peak_tflops("NVIDIA H200", "bf16")[1] == "H200 SXM"
    assert peak_tflops("NVIDIA H20", "bf16") == (148.0, "H20")
    assert peak_tflops("NVIDIA A100-SXM4-80GB", "tf32") == (156.0, "A100")
    assert peak_tflops("NVIDIA GeForce RTX 4090", "fp32")[1] == "RTX 4090"
    assert peak_tflops("NVIDIA L4", "bf16") == (121.0, "L4")
    assert peak_tflops("NVIDIA L40S", "bf16")[1] == "L40S"
    assert peak_tflops("Tesla T4", "bf16") == (None, "T4")  # no bf16 unit: no figure
    assert peak_tflops("Tesla P100-PCIE-16GB", "fp32") == (9.3, "P100 PCIe")
    assert peak_tflops("x86_64", "fp32") == (None, None)
    assert matmul_precision_key("fp32", tf32=True) == "tf32"
    assert matmul_precision_key("fp32", tf32=False) == "fp32"
    assert matmul_precision_key("bf16", tf32=False) == "bf16"


def test_summarize():
    s = summarize([1.0, 2.0, 3.0, 10.0])
    assert s["mean"] == 4.0 and s["median"] == 2.5 and s["min"] == 1.0 and s["n"] == 4
    assert s["std"] == pytest.approx(4.0825, abs=1e-4)  # sample (n-1) standard deviation
    one = summarize([5.0])  # one sample has no standard deviation: None, not a made-up 0
    assert one["std"] is None and one["cv"] is None and one["mean"] == 5.0 and one["n"] == 1


def test_result_files_never_overwrite(tmp_path):
    first = ResultFiles(tmp_path, "e2e", "run", "e2e")
    first.append_record({"a": 1})
    first.write_markdown("table")
    second = ResultFiles(tmp_path, "e2e", "run", "e2e")
    assert second.stem == "run-2"
    second.append_record({"a": 2})
    assert common.read_records(first.jsonl) == [{"a": 1}]
    assert common.read_records(second.jsonl) == [{"a": 2}]
    assert ResultFiles(tmp_path, "e2e", None, "e2e").stem.startswith("e2e-")


def test_render_table_formats():
    rows = [{"size": "tiny", "ms": 1.234}, {"size": "small"}]
    md = render_table(rows, ["size", "ms"])
    assert md.splitlines()[0].startswith("| size") and "1.23" in md
    assert "\\toprule" in render_table(rows, ["size", "ms"], fmt="latex_booktabs")


def test_injected_fault_matches_only_its_configuration(monkeypatch):
    monkeypatch.setenv(common.FAULT_ENV, "oom:context_length=256,dtype=fp32")
    common.maybe_inject_fault({"context_length": 128, "dtype": "fp32"})
    with pytest.raises(torch.OutOfMemoryError):
        common.maybe_inject_fault({"context_length": 256, "dtype": "fp32"})


def test_get_config_overrides():
    cfg = get_config("tiny", num_layers=2, d_ff=None)
    assert cfg.num_layers == 2 and cfg.d_ff == 1344


def test_format_bytes_uses_powers_of_two():
    assert common.format_bytes(3 * 2**30) == "3.00 GiB"
    assert common.format_bytes(1536 * 2**10) == "1.50 MiB"
    assert common.format_bytes(512) == "512 B"
    assert common.format_bytes(None) is None


def test_saved_tensors_counts_each_storage_once_and_skips_excluded():
    x = torch.randn(4, 8, requires_grad=True)
    with common.saved_tensors() as saved:
        a = x * x  # saves x twice (as self and as other): one storage, counted once
        b = a.exp()  # saves its output
        c = b.view(32) * b.view(32)  # saves two views of b: b's storage, already counted
    assert sum(saved.values()) == x.nbytes + b.nbytes
    with common.saved_tensors(exclude={common.storage_key(x)}) as without_x:
        b = (x * x).exp()
    assert sum(without_x.values()) == b.nbytes
    del c


def test_peak_memory_is_empty_on_a_cpu_and_read_from_cuda_on_a_gpu(monkeypatch):
    assert common.peak_memory_bytes(torch.device("cpu")) == {}
    calls = []
    monkeypatch.setattr(common.torch.cuda, "synchronize", lambda device=None: calls.append("sync"))
    monkeypatch.setattr(common.torch.cuda, "max_memory_allocated", lambda device=None: 3)
    monkeypatch.setattr(common.torch.cuda, "max_memory_reserved", lambda device=None: 4)
    monkeypatch.setattr(common.torch.cuda, "reset_peak_memory_stats", lambda device=None: calls.append("reset"))
    common.reset_peak_memory(torch.device("cuda:0"))
    assert calls == ["sync", "reset"]
    assert common.peak_memory_bytes(torch.device("cuda:0")) == {"peak_mem_allocated_bytes": 3,
                                                               "peak_mem_reserved_bytes": 4}
