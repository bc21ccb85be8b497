"""common.py: timer synchronisation, precision contexts, ranges, peaks, result files, the child-process runner."""
import os
import time

import pytest
import torch

import common
from common import (ResultFiles, SyncTimer, annotate, get_config, matmul_precision_key, peak_tflops,
                    precision_context, render_table, resolve_device, run_isolated, set_ranges, summarize)


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


# ---- handouts ----

# The two handouts' Table 1, as printed in them (d_model, d_ff, num_layers, num_heads)
TABLE_1 = {"2026": {"small": (768, 3072, 12, 12), "medium": (1024, 4096, 24, 16), "large": (1280, 5120, 36, 20),
                    "xl": (2560, 10240, 32, 32), "10B": (4608, 12288, 50, 36)},
           "2025": {"small": (768, 3072, 12, 12), "medium": (1024, 4096, 24, 16), "large": (1280, 5120, 36, 20),
                    "xl": (1600, 6400, 48, 25), "2.7B": (2560, 10240, 32, 32)}}


@pytest.mark.parametrize("handout", list(TABLE_1))
def test_each_handout_has_its_table_1_and_tiny(handout):
    chosen = common.HANDOUTS[handout]
    assert chosen.table1 == list(TABLE_1[handout])
    for name, dims in TABLE_1[handout].items():
        cfg = get_config(name, handout)
        assert (cfg.d_model, cfg.d_ff, cfg.num_layers, cfg.num_heads, cfg.vocab_size) == (*dims, 10_000)
    tiny = get_config("tiny", handout)
    assert (tiny.d_model, tiny.d_ff, tiny.num_layers, tiny.num_heads) == (512, 1344, 4, 16)
    assert common.expand_sizes(["all"], handout) == list(TABLE_1[handout])  # 'all' is Table 1, not tiny


def test_handout_defaults():
    assert common.DEFAULT_HANDOUT == "2026"
    assert get_config("small").context_length == 512 and get_config("small", "2025").context_length == 128
    assert get_config("small", "2025", context_length=64).context_length == 64
    h26, h25 = common.HANDOUTS["2026"], common.HANDOUTS["2025"]
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
        common.expand_sizes(["small", "huge"], "2025")
    with pytest.raises(ValueError, match="unknown handout '2024'; valid handouts: 2026, 2025"):
        get_config("small", "2024")


def resolve(argv, monkeypatch, env=None):
    parser = common.ArgParser(prog="t")
    common.add_handout_arg(parser)
    monkeypatch.delenv(common.HANDOUT_ENV, raising=False)
    if env is not None:
        monkeypatch.setenv(common.HANDOUT_ENV, env)
    args = parser.parse_args(argv)
    return common.handout_or_exit(parser, args), args


def test_handout_comes_from_the_flag_then_the_environment_then_the_default(monkeypatch):
    assert resolve([], monkeypatch)[0].name == "2026"
    handout, args = resolve([], monkeypatch, env="2025")
    assert handout.name == "2025" and args.handout == "2025" and args.handout_source == common.HANDOUT_ENV
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
    parser = common.ArgParser(prog="t")
    _, args = resolve([], monkeypatch)
    assert common.sizes_or_exit(parser, args, ["small", "xl"]) == ["small", "xl"]
    assert ("note: xl is handout 2026's xl (d_model 2560, 32 layers), not handout 2025's (d_model 1600, 48 layers): "
            "for that one pass --handout 2025") in capsys.readouterr().err
    _, args = resolve(["--handout", "2026"], monkeypatch)  # chosen explicitly: no note
    common.sizes_or_exit(parser, args, ["xl"])
    assert capsys.readouterr().err == ""


def test_config_table_names_the_handout_and_counts_each_size_once():
    h = common.HANDOUTS["2025"]
    text = common.config_table([("xl", get_config("xl", "2025", context_length=c)) for c in (128, 256)]
                               + [("tiny", get_config("tiny", "2025"))], h)
    assert text.startswith("Model sizes from handout 2025 (Spring 2025):")
    assert text.count("| xl ") == 1 and "1,998,235,200" in text and "| tiny " in text


def test_dry_run_printer_numbers_the_plan(capsys):
    assert common.print_dry_run(["a ctx=1", "b ctx=2"], preamble="TABLE") == 0
    out = capsys.readouterr().out
    assert out.startswith("TABLE\n\ndry run: 2 configurations would run")
    assert "  1. a ctx=1\n  2. b ctx=2\n" in out and "nothing was built" in out
