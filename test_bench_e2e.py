"""bench_e2e.py through its command line on tiny configurations (CPU)."""
import dataclasses
import math
import os
import re
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

import bench_e2e
import common
import e2e_tables
import model_config
import isolation
import parallel
import runner
import search
import stats
import sweep
from model import TransformerLM, cross_entropy
from model_config import forward_flops, get_config
from results import read_records

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


def paired_ratio(base, other, phase):
    """The speed-up from two records' raw samples, round by round: the Hodges-Lehmann estimate of base / other,
    the median over every pair of rounds i <= j of the mean of their log-ratios."""
    logs = [math.log(statistics.fmean(base[f"{phase}_ms"][a:b]) / statistics.fmean(other[f"{phase}_ms"][c:d]))
            for (a, b), (c, d) in zip(base["pairing"]["rounds"], other["pairing"]["rounds"])]
    return math.exp(statistics.median((x + y) / 2 for i, x in enumerate(logs) for y in logs[i:]))


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
    run = runner.RunConfig(size="custom", model=model_config.ModelConfig(32, 64, 1, 2, 64, 8), steps=1, warmup=0)
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
    assert abs(step - model_config.step_flops(cfg, 2, 64, "train")) / step < 0.01


def test_mfu_empty_on_cpu_and_computed_for_a_known_gpu(tmp_path):
    code, (record,) = run_main(tmp_path, "--in-process")
    assert record["mfu"] is None and record["peak_tflops"] is None
    run = bench_e2e.RunConfig(size="tiny", model=get_config("tiny", "2025"), handout="2025")  # context 128
    fake = {"step_ms": [100.0, 100.0], "forward_ms": [30.0, 30.0], "backward_ms": [60.0, 60.0],
            "optimizer_ms": [10.0, 10.0],
            "environment": {"device": "cuda:0", "device_name": "NVIDIA H100 80GB HBM3", "tf32_matmul": False}}
    figures = bench_e2e.derive_figures(run, fake)
    expected_tflops = model_config.step_flops(run.model, 4, 128, "train") / 0.1 / 1e12
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
    assert e2e_tables.table_row(record)["status"].startswith("NOISY")


def test_sweep_survives_an_oom_and_skips_larger_contexts(tmp_path, monkeypatch, capsys):
    # child processes (the default) inherit the fault injection through the environment
    monkeypatch.setenv(sweep.FAULT_ENV, "oom:context_length=32")
    code, records = run_main(tmp_path, "--context-length", "16", "32", "64", "--steps", "2", "--warmup", "0")
    assert code == 0
    assert [r["status"] for r in records][1:] == ["OOM", "skipped: OOM at ctx=32"]
    assert records[0]["status"] in ("ok", "noisy") and records[0]["step_ms_mean"] > 0
    assert records[1].get("step_ms") is None
    out = capsys.readouterr()
    assert "OOM" in out.out and "[2/3]" in out.err
    monkeypatch.setenv(sweep.FAULT_ENV, "error:context_length=16")
    code, records = bench_e2e.main([*SMALL, "--context-length", "16", "32", "--no-skip", "--in-process",
                                    "--results-dir", str(tmp_path), "--out", "u"]), read_records(tmp_path / "e2e" / "u.jsonl")
    assert records[0]["status"].startswith("error: RuntimeError: injected failure")
    assert records[1]["status"] in ("ok", "noisy")


def test_no_skip_runs_larger_contexts_after_oom(tmp_path, monkeypatch):
    monkeypatch.setenv(sweep.FAULT_ENV, "oom:context_length=16")
    code, records = run_main(tmp_path, "--context-length", "16", "32", "--in-process", "--no-skip")
    assert [r["status"] for r in records][0] == "OOM" and records[1]["status"] in ("ok", "noisy")


def test_interrupted_sweep_keeps_finished_records(tmp_path, monkeypatch):
    real = isolation.run_isolated
    calls = []

    def interrupt_on_third(fn, kwargs, in_process=False, timeout_s=None, on_heartbeat=None):
        calls.append(kwargs)
        if len(calls) == 4:  # the sweep's environment, then the configurations
            raise KeyboardInterrupt
        return real(fn, kwargs, in_process=True)

    monkeypatch.setattr(sweep, "run_isolated", interrupt_on_third)
    code, records = run_main(tmp_path, "--warmup", "0", "1", "2", "3")
    assert code == 130
    assert [r["config"]["warmup"] for r in records] == [0, 1]
    assert "step ms" in (tmp_path / "e2e" / "t.md").read_text()


def test_ctrl_c_on_a_real_sweep(tmp_path):
    """SIGINT to the whole process group, as a terminal's Ctrl-C does, while a child is running."""
    cmd = [sys.executable, str(HERE / "bench_e2e.py"), *SMALL, "--warmup", "0", "50", "50", "50",
           "--results-dir", str(tmp_path), "--out", "c"]
    # a terminal's process has SIGINT's default action; a suite started as a background job (`nohup ... &` in a
    # script) ignores SIGINT, and a child inherits that and would sleep through the Ctrl-C
    proc = subprocess.Popen(cmd, cwd=HERE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
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
    # the variants of one configuration are measured together: fp32 and bf16 of each warm-up count, in turn
    assert [(r["config"]["dtype"], r["config"]["warmup"]) for r in records] == [
        ("fp32", 0), ("bf16", 0), ("fp32", 1), ("bf16", 1), ("fp32", 2), ("bf16", 2)]
    assert len({r["pairing"]["group"] for r in records}) == 3
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
    # the one compile test: eager and compiled in one sweep (the bare --compile = on is checked at parse time)
    code, (eager, record) = run_main(tmp_path, "--compile", "off", "on", "--in-process", "--mode", "forward",
                                     "--steps", "2")
    assert code == 0 and record["compile_s"] > 0 and "compile_s" not in eager
    assert (eager["config"]["compile"], record["config"]["compile"]) == (False, True)
    # compilation happens in the compile step, so timed steps are far shorter than the compile step
    assert record["forward_ms_max"] < record["compile_s"] * 1e3
    out = capsys.readouterr().out
    assert "compile time (first step, not in the timings)" in out
    comparison = out.split("## Comparison: eager vs compiled (speed-ups over eager)")[1]
    (row,) = [line for line in table_lines(comparison) if "| tiny" in line]
    assert f"{paired_ratio(eager, record, 'forward'):.2f}x" in row


# ---- handouts and --dry-run ----


def test_a_bad_handout_in_the_environment_exits_2_with_one_line():
    result = bad("--size", "small", env={model_config.HANDOUT_ENV: "2024"})
    assert result.returncode == 2 and len(result.stderr.strip().splitlines()) == 1
    assert "CS336_HANDOUT='2024' is not a handout; valid handouts: 2026, 2025" in result.stderr


def test_size_names_and_the_default_context_follow_the_handout(monkeypatch):
    _, (run,) = bench_e2e.parse_args(["--size", "xl", "--device", "cpu"])
    assert (run.handout, run.context_length, run.model.d_model, run.model.num_layers) == ("2026", 512, 2560, 32)
    _, (run,) = bench_e2e.parse_args(["--size", "xl", "--handout", "2025", "--device", "cpu"])
    assert (run.handout, run.context_length, run.model.d_model, run.model.num_layers) == ("2025", 128, 1600, 48)
    monkeypatch.setenv(model_config.HANDOUT_ENV, "2025")  # read when the arguments are parsed, not at import
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
    monkeypatch.setattr(sweep, "run_isolated", forbidden)
    monkeypatch.setattr(sweep, "run_sweep", forbidden)
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


# ---- comparisons: --dtype / --compile / --attn ... variants side by side ----


def synthetic_record(ctx, dtype, means=None, status="ok"):
    """A finished record as the sweep makes it, with known phase times (ms): two equal samples per phase, so each
    mean is exact; `means` None = a failed row with `status`."""
    run = bench_e2e.RunConfig(size="tiny", model=get_config("tiny", context_length=ctx), dtype=dtype, warmup=0)
    record = {"experiment": "bench_e2e", "config": dataclasses.asdict(run), "label": run.label(), "status": status,
              "environment": {"device": "cpu", "device_name": "cpu", "torch": torch.__version__, "threads": 2}}
    if means is not None:
        for phase, ms in zip(("forward", "backward", "optimizer", "step"), means):
            record[f"{phase}_ms"] = [ms, ms]
        record.update(bench_e2e.derive_figures(run, record))
    return record


def test_comparison_speedups_come_from_the_rows_above():
    records = [synthetic_record(128, "fp32", (10.0, 20.0, 6.0, 36.0)),
               synthetic_record(128, "bf16", (4.0, 11.0, 5.0, 20.0)),
               synthetic_record(128, "fp16", status="OOM"),
               synthetic_record(256, "fp32", status="OOM"),
               synthetic_record(256, "bf16", (8.0, 16.0, 5.0, 29.0))]  # ctx 256 fp16: never ran
    report = e2e_tables.render_report(records, "github")
    main, comparison = report.split("## Comparison: fp32 vs bf16 vs fp16 (speed-ups over fp32)")
    header, _, *rows = table_lines(comparison)
    cells = [dict(zip([h.strip() for h in header.split("|")], [c.strip() for c in row.split("|")])) for row in rows]
    first, second = cells
    # each variant's means, side by side, as in the results table above
    results = {(line.split("|")[6].strip(), line.split("|")[7].strip()): line
               for line in table_lines(main.split("\ndevice: ")[1]) if "| tiny" in line and "OOM" not in line}
    assert set(results) == {("128", "fp32"), ("128", "bf16"), ("256", "bf16")}
    assert [first[f"{p} ms: fp32"] for p in ("fwd", "bwd", "opt", "step")] == ["10.00", "20.00", "6.00", "36.00"]
    assert [first[f"{p} ms: bf16"] for p in ("fwd", "bwd", "opt", "step")] == ["4.00", "11.00", "5.00", "20.00"]
    assert " 4.00 " in results[("128", "bf16")] and " 36.00 " in results[("128", "fp32")]
    # speed-ups over the first variant: fwd 10/4, fwd+bwd (10+20)/(4+11), step 36/20
    assert (first["fwd speed-up: bf16"], first["fwd+bwd speed-up: bf16"], first["step speed-up: bf16"]) == (
        "2.50x", "2.00x", "1.80x")
    # a failed variant shows its status, never a number; a missing one says so; no baseline, no ratio
    assert first["fwd ms: fp16"] == "OOM" and first["step speed-up: fp16"] == "OOM"
    assert second["fwd ms: fp32"] == "OOM" and second["step ms: bf16"] == "29.00"
    assert second["fwd speed-up: bf16"] == "baseline OOM" and second["fwd ms: fp16"] == "not run"
    # one variant: no comparison table, and no error
    single = [r for r in records if r["config"]["dtype"] == "fp32"]
    assert e2e_tables.comparison_table(single, "github") is None
    assert "## Comparison" not in e2e_tables.render_report(single, "github")


def test_forward_only_comparison_has_no_backward_columns(tmp_path, capsys):
    code, records = run_main(tmp_path, "--in-process", "--mode", "forward", "--attn", "naive", "sdpa",
                             "--steps", "2", "--warmup", "0")
    out = capsys.readouterr().out
    assert code == 0 and [r["config"]["attn"] for r in records] == ["naive", "sdpa"]
    main, comparison = out.split("## Comparison: naive vs sdpa (speed-ups over naive)")
    header = [line for line in table_lines(main) if "step ms" in line][0]
    assert " attn " in header  # the compared setting gets a column in the results table
    comparison_header = table_lines(comparison)[0]
    assert "fwd speed-up: sdpa" in comparison_header and "step speed-up: sdpa" in comparison_header
    assert "bwd" not in comparison_header and "fwd+bwd" not in comparison_header
    (row,) = [line for line in table_lines(comparison) if "| tiny" in line]
    assert f"{paired_ratio(*records, 'forward'):.2f}x" in row  # paired: the two ran interleaved, in one process
    assert "sdpa: 2 rounds, too few for a 95% interval (--steps 6 or more)" in row
    assert records[0]["pairing"]["group"] == records[1]["pairing"]["group"] and records[0]["pid"] == records[1]["pid"]


def test_a_slow_down_injected_into_one_variant_is_reported_as_drift(tmp_path, monkeypatch, capsys):
    # sdpa's timed steps run under the slow: fault (a sleep before every op): every phase slows, the optimizer too
    monkeypatch.setenv(sweep.FAULT_ENV, "slow:attn=sdpa")
    code, records = run_main(tmp_path, "--in-process", "--attn", "naive", "sdpa", "--steps", "4")
    comparison = capsys.readouterr().out.split("## Comparison: naive vs sdpa")[1]
    (row,) = [line for line in table_lines(comparison) if "| tiny" in line]
    moved = stats.drift(*records, "optimizer")
    assert code == 0 and moved is not None and moved.change > 0.3
    assert f"drift: optimizer changed by {moved.change:+.0%} (sdpa)" in row


def test_a_variant_that_fails_beside_the_others_is_measured_alone(tmp_path, monkeypatch):
    monkeypatch.setenv(sweep.FAULT_ENV, "oom:attn=sdpa")
    code, records = run_main(tmp_path, "--in-process", "--attn", "naive", "sdpa")
    assert code == 0 and records[0]["status"] in ("ok", "noisy") and records[1]["status"] == "OOM"
    assert all(r["interleave_fallback"] == "measured alone: the interleaved child failed (OOM)" for r in records)
    assert "pairing" in records[0]  # measured apart, but still a pair of one round each


def test_interleave_runs_alternates_whole_runs_and_pairs_them_by_repetition(tmp_path, capsys):
    code, records = run_main(tmp_path, "--interleave", "runs", "--repeats", "2", "--attn", "naive", "sdpa",
                             "--steps", "2", "--warmup", "0")
    err = capsys.readouterr().err
    starts = [line.split(" warmup=0")[0].split()[-1] + line.split("warmup=0")[1] for line in err.splitlines()
              if " starting " in line]
    assert code == 0 and starts == ["naive (repeat 1/2)", "sdpa (repeat 1/2)", "sdpa (repeat 2/2)",
                                    "naive (repeat 2/2)"]  # A B | B A
    for record in records:
        assert len(record["step_ms"]) == 4 and record["repeats"] == 2 and len(set(record["pids"])) == 2
        assert record["pairing"]["mode"] == "runs" and record["pairing"]["rounds"] == [[0, 2], [2, 4]]
    assert records[0]["pairing"]["group"] == records[1]["pairing"]["group"]
    comparison = e2e_tables.comparison(records)  # two repeats are two rounds: more repeats give an interval
    assert "sdpa: 2 rounds, too few for a 95% interval (--repeats 6 or more)" in comparison.rows[0]["notes"]
    assert "--repeats applies to --interleave runs" in parse_error(capsys, "--repeats", "3")


def test_compile_and_attn_are_sweep_axes():
    def runs(*argv):
        return bench_e2e.parse_args(["--device", "cpu", *argv])[1]

    assert [r.compile for r in runs()] == [False]
    assert [r.compile for r in runs("--compile")] == [True]  # the flag alone still means on
    assert [r.compile for r in runs("--compile", "on")] == [True]
    assert [r.compile for r in runs("--compile", "off", "on")] == [False, True]
    assert [r.compile for r in runs("--compile", "on", "off", "on")] == [True, False]  # first given = baseline
    assert [(r.dtype, r.compile, r.attn) for r in runs("--dtype", "fp32", "bf16", "--compile", "off", "on",
                                                      "--attn", "naive", "sdpa")][:3] == [
        ("fp32", False, "naive"), ("fp32", False, "sdpa"), ("fp32", True, "naive")]


def parse_error(capsys, *argv):
    with pytest.raises(SystemExit) as exc:
        bench_e2e.parse_args(["--device", "cpu", *argv])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and len(err.strip().splitlines()) == 1
    return err


@pytest.mark.parametrize("argv,message", [
    (["--compile", "maybe"], "argument --compile: invalid choice: 'maybe' (choose from 'off', 'on')"),
    (["--attn", "flash"], "argument --attn: invalid choice: 'flash' (choose from 'naive', 'sdpa')"),
    (["--context-length", "max", "512"], "give max or numbers, not both (got max 512)"),
    (["--context-length", "256", "max"], "give max or numbers, not both (got 256 max)"),
    (["--context-length", "most"], "must be a positive integer or max, got 'most'"),
    (["--max-context", "1024"], "--max-context only applies to --context-length max"),
    (["--context-length", "max", "--max-context", "64"], "--max-context must be at least 128"),
    (["--context-length", "max", "--in-process"], "drop --in-process"),
    (["--context-length", "max", "--no-skip"], "a search ends at its first failure"),
    (["--context-length", "max", "--warmup", "0", "--steps", "1"], "needs --warmup + --steps >= 2"),
    (["--context-length", "max", "--warmup", "1", "5"], "--context-length max takes one --warmup value"),
    (["--world-size", "8", "--dry-run"], "--world-size only applies to --parallel"),
    (["--parallel", "fsdp", "--world-size", "8"], "--world-size only plans a --parallel run with --dry-run"),
])
def test_bad_comparison_and_search_input_exits_2_with_one_line(capsys, argv, message):
    assert message in parse_error(capsys, *argv)


def test_fsdp_on_the_cpu_with_torch_2_6_exits_2_with_one_line(capsys, monkeypatch):
    monkeypatch.setattr(common, "TORCH_VERSION", (2, 6))
    assert "--parallel fsdp: FSDP2 on the CPU needs torch 2.7 or later" in parse_error(capsys, "--parallel", "fsdp")


def test_world_size_is_refused_under_torchrun(capsys, monkeypatch):
    for key, value in {"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "2"}.items():
        monkeypatch.setenv(key, value)
    assert "--world-size plans without torchrun" in parse_error(capsys, "--parallel", "ddp", "--world-size", "8",
                                                                "--dry-run")


# ---- --context-length max ----


def test_context_search_answers_from_the_probe_records():
    def search(statuses, cap=4096, dtype="fp32"):
        out = []
        for i, status in enumerate(statuses):
            rec = synthetic_record(128 << i, dtype, (1.0, 2.0, 1.0, 4.0) if status == "ok" else None, status)
            rec["context_search"] = {"max_context": cap}
            out.append(rec)
        return out

    cases = {"fp32": search(["ok", "ok", "OOM"]), "bf16": search(["OOM"], dtype="bf16"),
             "fp16": search(["ok", "error: RuntimeError: boom"], dtype="fp16")}
    answers = {a["config"]["dtype"]: a for a in e2e_tables.context_searches(
        cases["fp32"] + cases["bf16"] + cases["fp16"])}
    assert (answers["fp32"]["longest_context"], answers["fp32"]["conclusive"]) == (256, True)
    assert answers["fp32"]["answer"] == "the longest that fits: 512 runs out of memory"
    assert answers["fp32"]["config"]["model"]["context_length"] == 256  # the config that fits
    assert [p["context_length"] for p in answers["fp32"]["probes"]] == [128, 256, 512]
    assert (answers["bf16"]["longest_context"], answers["bf16"]["answer"]) == (None, "none: OOM already at 128")
    assert (answers["fp16"]["longest_context"], answers["fp16"]["conclusive"]) == (128, False)
    assert answers["fp16"]["answer"].startswith("inconclusive: 256 failed with an error")
    (capped,) = e2e_tables.context_searches(search(["ok", "ok"], cap=300))  # 256 is the last power of two <= 300
    assert (capped["longest_context"], capped["conclusive"]) == (256, False)
    assert capped["answer"] == "at least this: the search stops at --max-context 300"
    (interrupted,) = e2e_tables.context_searches(search(["ok", "ok"], cap=4096))
    assert interrupted["answer"] == "incomplete: the search was interrupted"
    (timed_out,) = e2e_tables.context_searches(search(["ok", "timeout after 900 s"]))
    assert timed_out["longest_context"] == 128 and "timed out" in timed_out["answer"] and not timed_out["conclusive"]
    # the table: one row per search, with the step time at the longest context
    table = e2e_tables.search_table(cases["fp32"] + cases["bf16"], "github")
    row = [cell.strip() for cell in [line for line in table_lines(table) if "| fp32" in line][0].split("|")]
    assert row[5:8] == ["256", "4.00", "512: OOM"]  # longest ctx, its step ms, the probe that ended the search
    assert e2e_tables.search_table([synthetic_record(128, "fp32", (1.0, 1.0, 1.0, 3.0))], "github") is None


def test_max_context_search_doubles_to_the_first_oom_then_bisects_to_the_resolution(tmp_path, monkeypatch, capsys):
    # a fake device: in train mode every context from 330 up runs out of memory; forward mode from 1024 up
    monkeypatch.setenv(sweep.FAULT_ENV, "oom:context_length>=330,mode=train;oom:context_length>=1024,mode=forward")
    code, records = run_main(tmp_path, "--context-length", "max", "--max-context", "65536", "--warmup", "1",
                             "--steps", "1")
    assert code == 0
    probes, (answer,) = records[:-1], records[-1:]
    # doubling to the first OOM (nothing beyond it runs), then bisecting between 256 and 512 to a multiple of 64
    assert [(r["config"]["model"]["context_length"], r["status"], r["search_probe"]) for r in probes] == [
        (128, "ok", "doubling"), (256, "ok", "doubling"), (512, "OOM", "doubling"),
        (384, "OOM", "bisection"), (320, "ok", "bisection")]
    pids = [r["pid"] for r in probes]
    assert len(set(pids)) == 5 and os.getpid() not in pids  # each probe in a child process of its own
    assert (answer["kind"], answer["longest_context"], answer["longest_power_of_two"], answer["first_oom"],
            answer["conclusive"]) == ("longest_context", 320, 256, 384, True)
    assert answer["answer"] == ("the longest that fits, to within 64: 384 runs out of memory (the longest power of "
                                "two: 256)")
    out = capsys.readouterr()
    assert ("## Longest context that runs (powers of two from 128 up to --max-context 65536, then after an OOM a "
            "bisection to a multiple of 64)") in out.out
    assert "[3/3] tiny ctx=512" in out.err and "[5/5] tiny ctx=320" in out.err  # the count follows the search
    # the saved run re-renders to the same report, from its records alone (the answer record included)
    saved = (tmp_path / "e2e" / "t.md").read_text()
    assert e2e_tables.render_report(read_records(tmp_path / "e2e" / "t.jsonl"), "github") == saved.rstrip("\n")
    (row,) = [line for line in table_lines(saved.split("## Longest context")[1]) if "| tiny" in line]
    assert [cell.strip() for cell in row.split("|")][5:7] == ["320", "256"]  # the bisected answer and the doubling's

    # --search-probes 0: doubling only, the longest power of two
    code = bench_e2e.main([*SMALL, "--context-length", "max", "--mode", "forward", "--warmup", "0", "--steps", "1",
                           "--max-context", "4096", "--search-probes", "0", "--results-dir", str(tmp_path),
                           "--out", "f"])
    records = read_records(tmp_path / "e2e" / "f.jsonl")
    assert [r["config"]["model"]["context_length"] for r in records[:-1]] == [128, 256, 512, 1024]
    assert records[-1]["longest_context"] == 512 and records[-1]["config"]["mode"] == "forward"
    assert records[-1]["answer"] == "between 512 and 1024: the bisection spent its budget of 0 probes (--search-probes)"


def test_the_bisection_stops_at_its_resolution_or_its_budget():
    bisection = search.Bisection(fits=256, fails=512, resolution=64, budget=8)
    tried = []
    while (size := bisection.next_size()) is not None:
        tried.append(size)
        bisection.record(size, fits=size < 400)  # the fake limit: 399
    assert tried == [384, 448] and (bisection.fits, bisection.fails) == (384, 448) and bisection.resolved
    assert search.Bisection(fits=1024, fails=2048, resolution=64, budget=2).next_size() == 1536
    spent = search.Bisection(fits=1024, fails=2048, resolution=64, budget=2)
    for _ in range(2):
        spent.record(spent.next_size(), fits=True)
    assert spent.next_size() is None and not spent.resolved  # budget spent before the resolution was reached
    assert search.Bisection(fits=128, fails=192, resolution=64).next_size() is None  # already within it
    # the answer when the budget ran out, and when a bisection probe failed with an error
    probes = [{"context_length": n, "status": s} for n, s in ((128, "ok"), (256, "ok"), (512, "OOM"), (384, "ok"))]
    assert search.answer(probes, 4096, 64, 1)["answer"] == (
        "between 384 and 512: the bisection spent its budget of 1 probes (--search-probes)")
    probes.append({"context_length": 448, "status": "error: RuntimeError: boom"})
    found = search.answer(probes, 4096, 64, 8)
    assert not found["conclusive"] and found["longest_context"] == 384
    assert found["answer"] == ("inconclusive: 448 failed with an error, not an OOM (see its row); the limit lies "
                               "between 384 and 512")


def test_dry_run_shows_the_probes_and_the_comparison(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(sweep, "run_sweep", lambda *a, **k: pytest.fail("--dry-run ran the sweep"))
    code = bench_e2e.main(["--size", "xl", "--device", "cpu", "--context-length", "max", "--max-context", "1024",
                           "--dtype", "fp32", "bf16", "--dry-run", "--results-dir", str(tmp_path)])
    out = capsys.readouterr().out
    assert code == 0 and not (tmp_path / "e2e").exists()
    assert "dry run: at most 8 configurations would run" in out
    plan = [line.strip().split(" (predicted")[0] for line in out.splitlines() if line.startswith("  ")]
    assert plan[:5] == ["1. xl ctx=128 train fp32 naive warmup=5", "2. xl ctx=256 train fp32 naive warmup=5",
                        "3. xl ctx=512 train fp32 naive warmup=5", "4. xl ctx=1024 train fp32 naive warmup=5",
                        "5. xl ctx=128 train bf16 naive warmup=5"]
    flat = " ".join(out.split())
    assert "then a comparison table: fp32 vs bf16, one row per size and context, speed-ups over fp32" in flat
    assert "context search: 2 searches" in flat and "each trying ctx 128, 256, 512, 1024 in turn" in flat
    # the CPU's default cap, and what it would be on CUDA
    bench_e2e.main(["--size", "tiny", "--device", "cpu", "--context-length", "max", "--dry-run"])
    flat = " ".join(capsys.readouterr().out.split())
    assert "or after 4096 (--max-context 4096; the default on a CPU; on CUDA 131072)" in flat


def test_dry_run_plans_a_parallel_run_without_torchrun(capsys):
    assert bench_e2e.main(["--size", "10B", "--parallel", "fsdp", "--world-size", "8", "--dry-run"]) == 0
    plan = [line for line in capsys.readouterr().out.splitlines() if line.startswith("  ")]
    state = parallel.state_bytes_per_rank(get_config("10B"), "fsdp", 8, "train")["state_bytes"]
    assert f"{state / 2**30:.2f}" == "23.90"  # docs/bench_e2e.md quotes it
    assert plan == ["  1. 10B ctx=512 train fp32 naive warmup=5 fsdp x8 (predicted state 23.90 GiB per rank, "
                    "activations aside)"]

# ---- tables that fit a page, figures after the run ----


def test_columns_choose_and_order_the_results_table(tmp_path, capsys):
    code, _ = run_main(tmp_path, "--in-process", "--columns", "ctx", "size", "step ms")
    out = capsys.readouterr().out
    assert code == 0
    results_header = [line for line in table_lines(out) if "step ms" in line][0]
    assert [c.strip() for c in results_header.strip("|").split("|")] == ["ctx", "size", "step ms"]
    assert results_header in (tmp_path / "e2e" / "t.md").read_text()  # the saved report has the same table


def test_unknown_column_lists_the_valid_ones_before_anything_runs(tmp_path, capsys):
    with pytest.raises(SystemExit) as exc:
        bench_e2e.main([*SMALL, "--results-dir", str(tmp_path), "--columns", "size", "step_ms"])
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--columns: unknown column 'step_ms'; valid columns: size, d_model" in err[-1]
    assert "step ms" in err[-1] and not (tmp_path / "e2e").exists()  # nothing ran, nothing was written


def test_latex_goes_to_a_tex_file_and_the_md_stays_markdown(tmp_path, capsys):
    code, _ = run_main(tmp_path, "--in-process", "--fmt", "latex_booktabs")
    out = capsys.readouterr().out
    assert code == 0
    md, tex = (tmp_path / "e2e" / "t.md").read_text(), (tmp_path / "e2e" / "t.tex").read_text()
    assert "\\begin{tabular}" not in md  # the whole markdown report, model shape included
    assert "d_model" in [line for line in table_lines(md) if "step ms" in line][0]
    config_table, results_table = re.findall(r"\\begin\{tabular\}.*?\\end\{tabular\}", tex, re.S)
    assert "d\\_model" in config_table and "step ms" in results_table
    assert "d\\_model" not in results_table and "layers" not in results_table  # compact: the shape is above
    assert results_table in out and f"wrote {tmp_path / 'e2e' / 't.md'} and {tmp_path / 'e2e' / 't.tex'}" in out


def test_plot_after_the_run_and_a_clear_note_without_matplotlib(tmp_path, capsys, monkeypatch):
    code, _ = run_main(tmp_path, "--in-process", "--plot")
    assert code == 0
    png = tmp_path / "e2e" / "t_phases.png"
    assert png.stat().st_size > 10_000 and f"and {png}" in capsys.readouterr().out
    import figures
    monkeypatch.setattr(figures, "matplotlib_missing", lambda: "--plot needs matplotlib, which is not installed")
    code = bench_e2e.main([*SMALL, "--results-dir", str(tmp_path), "--out", "u", "--in-process", "--plot"])
    captured = capsys.readouterr()
    assert code == 0 and "note: no figures: --plot needs matplotlib" in captured.err
    assert len(read_records(tmp_path / "e2e" / "u.jsonl")) == 1 and not list((tmp_path / "e2e").glob("u_*.png"))
