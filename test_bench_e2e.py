"""bench_e2e.py through its command line on tiny configurations (CPU)."""
import dataclasses
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

import bench_e2e
import common
import runner
from common import forward_flops, get_config, read_records
from model import TransformerLM, cross_entropy

HERE = Path(__file__).resolve().parent
# a tiny model so each configuration takes milliseconds; on the CPU on any machine (the tests expect CPU figures:
# no MFU, no peak memory)
SMALL = ["--device", "cpu",
         "--size", "tiny", "--num-layers", "1", "--d-model", "64", "--num-heads", "4", "--d-ff", "128",
         "--vocab-size", "256", "--context-length", "16", "--steps", "3", "--warmup", "1"]


def run_main(tmp_path, *extra, capsys=None):
    code = bench_e2e.main([*SMALL, "--results-dir", str(tmp_path), "--out", "t", *extra])
    records = read_records(tmp_path / "e2e" / "t.jsonl")
    return code, records


def table_lines(text):
    return [line for line in text.splitlines() if line.startswith("|")]


@pytest.mark.parametrize("mode,extra,phases", [
    ("forward", [], ["forward"]),
    ("forward", ["--no-grad"], ["forward"]),
    ("forward-backward", [], ["forward", "backward"]),
    ("train", [], ["forward", "backward", "optimizer"]),
])
def test_each_mode_end_to_end(tmp_path, capsys, mode, extra, phases):
    code, records = run_main(tmp_path, "--mode", mode, "--in-process", *extra)
    out = capsys.readouterr().out
    assert code == 0
    (record,) = records
    assert record["status"] in ("ok", "noisy")
    assert record["config"]["mode"] == mode
    for phase in phases + ["step"]:
        assert len(record[f"{phase}_ms"]) == 3  # every raw sample is kept
        for stat in ("mean", "std", "median", "min"):
            assert record[f"{phase}_ms_{stat}"] > 0 or stat == "std"
    absent = {"forward", "backward", "optimizer"} - set(phases)
    assert not any(f"{p}_ms" in record for p in absent)
    # the config table comes first, then the results table with the promised columns
    header = table_lines(out)[0]
    assert "params" in header
    results_header = [line for line in table_lines(out) if "step ms" in line][0]
    for column in ("size", "d_model", "d_ff", "layers", "heads", "ctx", "dtype", "warmup", "fwd ms", "fwd std",
                   "step ms", "step std", "tokens/s", "TFLOP/s", "status"):
        assert f" {column} " in results_header
    assert ("opt ms" in results_header) == (mode == "train")
    assert record["environment"]["torch"] == torch.__version__
    assert (tmp_path / "e2e" / "t.md").read_text().count("step ms") == 1


@pytest.mark.parametrize("dtype", ["fp32", "bf16", "fp16"])
def test_each_dtype_trains(tmp_path, dtype):
    code, (record,) = run_main(tmp_path, "--dtype", dtype, "--in-process")
    assert code == 0 and record["config"]["dtype"] == dtype and record["step_ms_mean"] > 0


def test_phases_add_up_to_the_step(tmp_path):
    code, (record,) = run_main(tmp_path, "--in-process", "--steps", "5")
    for i in range(5):
        parts = sum(record[f"{p}_ms"][i] for p in ("forward", "backward", "optimizer"))
        step = record["step_ms"][i]
        assert all(record[f"{p}_ms"][i] > 0 for p in ("forward", "backward", "optimizer"))
        assert parts <= step * 1.0001 and parts >= 0.95 * step


def test_run_step_calls_phases_in_order_with_synchronisation(monkeypatch):
    run = runner.RunConfig(size="custom", model=common.ModelConfig(32, 64, 1, 2, 64, 8), steps=1, warmup=0)
    work = runner.Workload(run)
    order = []
    monkeypatch.setattr(runner, "SyncTimer", lambda device: _RecordingTimer(order))
    times = runner.run_step(work, on_phase=order.append)
    # step timer opens; each phase is announced, then timed between two synchronisations; step timer closes
    assert order == ["sync", "forward", "sync", "sync", "backward", "sync", "sync", "optimizer", "sync", "sync",
                     "end", "sync"]
    assert set(times) == {"forward", "backward", "optimizer", "step"}


class _RecordingTimer(common.SyncTimer):
    def __init__(self, order):
        super().__init__(sync=lambda: order.append("sync"))


def test_flops_formula_matches_flop_counter():
    cfg = get_config("tiny", num_layers=2, context_length=64)
    model = TransformerLM(cfg)  # naive attention: its matmuls are what the formula counts
    tokens = torch.randint(0, cfg.vocab_size, (2, 64))
    with FlopCounterMode(display=False) as fwd:
        loss = cross_entropy(model(tokens), tokens)
    with FlopCounterMode(display=False) as bwd:
        loss.backward()
    formula = forward_flops(cfg, 2, 64)
    assert abs(fwd.get_total_flops() - formula) / formula < 0.01
    step = fwd.get_total_flops() + bwd.get_total_flops()
    assert abs(step - common.step_flops(cfg, 2, 64, "train")) / step < 0.01


def test_mfu_empty_on_cpu_and_computed_for_a_known_gpu(tmp_path):
    code, (record,) = run_main(tmp_path, "--in-process")
    assert record["mfu"] is None and record["peak_tflops"] is None
    run = bench_e2e.RunConfig(size="tiny", model=get_config("tiny", "2025"), handout="2025")  # context 128
    fake = {"step_ms": [100.0, 100.0], "forward_ms": [30.0, 30.0], "backward_ms": [60.0, 60.0],
            "optimizer_ms": [10.0, 10.0],
            "environment": {"device": "cuda:0", "device_name": "NVIDIA H100 80GB HBM3", "tf32_matmul": False}}
    figures = bench_e2e.derive_figures(run, fake)
    expected_tflops = common.step_flops(run.model, 4, 128, "train") / 0.1 / 1e12
    assert figures["achieved_tflops"] == pytest.approx(expected_tflops)
    assert figures["mfu"] == pytest.approx(expected_tflops / 67.0)  # fp32 without TF32: the fp32 peak
    fake["environment"]["tf32_matmul"] = True
    assert bench_e2e.derive_figures(run, fake)["mfu"] == pytest.approx(expected_tflops / 494.7)
    fake["environment"]["device_name"] = "Some Future GPU"
    assert bench_e2e.derive_figures(run, fake)["mfu"] is None
    assert bench_e2e.derive_figures(run, fake, peak_override=100.0)["mfu"] == pytest.approx(expected_tflops / 100)


def test_noisy_rows_are_flagged():
    run = bench_e2e.RunConfig(size="tiny", model=get_config("tiny"), mode="forward")
    steady = {"forward_ms": [10.0, 10.1, 9.9], "step_ms": [10.0, 10.1, 9.9],
              "environment": {"device": "cpu", "device_name": "cpu"}}
    assert bench_e2e.derive_figures(run, steady)["noisy"] == []
    jumpy = {**steady, "forward_ms": [10.0, 30.0, 10.0], "step_ms": [10.0, 30.0, 10.0]}
    record = {**jumpy, **bench_e2e.derive_figures(run, jumpy), "status": "noisy",
              "config": dataclasses.asdict(run)}
    assert record["noisy"] == ["forward 69%", "step 69%"]
    assert bench_e2e.table_row(record)["status"].startswith("NOISY")


def test_sweep_survives_an_oom_and_skips_larger_contexts(tmp_path, monkeypatch, capsys):
    # child processes (the default) inherit the fault injection through the environment
    monkeypatch.setenv(common.FAULT_ENV, "oom:context_length=32")
    code, records = run_main(tmp_path, "--context-length", "16", "32", "64", "--steps", "2", "--warmup", "0")
    assert code == 0
    assert [r["status"] for r in records][1:] == ["OOM", "skipped: OOM at ctx=32"]
    assert records[0]["status"] in ("ok", "noisy") and records[0]["step_ms_mean"] > 0
    assert records[1].get("step_ms") is None
    out = capsys.readouterr()
    assert "OOM" in out.out and "[2/3]" in out.err
    monkeypatch.setenv(common.FAULT_ENV, "error:context_length=16")
    code, records = bench_e2e.main([*SMALL, "--context-length", "16", "32", "--no-skip", "--in-process",
                                    "--results-dir", str(tmp_path), "--out", "u"]), read_records(tmp_path / "e2e" / "u.jsonl")
    assert records[0]["status"].startswith("error: RuntimeError: injected failure")
    assert records[1]["status"] in ("ok", "noisy")


def test_no_skip_runs_larger_contexts_after_oom(tmp_path, monkeypatch):
    monkeypatch.setenv(common.FAULT_ENV, "oom:context_length=16")
    code, records = run_main(tmp_path, "--context-length", "16", "32", "--in-process", "--no-skip")
    assert [r["status"] for r in records][0] == "OOM" and records[1]["status"] in ("ok", "noisy")


def test_interrupted_sweep_keeps_finished_records(tmp_path, monkeypatch):
    real = runner.run_isolated
    calls = []

    def interrupt_on_third(fn, kwargs, in_process=False, timeout_s=None):
        calls.append(kwargs)
        if len(calls) == 4:  # the sweep's environment, then the configurations
            raise KeyboardInterrupt
        return real(fn, kwargs, in_process=True)

    monkeypatch.setattr(runner, "run_isolated", interrupt_on_third)
    code, records = run_main(tmp_path, "--warmup", "0", "1", "2", "3")
    assert code == 130
    assert [r["config"]["warmup"] for r in records] == [0, 1]
    assert "step ms" in (tmp_path / "e2e" / "t.md").read_text()


def test_ctrl_c_on_a_real_sweep(tmp_path):
    """SIGINT to the whole process group, as a terminal's Ctrl-C does, while a child is running."""
    cmd = [sys.executable, str(HERE / "bench_e2e.py"), *SMALL, "--warmup", "0", "50", "50", "50",
           "--results-dir", str(tmp_path), "--out", "c"]
    proc = subprocess.Popen(cmd, cwd=HERE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    jsonl = tmp_path / "e2e" / "c.jsonl"
    deadline = time.time() + 60
    while time.time() < deadline and not (jsonl.exists() and jsonl.read_text().strip()):
        time.sleep(0.2)
    os.killpg(proc.pid, signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert "Traceback" not in err
    assert len(read_records(jsonl)) >= 1 and "interrupted" in err


def test_existing_results_are_not_overwritten(tmp_path):
    run_main(tmp_path, "--in-process")
    bench_e2e.main([*SMALL, "--in-process", "--results-dir", str(tmp_path), "--out", "t"])
    assert len(read_records(tmp_path / "e2e" / "t.jsonl")) == 1
    assert len(read_records(tmp_path / "e2e" / "t-2.jsonl")) == 1


def test_warmup_study_prints_rows_side_by_side(tmp_path, capsys):
    code, records = run_main(tmp_path, "--warmup", "0", "1", "2", "--in-process", "--dtype", "fp32", "bf16")
    assert [(r["config"]["dtype"], r["config"]["warmup"]) for r in records] == [
        ("fp32", 0), ("fp32", 1), ("fp32", 2), ("bf16", 0), ("bf16", 1), ("bf16", 2)]
    main, comparison = capsys.readouterr().out.split("## Comparison: fp32 vs bf16")
    rows = [line for line in table_lines(main) if "| tiny" in line]
    assert len(rows) == 1 + 6  # one config row, six result rows
    # fp32 beside bf16, one row per warm-up count (the warm-up is not a variant)
    assert [line.split("|")[3].strip() for line in table_lines(comparison) if "| tiny" in line] == ["0", "1", "2"]


def bad(*argv, env=None):
    base = {k: v for k, v in os.environ.items() if k != common.NVTX_LIBRARY_ENV}
    return subprocess.run([sys.executable, str(HERE / "bench_e2e.py"), *argv], cwd=HERE, capture_output=True,
                          text=True, timeout=60, env={**base, **(env or {})})


@pytest.mark.parametrize("argv,message", [
    (["--size", "huge"], "unknown preset 'huge'; valid presets in handout 2026: tiny, small"),
    (["--batch-size", "0"], "must be a positive integer"),
    (["--steps", "-3"], "must be a positive integer"),
    (["--size", "tiny", "--num-heads", "7"], "d_model (512) must be divisible by num_heads (7)"),
    (["--mode", "train", "--no-grad"], "--no-grad only applies to --mode forward"),
    (["--device", "cuda"], "CUDA is not available"),
    (["--nvtx", "--device", "cpu"], "--nvtx needs a CUDA device"),
    (["--tf32", "on", "--device", "cpu"], "--tf32 needs a CUDA device"),
    (["--dtype", "fp8"], "invalid choice"),
    (["--size", "2.7B"], "preset '2.7B' is in handout 2025's table, not in handout 2026's"),
    (["--handout", "2025", "--size", "small", "10B"], "preset '10B' is in handout 2026's table, not in handout 2025's"),
    (["--handout", "2024"], "argument --handout: invalid choice: '2024' (choose from"),
])
def test_bad_input_exits_2_with_one_line(argv, message):
    if torch.cuda.is_available() and argv[:2] == ["--device", "cuda"]:
        pytest.skip("CUDA present")
    result = bad(*argv)
    assert result.returncode == 2
    assert message in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and "Traceback" not in result.stderr


def test_nvtx_library_that_cannot_load_is_a_usage_error(tmp_path):
    env = {**os.environ, common.NVTX_LIBRARY_ENV: str(tmp_path / "libmissing.so")}
    result = subprocess.run([sys.executable, str(HERE / "bench_e2e.py"), "--nvtx", "--device", "cpu"], cwd=HERE,
                            capture_output=True, text=True, timeout=60, env=env)
    assert result.returncode == 2 and "BENCH_NVTX_LIBRARY=" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def test_compile_reports_compile_time_apart(tmp_path, capsys):
    code, (record,) = run_main(tmp_path, "--compile", "--in-process", "--mode", "forward", "--steps", "2")
    assert code == 0 and record["compile_s"] > 0
    # compilation happens in the compile step, so timed steps are far shorter than the compile step
    assert record["forward_ms_max"] < record["compile_s"] * 1e3
    assert "compile time (first step, not in the timings)" in capsys.readouterr().out


# ---- handouts and --dry-run ----


def test_a_bad_handout_in_the_environment_exits_2_with_one_line():
    result = bad("--size", "small", env={common.HANDOUT_ENV: "2024"})
    assert result.returncode == 2 and len(result.stderr.strip().splitlines()) == 1
    assert "CS336_HANDOUT='2024' is not a handout; valid handouts: 2026, 2025" in result.stderr


def test_size_names_and_the_default_context_follow_the_handout(monkeypatch):
    _, (run,) = bench_e2e.parse_args(["--size", "xl", "--device", "cpu"])
    assert (run.handout, run.context_length, run.model.d_model, run.model.num_layers) == ("2026", 512, 2560, 32)
    _, (run,) = bench_e2e.parse_args(["--size", "xl", "--handout", "2025", "--device", "cpu"])
    assert (run.handout, run.context_length, run.model.d_model, run.model.num_layers) == ("2025", 128, 1600, 48)
    monkeypatch.setenv(common.HANDOUT_ENV, "2025")  # read when the arguments are parsed, not at import
    _, runs = bench_e2e.parse_args(["--size", "all", "--device", "cpu"])
    assert [r.size for r in runs] == ["small", "medium", "large", "xl", "2.7B"]  # Table 1: no tiny, no 10B
    assert {(r.handout, r.context_length) for r in runs} == {("2025", 128)}
    _, runs = bench_e2e.parse_args(["--size", "all", "--handout", "2026", "--device", "cpu"])  # the flag wins
    assert [r.size for r in runs] == ["small", "medium", "large", "xl", "10B"]
    assert {r.context_length for r in runs} == {512}


def test_the_handout_is_in_the_tables_and_the_records(tmp_path, capsys):
    code, (record,) = run_main(tmp_path, "--in-process", "--handout", "2025", "--steps", "2", "--device", "cpu")
    out = capsys.readouterr().out
    assert code == 0 and record["config"]["handout"] == "2025"
    assert out.startswith("Model sizes from handout 2025 (Spring 2025):")
    assert "sizes from: handout 2025 (Spring 2025)" in out
    assert "sizes from: handout 2025" in (tmp_path / "e2e" / "t.md").read_text()


def test_dry_run_lists_the_plan_and_builds_nothing(tmp_path, capsys, monkeypatch):
    def forbidden(*args, **kwargs):
        raise AssertionError("--dry-run built a model or started a configuration")

    monkeypatch.setattr(runner, "TransformerLM", forbidden)
    monkeypatch.setattr(runner, "run_isolated", forbidden)
    monkeypatch.setattr(runner, "run_sweep", forbidden)
    code = bench_e2e.main(["--size", "small", "xl", "--dtype", "fp32", "bf16", "--device", "cpu", "--dry-run",
                           "--results-dir", str(tmp_path)])
    out = capsys.readouterr().out
    assert code == 0 and not (tmp_path / "e2e").exists()
    assert "Model sizes from handout 2026 (v26.1.1):" in out and "3,406,809,600" in out
    assert "dry run: 4 configurations would run" in out
    plan = [line.strip() for line in out.splitlines() if line.startswith("  ")]
    assert [line.split(" (predicted")[0] for line in plan] == [
        "1. small ctx=512 train fp32 naive warmup=5", "2. small ctx=512 train bf16 naive warmup=5",
        "3. xl ctx=512 train fp32 naive warmup=5", "4. xl ctx=512 train bf16 naive warmup=5"]
    # the training state of 2026's xl: 16 bytes per parameter (fp32 weights, gradients, two AdamW moments)
    assert f"(predicted state {16 * 3_406_809_600 / 2**30:.2f} GiB per rank" in plan[2]
