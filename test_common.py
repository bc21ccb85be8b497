"""common.py: timer synchronisation, precision contexts, ranges, peaks, result files, the child-process runner."""
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
from common import (ResultFiles, SyncTimer, annotate, get_config, matmul_precision_key, peak_tflops,
                    precision_context, render_table, resolve_device, run_isolated, set_ranges, summarize)

HERE = Path(__file__).resolve().parent


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
    assert summarize([5.0])["std"] == 0.0


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


def returns_config(n):
    return {"n": n, "pid": os.getpid()}


def raises_oom(n):
    raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")


def raises_value_error(n):
    raise ValueError("bad thing\nsecond line")


def dies(n):
    os._exit(7)


def test_run_isolated_returns_values_and_failures():
    ok = run_isolated(returns_config, {"n": 3})
    assert ok == {"ok": True, "value": {"n": 3, "pid": ok["value"]["pid"]}}
    assert ok["value"]["pid"] != os.getpid()  # really another process
    assert run_isolated(raises_oom, {"n": 1})["status"] == "OOM"
    assert run_isolated(raises_value_error, {"n": 1})["status"] == "error: ValueError: bad thing"
    assert run_isolated(dies, {"n": 1})["status"] == "error: child process died with exit code 7"
    assert run_isolated(raises_oom, {"n": 1}, in_process=True)["status"] == "OOM"


def test_injected_fault_matches_only_its_configuration(monkeypatch):
    monkeypatch.setenv(common.FAULT_ENV, "oom:context_length=256,dtype=fp32")
    common.maybe_inject_fault({"context_length": 128, "dtype": "fp32"})
    with pytest.raises(torch.OutOfMemoryError):
        common.maybe_inject_fault({"context_length": 256, "dtype": "fp32"})


def test_get_config_overrides():
    cfg = get_config("tiny", num_layers=2, d_ff=None)
    assert cfg.num_layers == 2 and cfg.d_ff == 1344


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
        assert len(common.read_records(folder / f"{stem}.jsonl")) == 6  # each run's own six cases, unmixed


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
    parser = common.ArgParser()
    common.add_output_args(parser, "e2e")
    return parser


class FullDisk:
    """A file whose writes stop half-way with ENOSPC after `room` whole writes, like a disk that fills up."""

    def __init__(self, file, room: list[int]):
        self._file, self._room = file, room

    def write(self, text):
        if self._room[0] <= 0:
            self._file.write(text[: len(text) // 2])
            self._file.flush()
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        self._room[0] -= 1
        return self._file.write(text)

    def __getattr__(self, name):
        return getattr(self._file, name)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self._file.close()


def test_a_full_disk_keeps_the_finished_records_and_stops_with_one_line(tmp_path, monkeypatch, capsys):
    import precision_demo
    room = [2]
    def open_appends_on_a_full_disk(path, mode="r", *args, **kwargs):
        file = open(path, mode, *args, **kwargs)
        return FullDisk(file, room) if "a" in mode else file

    monkeypatch.setattr(common, "open", open_appends_on_a_full_disk, raising=False)
    with pytest.raises(SystemExit) as exit_:
        precision_demo.main(["--count", "10", "--results-dir", str(tmp_path), "--out", "full"])
    err = capsys.readouterr().err
    assert exit_.value.code == 1 and "No space left on device" in err and len(err.strip().splitlines()) == 1
    records = common.read_records(tmp_path / "precision" / "full.jsonl")  # the half-written line is cut off
    assert [r["case"] for r in records] == ["1", "2"]


def test_a_full_disk_leaves_the_previous_markdown(tmp_path, monkeypatch, capsys):
    files = ResultFiles(tmp_path, "e2e", "md", "e2e")
    files.write_markdown("two rows")
    real_write_text = Path.write_text

    def half_then_full(self, text, *args, **kwargs):
        real_write_text(self, text[: len(text) // 2], *args, **kwargs)
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(Path, "write_text", half_then_full)
    with pytest.raises(SystemExit) as exit_:
        files.write_markdown("three rows")
    assert exit_.value.code == 1 and "No space left on device" in capsys.readouterr().err
    assert files.markdown.read_text() == "two rows\n"
    assert sorted(p.name for p in files.folder.iterdir()) == ["md.jsonl", "md.md"]  # no partial file left


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
    with pytest.raises(SystemExit) as exit_:
        module.parse_args(argv)
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and len(err.strip().splitlines()) == 1 and "Traceback" not in err


def test_the_bounds_are_the_usable_ranges():
    assert common.seed_int(str(2**64 - 1)) == 2**64 - 1 and common.seed_int(str(-2**63)) == -2**63
    torch.manual_seed(common.seed_int(str(2**64 - 1)))  # the extremes really are usable
    torch.manual_seed(common.seed_int(str(-2**63)))
    assert common.positive_int(str(2**63 - 1)) == 2**63 - 1
    assert common.step_count(str(common.MAX_STEPS)) == common.MAX_STEPS
    assert common.positive_float("1e300") == 1e300
