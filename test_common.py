"""common.py: timer synchronisation, precision contexts, ranges, peaks, memory helpers, result files, fault hook."""
import dataclasses
import errno
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch
import common
import results
from common import (SyncTimer, annotate, matmul_precision_key, peak_tflops, precision_context, resolve_device,
                    set_ranges)
from model import naive_attention
from results import get_config
from results import ResultFiles, render_table

HERE = Path(__file__).resolve().parent


# ---- torch version compatibility: each decision against this torch's own signatures ----


def test_torch_release_reads_major_and_minor():
    assert common.torch_release("2.11.0+cu130") == (2, 11)
    assert common.torch_release("2.13.0a0+git1234abc") == (2, 13)
    assert common.torch_release("2.6.0") == (2, 6) and common.TORCH_VERSION >= (2, 6)


def test_ddp_keyword_is_one_this_torch_takes():
    import inspect
    from torch.nn.parallel import DistributedDataParallel
    (keyword,) = common.ddp_no_forward_buffer_sync()
    assert keyword in inspect.signature(DistributedDataParallel.__init__).parameters


def test_tf32_reads_the_legacy_flags_while_no_precision_api_is_set(monkeypatch):
    # stand-ins for torch's flag objects, so that no global TF32 state of this process changes
    import types
    for flag in (True, False):
        matmul = types.SimpleNamespace(allow_tf32=flag, fp32_precision="none")
        monkeypatch.setattr(torch.backends.cuda, "matmul", matmul)
        assert common.tf32_enabled() is flag


def test_fsdp_root_reshard_is_none_exactly_where_fully_shard_defaults_to_none():
    import inspect
    from torch.distributed.fsdp import fully_shard
    default = inspect.signature(fully_shard).parameters["reshard_after_forward"].default
    assert (common.fsdp_root_reshard_after_forward(True) is None) == (default is None)
    assert common.fsdp_root_reshard_after_forward(False) is False


def test_timer_synchronises_before_reading_the_clock_at_both_ends(monkeypatch):
    events = []
    clock = iter([10.0, 10.5])
    monkeypatch.setattr(common, "clock", lambda: events.append("clock") or next(clock))
    monkeypatch.setattr(common, "synchronize", lambda device: events.append("sync"))
    with SyncTimer() as t:
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
    assert 0.045 < seconds < 5  # a loaded machine may wake the sleeper late


def test_precision_context_dtypes_on_cpu():
    a, b = torch.randn(4, 4), torch.randn(4, 4)
    cpu = torch.device("cpu")
    with precision_context(cpu, "fp32"):
        assert (a @ b).dtype == torch.float32
    with precision_context(cpu, "bf16"):
        assert (a @ b).dtype == torch.bfloat16
    with precision_context(cpu, "fp16"):
        assert (a @ b).dtype == torch.float16
    with pytest.raises(KeyError):
        precision_context(cpu, "fp8")


def test_ranges_are_free_no_ops_when_off():
    set_ranges(nvtx=False, profiler=False)
    assert annotate("a") is annotate("b")  # one shared null context: no allocation per call


def test_nvtx_ranges_through_torch_or_a_one_line_refusal(monkeypatch):
    if torch.version.cuda is None:  # a CPU-only build has no NVTX: asking for it is a ValueError, not a crash
        with pytest.raises(ValueError, match="NVTX ranges need a CUDA build of torch"):
            set_ranges(nvtx=True)
    calls = []

    class RecordingNVTX:  # stands in for torch's binding of nvtxRangePushA / nvtxRangePop
        def rangePushA(self, message):
            calls.append(f"push {message}")

        def rangePop(self):
            calls.append("pop")

    monkeypatch.setattr(torch.cuda.nvtx, "_nvtx", RecordingNVTX())
    try:
        set_ranges(nvtx=True)
        with annotate("forward"), annotate("computing softmax"):
            pass
    finally:
        set_ranges()
    assert calls == ["push NVTX check", "pop", "push forward", "push computing softmax", "pop", "pop"]


def test_no_ranges_inside_torch_compile():
    # Dynamo cannot trace the range calls: before annotate checked for compilation, fullgraph=True failed here
    q = torch.randn(1, 2, 8, 16)
    try:
        set_ranges(profiler=True)
        compiled = torch.compile(naive_attention, fullgraph=True, backend="eager")  # Dynamo only: seconds
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
            out = compiled(q, q, q)
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as eager:
            naive_attention(q, q, q)
    finally:
        set_ranges()
        torch._dynamo.reset()
    assert torch.allclose(out, naive_attention(q, q, q))
    names = {e.name for e in prof.events()}
    assert "computing softmax" in {e.name for e in eager.events()} and "computing softmax" not in names


def test_profiler_ranges_show_up_in_torch_profiler():
    try:
        set_ranges(profiler=True)
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
            with annotate("my_region"):
                torch.randn(8, 8) @ torch.randn(8, 8)
    finally:
        set_ranges()
    assert any(e.name == "my_region" for e in prof.events())


@pytest.mark.skipif(common.TORCH_VERSION < (2, 9), reason="the fp32_precision API is new in torch 2.9")
def test_environment_reads_tf32_through_the_new_precision_api():
    matmul = torch.backends.cuda.matmul
    assert matmul.fp32_precision == "none"  # nothing in the suite sets it: the legacy flag is the truth
    legacy = matmul.allow_tf32
    try:
        matmul.fp32_precision = "tf32"  # from now on, reading matmul.allow_tf32 raises in torch 2.13
        env = common.environment(torch.device("cpu"))
        assert env["tf32_matmul"] is True
        matmul.fp32_precision = "ieee"
        assert common.environment(torch.device("cpu"))["tf32_matmul"] is False
    finally:
        matmul.fp32_precision = "none"
    assert matmul.allow_tf32 == legacy


def test_resolve_device():
    assert resolve_device("cpu").type == "cpu"
    assert resolve_device("auto").type == ("cuda" if torch.cuda.is_available() else "cpu")
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="CUDA is not available"):
            resolve_device("cuda")
    with pytest.raises(ValueError):
        resolve_device("tpu")


# torch.cuda.get_device_name() strings as real machines report them -> (label, dense bf16 TFLOP/s)
REAL_DEVICE_NAMES = {
    "NVIDIA B200": ("B200", 2250.0),
    "NVIDIA GB200": ("GB200", 2500.0),
    "NVIDIA RTX PRO 6000 Blackwell Workstation Edition": ("RTX PRO 6000 Blackwell Workstation", 500.0),
    "NVIDIA RTX PRO 6000 Blackwell Max-Q Workstation Edition": (
        "RTX PRO 6000 Blackwell (Max-Q / Server: no figures here)", None),
    "NVIDIA RTX PRO 6000 Blackwell Server Edition": ("RTX PRO 6000 Blackwell (Max-Q / Server: no figures here)",
                                                     None),
    "NVIDIA GH200 480GB": ("GH200", 989.4),
    "NVIDIA GH200 144G HBM3e": ("GH200", 989.4),
    "NVIDIA H200": ("H200 SXM", 989.4),
    "NVIDIA H200 NVL": ("H200 NVL", 835.5),
    "NVIDIA H20": ("H20", 148.0),
    "NVIDIA H100 80GB HBM3": ("H100 SXM", 989.4),
    "NVIDIA H100 PCIe": ("H100 PCIe", 756.0),
    "NVIDIA H100 NVL": ("H100 NVL", 835.5),
    "NVIDIA H800": ("H800 SXM", 989.4),
    "NVIDIA H800 PCIe": ("H800 PCIe", 756.0),
    "NVIDIA A100-SXM4-80GB": ("A100", 312.0),
    "NVIDIA A100-SXM4-40GB": ("A100", 312.0),
    "NVIDIA A100-PCIE-40GB": ("A100", 312.0),
    "NVIDIA A100 80GB PCIe": ("A100", 312.0),
    "NVIDIA A800-SXM4-80GB": ("A800", 312.0),
    "NVIDIA A800 80GB PCIe": ("A800", 312.0),
    "NVIDIA L40S": ("L40S", 362.05),
    "NVIDIA L40": ("L40", 181.0),
    "NVIDIA L4": ("L4", 121.0),
    "NVIDIA A40": ("A40", 149.7),
    "NVIDIA A10": ("A10", 125.0),
    "NVIDIA A10G": ("A10G (AWS: no NVIDIA datasheet)", None),
    "NVIDIA RTX 6000 Ada Generation": ("RTX 6000 Ada", 364.2),
    "NVIDIA RTX A6000": ("RTX A6000", 154.8),
    "NVIDIA GeForce RTX 5090": ("RTX 5090", 209.5),
    "NVIDIA GeForce RTX 5090 D": ("RTX 5090 D / 4090 D (no figures here)", None),
    "NVIDIA GeForce RTX 4090": ("RTX 4090", 165.2),
    "NVIDIA GeForce RTX 4090 D": ("RTX 5090 D / 4090 D (no figures here)", None),
    "NVIDIA GeForce RTX 4090 Laptop GPU": ("laptop GPU (power-limited: no datasheet peak)", None),
    "NVIDIA GeForce RTX 3090": ("RTX 3090", 71.0),
    "NVIDIA GeForce RTX 3090 Ti": ("RTX 3090 Ti", 80.0),
    "Tesla V100-SXM2-16GB": ("V100 SXM2", None),  # no bf16 unit
    "Tesla V100-SXM2-32GB": ("V100 SXM2", None),
    "Tesla V100-PCIE-16GB": ("V100 PCIe", None),
    "Tesla V100S-PCIE-32GB": ("V100S PCIe", None),
    "Tesla V100-SXM3-32GB": ("V100 (other variant: no figures here)", None),
    "Tesla T4": ("T4", None),
    "Tesla P100-PCIE-16GB": ("P100 PCIe", None),
    "Tesla P100-SXM2-16GB": ("P100 SXM2", None),
}


@pytest.mark.parametrize("name", list(REAL_DEVICE_NAMES))
def test_peak_table_matches_real_device_names(name):
    label, bf16 = REAL_DEVICE_NAMES[name]
    assert peak_tflops(name, "bf16") == (bf16, label)


def test_peak_table_variants_and_never_guesses():
    assert peak_tflops("Tesla V100-PCIE-16GB", "fp16") == (112.0, "V100 PCIe")  # not the SXM2 figure
    assert peak_tflops("Tesla V100S-PCIE-32GB", "fp16") == (130.0, "V100S PCIe")
    assert peak_tflops("Tesla V100-SXM2-32GB", "fp16") == (125.0, "V100 SXM2")
    assert peak_tflops("Tesla P100-SXM2-16GB", "fp16") == (21.2, "P100 SXM2")
    assert peak_tflops("NVIDIA H100 80GB HBM3", "tf32") == (494.7, "H100 SXM")  # dense: half the sparse 989
    assert peak_tflops("NVIDIA A100-SXM4-80GB", "fp32") == (19.5, "A100")
    assert peak_tflops("NVIDIA GeForce RTX 3090", "tf32") == (35.6, "RTX 3090")
    assert peak_tflops("x86_64", "fp32") == (None, None)
    assert peak_tflops("AMD EPYC 7B13", "bf16") == (None, None)
    # every entry is reachable: no pattern is shadowed by an earlier one for the names above
    assert {label for label, _ in REAL_DEVICE_NAMES.values()} == {label for _, label, _ in common.PEAK_TFLOPS}
    for _, _, peaks in common.PEAK_TFLOPS:  # dense tensor figures are never below the plain fp32 figure
        assert all(p is None or peaks[0] is None or p >= peaks[0] for p in peaks)
    assert matmul_precision_key("fp32", tf32=True) == "tf32"
    assert matmul_precision_key("fp32", tf32=False) == "fp32"
    assert matmul_precision_key("bf16", tf32=False) == "bf16"


# datasheet memory bandwidth, GB/s (None: no single figure, or a laptop's)
REAL_BANDWIDTHS = {
    "NVIDIA B200": 8000.0, "NVIDIA GB200": 8000.0, "NVIDIA RTX PRO 6000 Blackwell Workstation Edition": 1792.0,
    "NVIDIA GH200 480GB": None, "NVIDIA H200": 4800.0, "NVIDIA H200 NVL": 4800.0, "NVIDIA H20": 4000.0,
    "NVIDIA H100 80GB HBM3": 3350.0, "NVIDIA H100 PCIe": 2000.0, "NVIDIA H100 NVL": 3900.0, "NVIDIA H800": 3350.0,
    "NVIDIA H800 PCIe": 2000.0, "NVIDIA A100-SXM4-80GB": 2039.0, "NVIDIA A100-SXM4-40GB": 1555.0,
    "NVIDIA A100-PCIE-40GB": 1555.0, "NVIDIA A100 80GB PCIe": 1935.0, "NVIDIA A800 80GB PCIe": 1935.0,
    "NVIDIA L40S": 864.0, "NVIDIA L40": 864.0, "NVIDIA L4": 300.0, "NVIDIA A40": 696.0, "NVIDIA A10": 600.0,
    "NVIDIA A10G": None, "NVIDIA RTX 6000 Ada Generation": 960.0, "NVIDIA RTX A6000": 768.0,
    "NVIDIA GeForce RTX 5090": 1792.0, "NVIDIA GeForce RTX 4090": 1008.0, "NVIDIA GeForce RTX 4090 Laptop GPU": None,
    "NVIDIA GeForce RTX 3090": 936.0, "NVIDIA GeForce RTX 3090 Ti": 1008.0, "Tesla V100-SXM2-32GB": 900.0,
    "Tesla V100S-PCIE-32GB": 1134.0, "Tesla T4": 320.0, "Tesla P100-PCIE-12GB": 549.0, "Tesla P100-SXM2-16GB": 732.0,
}


def test_memory_bandwidth_matches_real_device_names_and_covers_the_peak_table():
    assert {name: common.memory_bandwidth(name)[0] for name in REAL_BANDWIDTHS} == REAL_BANDWIDTHS
    assert all(common.memory_bandwidth(name)[1] for name in REAL_DEVICE_NAMES)  # every GPU of PEAK_TFLOPS
    assert common.memory_bandwidth("AMD EPYC 7B13") == (None, None)


def test_roofs_are_the_datasheets_where_they_name_the_gpu_else_measured():
    measured = {"matmul_tflops": {"fp32": 0.05, "bf16": 0.01}, "copy_gbs": 20.0, "loadavg_1m": 0.5}
    cpu = common.roofs({"device": "cpu", "device_name": "AMD EPYC"}, "bf16", measured)
    assert (cpu["tflops"], cpu["gbs"], cpu["ceiling"], cpu["datasheet"]) == (0.01, 20.0, "measured", None)
    h100 = common.roofs({"device": "cuda:0", "device_name": "NVIDIA H100 80GB HBM3"}, "bf16", measured)
    assert (h100["tflops"], h100["gbs"], h100["ceiling"]) == (989.4, 3350.0, "datasheet")
    assert h100["measured"] == {"tflops": 0.01, "gbs": 20.0, "loadavg_1m": 0.5}  # kept: the roofline draws both
    gh200 = common.roofs({"device": "cuda:0", "device_name": "NVIDIA GH200 480GB"}, "tf32", measured, 100.0)
    assert (gh200["tflops"], gh200["gbs"]) == (100.0, 20.0)  # --peak-tflops; no single bandwidth figure
    assert gh200["ceiling"] == "--peak-tflops FLOP/s, measured GB/s"
    assert common.roofs({"device": "cpu"}, "fp32", None)["ceiling"] == "none"  # the calibration failed


def test_measured_ceiling_runs_in_seconds_then_comes_from_its_cache(tmp_path, monkeypatch):
    monkeypatch.delenv(common.CEILINGS_ENV)  # the tests' seeded file aside: this folder's own
    tiny = {"budget_s": 0.2, "max_matmul": {"cpu": 128}, "copy_bytes": {"cpu": 2**22}}
    started = time.perf_counter()
    first = common.machine_ceiling(torch.device("cpu"), str(tmp_path), calibration=tiny)
    assert time.perf_counter() - started < 5 and not first["cached"]
    assert set(first["matmul_tflops"]) == {"fp32", "bf16", "fp16"} and all(first["matmul_tflops"].values())
    assert first["copy_gbs"] > 0 and first["copy_bytes"] == 2**22 and first["matmul_n"]["fp32"] <= 128
    saved = json.loads((tmp_path / common.CEILINGS_FILE).read_text())
    (key,) = saved
    assert key == f"{first['hostname']} | {first['device_name']} | torch {torch.__version__}"
    monkeypatch.setattr(common, "measure_ceiling", lambda *a: pytest.fail("measured again"))
    again = common.machine_ceiling(torch.device("cpu"), str(tmp_path))
    assert again["cached"] and again["matmul_tflops"] == first["matmul_tflops"]
    monkeypatch.undo()
    monkeypatch.delenv(common.CEILINGS_ENV)
    redone = common.machine_ceiling(torch.device("cpu"), str(tmp_path), recalibrate=True, calibration=tiny)
    assert not redone["cached"] and redone["utc_time"] >= first["utc_time"]
    other = tmp_path / "not-ours"
    other.mkdir()
    (other / common.CEILINGS_FILE).write_text("[1, 2]")  # not a ceilings file: measured, left as it was
    assert not common.machine_ceiling(torch.device("cpu"), str(other), calibration=tiny)["cached"]
    assert (other / common.CEILINGS_FILE).read_text() == "[1, 2]"


def test_a_ceiling_measured_under_load_never_lowers_the_saved_one(tmp_path, monkeypatch, capsys):
    """Figure by figure the best seen is kept, with the load it was measured at: a loaded machine's measurement (a
    hundred times lower) changes nothing; one higher figure is kept beside the others, said with its load."""
    monkeypatch.delenv(common.CEILINGS_ENV)
    cpu = torch.device("cpu")

    def measured(fp32, bf16, gbs, load):
        return lambda *args: {"matmul_tflops": {"fp32": fp32, "bf16": bf16}, "matmul_n": {"fp32": 512, "bf16": 256},
                              "copy_gbs": gbs, "copy_bytes": 2**28, "loadavg_1m": load, "seconds": 3.0}

    monkeypatch.setattr(common, "measure_ceiling", measured(0.04, 0.02, 10.0, 0.3))
    idle = common.machine_ceiling(cpu, str(tmp_path))
    monkeypatch.setattr(common, "measure_ceiling", measured(0.0004, 0.0002, 0.1, 9.5))
    loaded = common.machine_ceiling(cpu, str(tmp_path), recalibrate=True)
    assert (loaded["matmul_tflops"], loaded["copy_gbs"], loaded["loadavg_1m"]) == ({"fp32": 0.04, "bf16": 0.02}, 10.0,
                                                                                  0.3)
    monkeypatch.setattr(common, "measure_ceiling", measured(0.08, 0.001, 5.0, 2.0))
    better = common.machine_ceiling(cpu, str(tmp_path), recalibrate=True)
    assert (better["matmul_tflops"], better["matmul_n"], better["copy_gbs"]) == (
        {"fp32": 0.08, "bf16": 0.02}, {"fp32": 512, "bf16": 256}, 10.0)
    assert better["loadavg_1m"] == 2.0  # the higher load of the two measurements it keeps figures of
    (saved,) = json.loads((tmp_path / common.CEILINGS_FILE).read_text()).values()
    assert {k: saved[k] for k in ("matmul_tflops", "copy_gbs", "loadavg_1m")} == {
        "matmul_tflops": {"fp32": 0.08, "bf16": 0.02}, "copy_gbs": 10.0, "loadavg_1m": 2.0}
    assert common.machine_ceiling(cpu, str(tmp_path))["cached"] and not idle["cached"]
    lines = capsys.readouterr().err.splitlines()
    assert lines[-1] == ("measured in 3.0 s: fp32 0.08 TFLOP/s, bf16 0.001 TFLOP/s, copy 5 GB/s at load 2.0; kept, "
                         "the best seen: fp32 0.08 TFLOP/s, bf16 0.02 TFLOP/s, copy 10 GB/s at load 2.0")
    roofs = common.roofs({"device": "cpu"}, "bf16", better)
    assert roofs["measured"] == {"tflops": 0.02, "gbs": 10.0, "loadavg_1m": 2.0}


def test_result_files_never_overwrite(tmp_path):
    first = ResultFiles(tmp_path, "e2e", "run", "e2e")
    first.append_record({"a": 1})
    first.write_report(lambda fmt: "table", "github")
    second = ResultFiles(tmp_path, "e2e", "run", "e2e")
    assert second.stem == "run-2"
    second.append_record({"a": 2})
    assert results.read_records(first.jsonl) == [{"a": 1}]
    assert results.read_records(second.jsonl) == [{"a": 2}]
    assert ResultFiles(tmp_path, "e2e", None, "e2e").stem.startswith("e2e-")


def test_render_table_formats():
    rows = [{"size": "tiny", "ms": 1.234}, {"size": "small"}]
    md = render_table(rows, ["size", "ms"])
    assert md.splitlines()[0].startswith("| size") and "1.23" in md
    assert "\\toprule" in render_table(rows, ["size", "ms"], fmt="latex_booktabs")


def test_the_load_record_reads_the_cpu_and_never_cuda_on_a_cpu(monkeypatch):
    def no_cuda(*args, **kwargs):
        raise AssertionError("a CPU run reached a CUDA call")

    for name in ("utilization", "temperature", "power_draw", "clock_rate", "list_gpu_processes"):
        monkeypatch.setattr(torch.cuda, name, no_cuda)
    load = common.machine_load(torch.device("cpu"))
    assert set(load) == {"loadavg_1m", "cpu_count", "cpus_usable"}
    assert load["loadavg_1m"] >= 0 and load["cpu_count"] >= load["cpus_usable"] >= 1


def test_the_gpu_load_reads_nvml_through_torch_and_says_when_it_cannot(monkeypatch):
    readings = {"utilization": 87, "temperature": 71, "power_draw": 301_000, "clock_rate": 1755}
    for name, value in readings.items():
        monkeypatch.setattr(torch.cuda, name, lambda device, value=value: value)
    listing = (f"GPU:0\nprocess    4242 uses     1024.000 MB GPU memory\n"
               f"process {os.getpid():>7} uses      512.000 MB GPU memory")
    monkeypatch.setattr(torch.cuda, "list_gpu_processes", lambda device: listing)
    cpu = set(common.machine_load(torch.device("cpu")))  # the CPU's part, then the GPU's

    def gpu_load():
        return {k: v for k, v in common.machine_load(torch.device("cuda")).items() if k not in cpu}

    assert gpu_load() == {"gpu_utilization_pct": 87, "gpu_temperature_c": 71, "gpu_power_mw": 301_000,
                          "gpu_sm_clock_mhz": 1755, "gpu_other_pids": [4242]}  # this process is not "other"

    def no_pynvml(device):
        raise ModuleNotFoundError("pynvml does not seem to be installed or it can't be imported.")

    monkeypatch.setattr(torch.cuda, "temperature", no_pynvml)
    assert gpu_load() == {
        "nvml": "unavailable: ModuleNotFoundError: pynvml does not seem to be installed or it can't be imported."}


def test_get_config_overrides():
    cfg = get_config("tiny", num_layers=2, d_ff=None)
    assert cfg.num_layers == 2 and cfg.d_ff == 1344


def test_format_bytes_uses_powers_of_two():
    assert results.format_bytes(3 * 2**30) == "3.00 GiB"
    assert results.format_bytes(1536 * 2**10) == "1.50 MiB"
    assert results.format_bytes(512) == "512 B"
    assert results.format_bytes(None) is None


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


# ---- result files: one stem per run, whatever happens ----


def test_a_stem_is_reserved_before_the_first_record(tmp_path):
    # a second run started while the first is still in its first configuration (nothing appended yet)
    first = ResultFiles(tmp_path, "e2e", "run", "e2e")
    second = ResultFiles(tmp_path, "e2e", "run", "e2e")
    assert (first.stem, second.stem) == ("run", "run-2")
    # the default stem, twice in the same second
    stems = {ResultFiles(tmp_path, "e2e", None, "e2e").stem for _ in range(3)}
    assert len(stems) == 3


def test_runs_started_together_never_share_a_stem(tmp_path):
    barrier = threading.Barrier(8)
    stems = []

    def start_run():
        barrier.wait()
        stems.append(ResultFiles(tmp_path, "e2e", "same", "e2e").stem)

    threads = [threading.Thread(target=start_run) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(stems) == sorted(["same"] + [f"same-{n}" for n in range(2, 9)])


def test_two_sweeps_with_the_same_out_keep_both_results(tmp_path):
    argv = [sys.executable, str(HERE / "precision_demo.py"), "--count", "10", "--results-dir", str(tmp_path),
            "--out", "same"]
    procs = [subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True) for _ in range(2)]
    for proc in procs:
        assert proc.wait(timeout=120) == 0, proc.stderr.read()
    folder = tmp_path / "precision"
    assert sorted(p.name for p in folder.glob("*.md")) == ["same-2.md", "same.md"]
    for stem in ("same", "same-2"):
        assert len(results.read_records(folder / f"{stem}.jsonl")) == 6  # each run's own six cases, unmixed


@pytest.mark.parametrize("out", ["/tmp/abs", "../up", "a/b", "missing/parent/x", "", ".", "..", ".hidden", "-x",
                                 "a\nb", "x" * 300])
def test_out_must_be_a_plain_stem(out, capsys):
    with pytest.raises(SystemExit) as exit_:
        common_parser().parse_args([f"--out={out}"])
    assert exit_.value.code == 2 and len(capsys.readouterr().err.strip().splitlines()) == 1


def test_results_dir_is_created_or_refused_before_any_work(tmp_path, capsys):
    deep = tmp_path / "a" / "b"
    assert ResultFiles(common_parser().parse_args(["--results-dir", str(deep)]).results_dir, "e2e", "x",
                       "e2e").jsonl.is_file()
    a_file = tmp_path / "file"
    a_file.write_text("")
    for argv in (["--results-dir", str(a_file)], ["--results-dir", ""]):
        with pytest.raises(SystemExit) as exit_:
            common_parser().parse_args(argv)
        assert exit_.value.code == 2
    capsys.readouterr()
    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / "e2e").write_text("")  # the subfolder is a file
    for folder, subdir in (("/proc", "e2e"), (tmp_path / "taken", "e2e")):
        with pytest.raises(SystemExit) as exit_:
            ResultFiles(folder, subdir, "x", "e2e")
        err = capsys.readouterr().err
        assert exit_.value.code == 2 and "cannot write results in" in err and len(err.strip().splitlines()) == 1


def common_parser():
    parser = results.ArgParser()
    results.add_output_args(parser, "e2e-<UTC time>")
    return parser


class FullDisk:
    """os.write on a disk that fills up: the file whose name ends in `suffix` takes `room` more bytes, then a write
    stores what still fits (half a record) and the next one fails with ENOSPC. Other files are untouched."""

    def __init__(self, room: int, suffix: str = ".jsonl"):
        self.room, self.suffix, self._write = room, suffix, os.write

    def __call__(self, fd, data):
        if not os.readlink(f"/proc/self/fd/{fd}").endswith(self.suffix):
            return self._write(fd, data)
        if self.room <= 0:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        written = self._write(fd, bytes(data[:self.room]))
        self.room -= written
        return written


def test_a_full_disk_keeps_every_whole_record_and_prints_the_one_it_could_not_write(tmp_path, monkeypatch, capsys):
    import precision_demo
    precision_demo.main(["--count", "10", "--results-dir", str(tmp_path), "--out", "sizes"])
    capsys.readouterr()
    lines = (tmp_path / "precision" / "sizes.jsonl").read_bytes().splitlines(keepends=True)
    # room for two records and half of the third: the third is cut in the middle, as on a real full disk
    monkeypatch.setattr(results.os, "write", FullDisk(len(lines[0]) + len(lines[1]) + len(lines[2]) // 2))
    with pytest.raises(SystemExit) as exit_:
        precision_demo.main(["--count", "10", "--results-dir", str(tmp_path), "--out", "full"])
    out, err = capsys.readouterr()
    assert exit_.value.code == 1 and "No space left on device" in err and len(err.strip().splitlines()) == 1
    assert "2 record(s) written before it are kept in" in err
    saved = tmp_path / "precision" / "full.jsonl"
    assert saved.read_bytes().endswith(b"\n")  # the half-written line is cut off: every line is whole
    assert [r["case"] for r in results.read_records(saved)] == ["1", "2"]
    (printed,) = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    assert printed["case"] == "3" and printed["result"] > 0  # the measured case that did not fit is on stdout
    assert not (tmp_path / "precision" / "full.md").exists()


def test_a_file_size_limit_cuts_no_record_in_half(tmp_path):
    """A real short write (RLIMIT_FSIZE: the kernel stores what fits, then refuses with EFBIG), in a child: the
    record whose write failed is cut back and is on stdout, not half in the file (a buffered file object would
    write its leftover again when closed, after the cut)."""
    import resource
    argv = [sys.executable, str(HERE / "precision_demo.py"), "--count", "10", "--results-dir", str(tmp_path)]
    subprocess.run([*argv, "--out", "sizes"], check=True, capture_output=True, timeout=120)
    first, second = (tmp_path / "precision" / "sizes.jsonl").read_bytes().splitlines(keepends=True)[:2]
    limit = len(first) + len(second) // 2

    def limit_file_size():
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    proc = subprocess.run([*argv, "--out", "cut"], capture_output=True, text=True, timeout=120,
                          preexec_fn=limit_file_size)
    assert proc.returncode == 1, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and "File too large" in proc.stderr
    saved = tmp_path / "precision" / "cut.jsonl"
    assert saved.read_bytes().endswith(b"\n")  # whole records only: the first
    assert [r["case"] for r in results.read_records(saved)] == ["1"]
    assert json.loads(proc.stdout.strip().splitlines()[-1])["case"] == "2"


def test_an_interrupt_while_a_record_is_written_leaves_whole_lines(tmp_path, monkeypatch):
    files = ResultFiles(tmp_path, "e2e", "int", "e2e")
    files.append_record({"a": 1})
    real_write = os.write

    def write_half_then_interrupt(fd, data):
        real_write(fd, bytes(data[: len(data) // 2]))
        raise KeyboardInterrupt

    monkeypatch.setattr(results.os, "write", write_half_then_interrupt)
    with pytest.raises(KeyboardInterrupt):
        files.append_record({"a": 2, "b": "x" * 100})
    monkeypatch.undo()
    assert results.read_records(files.jsonl) == [{"a": 1}]


def test_a_full_disk_leaves_the_previous_markdown(tmp_path, monkeypatch, capsys):
    files = ResultFiles(tmp_path, "e2e", "md", "e2e")
    files.write_report(lambda fmt: "two rows", "github")
    real_write_text = Path.write_text

    def half_then_full(self, text, *args, **kwargs):
        real_write_text(self, text[: len(text) // 2], *args, **kwargs)
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(Path, "write_text", half_then_full)
    with pytest.raises(SystemExit) as exit_:
        files.write_report(lambda fmt: "three rows", "github")
    assert exit_.value.code == 1 and "No space left on device" in capsys.readouterr().err
    assert files.markdown.read_text() == "two rows\n"
    # no partial file left, and the reserved JSONL, which no record reached, is given back
    assert sorted(p.name for p in files.folder.iterdir()) == ["md.md"]


@dataclasses.dataclass
class Timing:
    mean_ms: float


def test_records_are_strict_json(tmp_path):
    files = ResultFiles(tmp_path, "e2e", "strict", "e2e")
    files.append_record({"cv": float("nan"), "samples": [1.0, float("inf")], "nested": {"x": -float("inf")},
                         "timing": Timing(float("nan")), "dtype": torch.float32, "ok": 1.5})
    line = files.jsonl.read_text()

    def refuse(token):
        raise ValueError(f"not strict JSON: {token}")

    record = json.loads(line, parse_constant=refuse)
    assert record == {"cv": None, "samples": [1.0, None], "nested": {"x": None}, "timing": {"mean_ms": None},
                      "dtype": "torch.float32", "ok": 1.5}


# ---- numbers that cannot be used are refused at parse time, in every script ----


def bench_scripts():
    import bench_attention
    import bench_e2e
    import mem_profile
    import precision_demo
    import toy_autocast
    return {"bench_e2e": bench_e2e, "bench_attention": bench_attention, "mem_profile": mem_profile,
            "precision_demo": precision_demo, "toy_autocast": toy_autocast}


HUGE = "99999999999999999999999"


@pytest.mark.parametrize("script,argv", [
    ("bench_e2e", ["--context-length", "99999999999999999999"]),
    ("bench_e2e", ["--seed", HUGE]),
    ("bench_e2e", ["--seed", str(-2**63 - 1)]),
    ("bench_e2e", ["--batch-size", HUGE]),
    ("bench_e2e", ["--steps", HUGE]),
    ("bench_e2e", ["--warmup", "10000000"]),
    ("bench_e2e", ["--context-length", str(2**40)]),  # fits int64, but the attention scores do not
    ("bench_e2e", ["--d-model", str(2**62), "--size", "tiny"]),
    ("bench_e2e", ["--peak-tflops", "inf"]),
    ("bench_e2e", ["--peak-tflops", "nan"]),
    ("bench_e2e", ["--peak-tflops", "1e999"]),
    ("bench_e2e", ["--steps", "9" * 5000]),  # beyond Python's int-from-string digit limit
    ("bench_attention", ["--seq-len", str(2**31)]),
    ("bench_attention", ["--iters", HUGE]),
    ("bench_attention", ["--warmup", HUGE]),
    ("bench_attention", ["--seed", HUGE]),
    ("mem_profile", ["--context-length", HUGE]),
    ("mem_profile", ["--steps", "10000000"]),
    ("mem_profile", ["--seed", HUGE]),
    ("mem_profile", ["--batch-size", str(2**60)]),
    ("toy_autocast", ["--seed", HUGE]),
    ("toy_autocast", ["--batch-size", str(2**62)]),
    ("precision_demo", ["--value", "70000"]),
    ("precision_demo", ["--value", "100", "--count", "1000"]),  # the float16 accumulator would overflow
])
def test_numbers_too_large_to_use_are_refused_at_parse_time(script, argv, capsys):
    module = bench_scripts()[script]
    if script != "precision_demo":
        argv = [*argv, "--device", "cpu"]
    if script in ("bench_e2e", "mem_profile"):  # chosen explicitly: no note about which xl runs
        argv = [*argv, "--handout", "2026"]
    with pytest.raises(SystemExit) as exit_:
        module.parse_args(argv)
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and len(err.strip().splitlines()) == 1 and "Traceback" not in err


def test_the_bounds_are_the_usable_ranges():
    assert results.seed_int(str(2**64 - 1)) == 2**64 - 1 and results.seed_int(str(-2**63)) == -2**63
    torch.manual_seed(results.seed_int(str(2**64 - 1)))  # the extremes really are usable
    torch.manual_seed(results.seed_int(str(-2**63)))
    assert results.positive_int(str(2**63 - 1)) == 2**63 - 1
    assert results.step_count(str(results.MAX_STEPS)) == results.MAX_STEPS
    assert results.positive_float("1e300") == 1e300


# ---- handouts ----

# The two handouts' Table 1, as printed in them (d_model, d_ff, num_layers, num_heads)
TABLE_1 = {"2026": {"small": (768, 3072, 12, 12), "medium": (1024, 4096, 24, 16), "large": (1280, 5120, 36, 20),
                    "xl": (2560, 10240, 32, 32), "10B": (4608, 12288, 50, 36)},
           "2025": {"small": (768, 3072, 12, 12), "medium": (1024, 4096, 24, 16), "large": (1280, 5120, 36, 20),
                    "xl": (1600, 6400, 48, 25), "2.7B": (2560, 10240, 32, 32)}}


@pytest.mark.parametrize("handout", list(TABLE_1))
def test_each_handout_has_its_table_1_and_tiny(handout):
    chosen = results.HANDOUTS[handout]
    assert chosen.table1 == list(TABLE_1[handout])
    for name, dims in TABLE_1[handout].items():
        cfg = get_config(name, handout)
        assert (cfg.d_model, cfg.d_ff, cfg.num_layers, cfg.num_heads, cfg.vocab_size) == (*dims, 10_000)
    tiny = get_config("tiny", handout)
    assert (tiny.d_model, tiny.d_ff, tiny.num_layers, tiny.num_heads) == (512, 1344, 4, 16)
    assert results.expand_sizes(["all"], handout) == list(TABLE_1[handout])  # 'all' is Table 1, not tiny


def test_handout_defaults():
    assert results.DEFAULT_HANDOUT == "2026"
    assert get_config("small").context_length == 512 and get_config("small", "2025").context_length == 128
    assert get_config("small", "2025", context_length=64).context_length == 64
    h26, h25 = results.HANDOUTS["2026"], results.HANDOUTS["2025"]
    assert (h26.memory_size, h26.memory_contexts, h26.checkpoint_setup) == ("xl", (128, 2048), ("xl", 4, 2048))
    assert (h25.memory_size, h25.memory_contexts, h25.checkpoint_setup) == ("2.7B", (128, 256, 512), None)
    assert h26.title == "handout 2026 (v26.1.1)"


@pytest.mark.parametrize("handout,name,other", [("2026", "2.7B", "2025"), ("2025", "10B", "2026")])
def test_a_name_from_the_other_handout_says_which_handout_has_it(handout, name, other):
    with pytest.raises(ValueError, match=rf"'{name}' is in handout {other}'s table, not in handout {handout}'s.*"
                                         rf"--handout {other}"):
        get_config(name, handout)
    with pytest.raises(ValueError, match=r"unknown preset 'huge'; valid presets in handout 2025: tiny, small, "
                                         r"medium, large, xl, 2\.7B, all$"):
        results.expand_sizes(["small", "huge"], "2025")
    with pytest.raises(ValueError, match="unknown handout '2024'; valid handouts: 2026, 2025"):
        get_config("small", "2024")


def resolve(argv, monkeypatch, env=None):
    parser = results.ArgParser(prog="t")
    results.add_handout_arg(parser)
    monkeypatch.delenv(results.HANDOUT_ENV, raising=False)
    if env is not None:
        monkeypatch.setenv(results.HANDOUT_ENV, env)
    args = parser.parse_args(argv)
    return results.handout_or_exit(parser, args), args


def test_handout_comes_from_the_flag_then_the_environment_then_the_default(monkeypatch):
    assert resolve([], monkeypatch)[0].name == "2026"
    handout, args = resolve([], monkeypatch, env="2025")
    assert handout.name == "2025" and args.handout == "2025" and args.handout_source == results.HANDOUT_ENV
    handout, args = resolve(["--handout", "2026"], monkeypatch, env="2025")
    assert handout.name == "2026" and args.handout_source == "--handout"


@pytest.mark.parametrize("argv,env,message", [
    (["--handout", "2024"], None, "invalid choice: '2024'"),
    ([], "2024", "CS336_HANDOUT='2024' is not a handout; valid handouts: 2026, 2025"),
])
def test_a_bad_handout_is_a_one_line_exit_2(argv, env, message, monkeypatch, capsys):
    with pytest.raises(SystemExit) as exit_info:
        resolve(argv, monkeypatch, env)
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and message in err and "2025" in err and len(err.strip().splitlines()) == 1


def test_the_default_handout_notes_a_name_that_means_another_model(monkeypatch, capsys):
    parser = results.ArgParser(prog="t")
    _, args = resolve([], monkeypatch)
    assert results.sizes_or_exit(parser, args, ["small", "xl"]) == ["small", "xl"]
    assert ("note: xl is handout 2026's xl (d_model 2560, 32 layers), not handout 2025's (d_model 1600, 48 layers): "
            "for that one pass --handout 2025") in capsys.readouterr().err
    _, args = resolve(["--handout", "2026"], monkeypatch)  # chosen explicitly: no note
    results.sizes_or_exit(parser, args, ["xl"])
    assert capsys.readouterr().err == ""


def test_config_table_names_the_handout_and_counts_each_size_once():
    h = results.HANDOUTS["2025"]
    text = results.config_table([("xl", get_config("xl", "2025", context_length=c)) for c in (128, 256)]
                                     + [("tiny", get_config("tiny", "2025"))], h)
    assert text.startswith("Model sizes from handout 2025 (Spring 2025):")
    assert text.count("| xl ") == 1 and "1,998,235,200" in text and "| tiny " in text


def test_dry_run_printer_numbers_the_plan(capsys):
    assert results.print_dry_run(["a ctx=1", "b ctx=2"], preamble="TABLE") == 0
    out = capsys.readouterr().out
    assert out.startswith("TABLE\n\ndry run: 2 configurations would run")
    assert "  1. a ctx=1\n  2. b ctx=2\n" in out and "nothing was built" in out


# ---- kineto's noise: USDT marker lines, and the failed GPU count of a CUDA build without a GPU ----

PROFILE_SNIPPET = """
import os, sys, torch, common
profile = common.quiet_profiler if sys.argv[1] == "quiet" else (
    lambda acts: torch.profiler.profile(activities=acts))
with profile([torch.profiler.ProfilerActivity.CPU]):
    torch.ones(3).add_(1)
    os.write(2, b"a line of our own\\n")
print("done")
"""


@pytest.mark.parametrize("mode", ["plain", "quiet"])
def test_quiet_profiler_drops_kineto_markers_and_nothing_else(mode):
    out = subprocess.run([sys.executable, "-c", PROFILE_SNIPPET, mode], capture_output=True, text=True,
                         cwd=Path(__file__).resolve().parent, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "done"
    assert "a line of our own" in out.stderr
    if mode == "plain":  # the lines this guards against, where this torch prints them
        if common.KINETO_PRINTS_MARKERS:  # at start and stop
            assert "profiler_start" in out.stderr and "USDT:" in out.stderr
        if torch.version.cuda and not torch.cuda.is_available():  # a CUDA build on a machine without a GPU
            assert "gpuGetDeviceCount failed" in out.stderr
    else:  # nothing but our own line: no marker, no failed GPU count, no warning (torch 2.10-2.12's acc_events)
        assert out.stderr.splitlines() == ["a line of our own"]


def test_kineto_noise_is_the_markers_and_without_a_gpu_the_failed_gpu_count():
    # as printed by torch 2.13.0+cpu and by torch 2.11.0+cu130 on this machine (no GPU, no driver)
    marker = b"USDT:2026-11-23 20:31:13 7613:7613 SyncActivityProfilerHandler.cpp:52] profiler_start\n"
    no_gpu = b"ERROR:2026-11-23 20:30:50 7167:7167 DeviceProperties.cpp:48] gpuGetDeviceCount failed with code 35\n"
    other_error = b"ERROR:2026-11-23 20:30:50 7167:7167 CuptiActivityApi.cpp:1] CUPTI initialization failed\n"
    assert common.is_kineto_noise(marker, gpu=True) and common.is_kineto_noise(marker, gpu=False)
    assert common.is_kineto_noise(no_gpu, gpu=False) and not common.is_kineto_noise(no_gpu, gpu=True)
    assert not common.is_kineto_noise(other_error, gpu=False)
    assert not common.is_kineto_noise(b"a line of our own\n", gpu=False)

