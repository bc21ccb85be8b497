"""bench_e2e.py on tiny configurations (CPU): the timed step, its records and tables, comparisons interleaved on
every axis (models included), failures as rows, the longest-context search, Ctrl-C, bad input. The models below
(model_a, oom_model, ...) are plugged in as a student's own: --model NAME=test_bench_e2e:CALLABLE."""
import contextlib
import dataclasses
import errno
import json
import math
import os
import signal
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

import bench_attention
import bench_e2e
import common
import leaderboard
import report
import model
import parallel
import results
import runner
from results import forward_flops, get_config
from results import read_records
from conftest import TINY_CALIBRATION

HERE = Path(__file__).resolve().parent
SMALL = ["--device", "cpu", "--size", "tiny", "--num-layers", "1", "--d-model", "64", "--num-heads", "4",
         "--d-ff", "128", "--vocab-size", "256", "--context-length", "16", "--steps", "3", "--warmup", "1"]
LONG_CAUSE = "the keyword rope_theta is called theta in this model; " * 8  # ~460 characters, one line


# ---- models a student would plug in ----

CALLS = []  # (model tag, autocast dtype or fp32) of every forward of a TransformerLM in this process


def tagged(tag, **kw):
    m = model.TransformerLM(results.ModelConfig(kw["d_model"], kw["d_ff"], kw["num_layers"], kw["num_heads"],
                                                     kw["vocab_size"], kw["context_length"]))
    m.tag = tag
    return m


def model_a(**kw):
    return tagged("a", **kw)


def model_b(**kw):
    return tagged("b", **kw)


def narrow(**kw):  # half our d_ff: fewer parameters than the sizes table counts for ours
    return tagged("narrow", **{**kw, "d_ff": kw["d_ff"] // 2})


def oom_from_ctx_32(**kw):
    if kw["context_length"] >= 32:
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
    return tagged("small", **kw)


def long_error(**kw):
    raise ValueError(LONG_CAUSE)


@pytest.fixture
def recorded(monkeypatch):
    real = model.TransformerLM.forward

    def forward(self, tokens):
        dtype = torch.get_autocast_dtype("cpu") if torch.is_autocast_enabled("cpu") else torch.float32
        CALLS.append((getattr(self, "tag", "ours"), {torch.float32: "fp32", torch.bfloat16: "bf16"}[dtype]))
        return real(self, tokens)

    CALLS.clear()
    monkeypatch.setattr(model.TransformerLM, "forward", forward)
    return CALLS


def run_main(tmp_path, *extra, out="t"):
    code = bench_e2e.main([*SMALL, "--results-dir", str(tmp_path), "--out", out, *extra])
    return code, read_records(tmp_path / "e2e" / f"{out}.jsonl")


def table_lines(text):
    return [line for line in text.splitlines() if line.startswith("|")]


def cells(table_text, header_word):
    """The rows of the markdown table whose header holds `header_word`, as dicts."""
    lines = table_lines(table_text)
    start = next(i for i, line in enumerate(lines) if f" {header_word} " in line)
    header = [h.strip() for h in lines[start].strip("|").split("|")]
    rows = []
    for line in lines[start + 2:]:
        if line.startswith("|--") or line.count("|") != lines[start].count("|"):
            break
        rows.append(dict(zip(header, [c.strip() for c in line.strip("|").split("|")])))
    return rows


def paired_ratio(base, other, phase):
    """The speed-up from two records' raw samples, round by round: the Hodges-Lehmann estimate of base / other."""
    logs = [math.log(statistics.fmean(base[f"{phase}_ms"][a:b]) / statistics.fmean(other[f"{phase}_ms"][c:d]))
            for (a, b), (c, d) in zip(base["pairing"]["rounds"], other["pairing"]["rounds"])]
    return math.exp(statistics.median((x + y) / 2 for i, x in enumerate(logs) for y in logs[i:]))


# ---- the timed step ----


@pytest.mark.parametrize("mode,extra,phases", [
    ("forward", ["--no-grad", "--steps", "5"], ["forward"]),
    ("forward-backward", ["--steps", "5"], ["forward", "backward"]),
    ("train", ["--steps", "5"], ["forward", "backward", "optimizer"]),
])
def test_each_mode_times_its_phases_and_they_add_up_to_the_step(tmp_path, capsys, mode, extra, phases):
    code, (record,) = run_main(tmp_path, "--mode", mode, "--in-process", *extra)
    assert code == 0 and record["status"] in ("ok", "noisy") and record["config"]["mode"] == mode
    steps = len(record["step_ms"])
    for phase in phases + ["step"]:
        assert len(record[f"{phase}_ms"]) == steps and record[f"{phase}_ms_mean"] > 0  # every raw sample kept
    assert not any(f"{p}_ms" in record for p in {"forward", "backward", "optimizer"} - set(phases))
    # the phases are back to back inside the step's timer: their sum is within each step, and in the least
    # disturbed step (a loaded machine preempts some) it is nearly all of it
    gaps = [record["step_ms"][i] - sum(record[f"{p}_ms"][i] for p in phases) for i in range(steps)]
    assert all(gap >= -1e-4 * step for gap, step in zip(gaps, record["step_ms"]))
    assert min(gap / step for gap, step in zip(gaps, record["step_ms"])) <= 0.1
    out = capsys.readouterr().out
    (row,) = cells(out, "step ms")
    assert row["dtype"] == "fp32" and "compile" not in row and ("opt ms" in row) == (mode == "train")
    floors = cells(out, "floor ms")  # a CPU: the measured ceiling (the tests' seeded file), every phase and the step
    assert [f["phase"] for f in floors] == [report.E2E_PHASE_SHORT[p] for p in phases] + ["step"] * (len(phases) > 1)
    assert all(f["of floor"].endswith("%") and f["bound"] in ("compute", "memory", "mixed") and
               f["ceiling"] == "measured" for f in floors)


def test_run_step_times_each_phase_between_two_synchronisations(monkeypatch):
    run = runner.RunConfig(size="custom", model=results.ModelConfig(32, 64, 1, 2, 64, 8), steps=1, warmup=0)
    work = runner.Workload(run)
    order = []

    @contextlib.contextmanager
    def annotate(name):  # the phase's range: its timer runs inside it
        order.append(name)
        yield
        order.append("/" + name)

    monkeypatch.setattr(common, "synchronize", lambda device: order.append("sync"))
    monkeypatch.setattr(runner, "annotate", annotate)
    times = runner.run_step(work)
    assert order == ["sync", "forward", "sync", "sync", "/forward", "backward", "sync", "sync", "/backward",
                     "optimizer", "sync", "sync", "/optimizer", "sync"]
    assert set(times) == {"forward", "backward", "optimizer", "step"}


def test_flops_formula_matches_flop_counter():
    cfg = get_config("tiny", num_layers=2, context_length=64)
    lm = model.TransformerLM(cfg)  # naive attention: its matmuls are what the formula counts
    tokens = torch.randint(0, cfg.vocab_size, (2, 64))
    with FlopCounterMode(display=False) as fwd:
        loss = model.cross_entropy(lm(tokens), tokens)
    with FlopCounterMode(display=False) as bwd:
        loss.backward()
    assert fwd.get_total_flops() == pytest.approx(forward_flops(cfg, 2, 64), rel=0.01)
    step = fwd.get_total_flops() + bwd.get_total_flops()
    assert step == pytest.approx(results.step_flops(cfg, 2, 64, "train"), rel=0.01)


def test_mfu_only_for_a_known_peak():
    run = runner.RunConfig(size="tiny", model=get_config("tiny", "2025"), handout="2025")  # context 128
    fake = {"step_ms": [100.0, 100.0], "forward_ms": [30.0, 30.0], "backward_ms": [60.0, 60.0],
            "optimizer_ms": [10.0, 10.0], "environment": {"device": "cpu", "device_name": "cpu"}}
    assert runner.derive_figures(run, fake)["mfu"] is None  # a CPU has no peak: no MFU rather than a guess
    fake["environment"] = {"device": "cuda:0", "device_name": "NVIDIA H100 80GB HBM3", "tf32_matmul": False}
    tflops = results.step_flops(run.model, 4, 128, "train") / 0.1 / 1e12
    assert runner.derive_figures(run, fake)["mfu"] == pytest.approx(tflops / 67.0)  # fp32 without TF32
    fake["environment"]["tf32_matmul"] = True
    assert runner.derive_figures(run, fake)["mfu"] == pytest.approx(tflops / 494.7)
    fake["environment"]["device_name"] = "Some Future GPU"
    assert runner.derive_figures(run, fake)["mfu"] is None
    assert runner.derive_figures(run, fake, peak_override=100.0)["mfu"] == pytest.approx(tflops / 100)


def test_each_phase_floor_is_flops_over_peak_or_bytes_over_bandwidth_whichever_is_larger():
    run = bench_e2e.RunConfig(size="tiny", model=get_config("tiny", "2025"), handout="2025", dtype="bf16")
    cfg, fake = run.model, {"step_ms": [100.0], "forward_ms": [30.0], "backward_ms": [60.0], "optimizer_ms": [10.0],
                            "environment": {"device": "cpu", "device_name": "cpu"}, "model_num_params": 1000}
    measured = {"matmul_tflops": {"fp32": 0.05, "bf16": 0.01}, "copy_gbs": 20.0}
    floors = bench_e2e.derive_figures(run, fake, measured=measured)["floors"]
    assert floors["roofs"]["ceiling"] == "measured" and floors["roofs"]["tflops"] == 0.01  # bf16's own peak
    phases = floors["phases"]
    forward_bytes = 4 * cfg.matmul_params + 2 * results.saved_activations(cfg, 4, 128, "naive")  # bf16: 2 bytes
    assert phases["forward"]["bytes"] == forward_bytes and phases["forward"]["flops"] == forward_flops(cfg, 4, 128)
    assert phases["forward"]["compute_ms"] == pytest.approx(forward_flops(cfg, 4, 128) / 0.01e12 * 1e3)
    assert phases["forward"]["memory_ms"] == pytest.approx(forward_bytes / 20e9 * 1e3)
    assert phases["backward"]["compute_ms"] == pytest.approx(2 * phases["forward"]["compute_ms"])
    assert phases["backward"]["bytes"] == forward_bytes + 4 * cfg.num_params  # + every fp32 gradient written
    for f in (phases[p] for p in results.PHASES_BY_MODE["train"]):
        assert f["floor_ms"] == max(f["compute_ms"] or 0, f["memory_ms"])
        assert f["bound"] == ("compute" if (f["compute_ms"] or 0) > f["memory_ms"] else "memory")
    # the optimizer: AdamW's 28 bytes per parameter of the model as built (yours: its own count) over the bandwidth
    assert phases["optimizer"]["memory_ms"] == pytest.approx(28 * 1000 / 20e9 * 1e3)
    assert phases["optimizer"]["of_floor"] == pytest.approx(phases["optimizer"]["floor_ms"] / 10.0)
    assert phases["step"]["floor_ms"] == pytest.approx(sum(phases[p]["floor_ms"] for p in results.PHASES_BY_MODE["train"]))
    # a GPU the datasheets name: their figures, the measured ones kept for the roofline
    fake["environment"] = {"device": "cuda:0", "device_name": "NVIDIA H100 80GB HBM3", "tf32_matmul": False}
    floors = bench_e2e.derive_figures(run, fake, measured=measured)["floors"]
    assert (floors["roofs"]["tflops"], floors["roofs"]["gbs"], floors["roofs"]["ceiling"]) == (989.4, 3350.0,
                                                                                               "datasheet")
    assert floors["phases"]["optimizer"]["memory_ms"] == pytest.approx(28 * 1000 / 3350e9 * 1e3)
    # naive attention's probabilities: bytes that SDPA does not move
    sdpa = bench_e2e.derive_figures(dataclasses.replace(run, attn="sdpa"), fake)["floors"]["phases"]
    assert forward_bytes - sdpa["forward"]["bytes"] == 2 * cfg.num_layers * cfg.num_heads * 4 * 128 * 128


def test_noisy_and_single_step_rows_say_so():
    run = runner.RunConfig(size="tiny", model=get_config("tiny"), mode="forward")
    jumpy = {"forward_ms": [10.0, 30.0, 10.0], "step_ms": [10.0, 30.0, 10.0], "environment": {"device": "cpu"}}
    record = {**jumpy, **runner.derive_figures(run, jumpy), "status": "noisy", "config": dataclasses.asdict(run)}
    assert record["noisy"] == ["forward 69%", "step 69%"]
    assert report.e2e_row(record)["status"] == "NOISY cv>10%: forward 69%, step 69%"
    one = {"forward_ms": [10.0], "step_ms": [10.0], "environment": {"device": "cpu"}}
    figures = runner.derive_figures(run, one)
    assert figures["step_ms_std"] is None and figures["note"] == "1 timed step: no std"


def test_compile_step_is_timed_apart_and_compile_is_its_own_column(tmp_path, capsys):
    """The suite's inductor compile of a training step (forward and backward graphs), checked against eager."""
    code, (eager, compiled) = run_main(tmp_path, "--compile", "off", "on", "--in-process", "--mode", "train",
                                       "--steps", "2")
    assert code == 0 and compiled["compile_s"] > 0 and "compile_s" not in eager
    assert compiled["forward_ms_max"] < compiled["compile_s"] * 1e3  # the compile happened in its own step
    out = capsys.readouterr().out
    assert "compile time (first step, not in the timings)" in out
    assert [(r["dtype"], r["compile"]) for r in cells(out, "step ms")] == [("fp32", ""), ("fp32", "on")]
    (row,) = cells(out.split("## Comparison: eager vs compiled")[1], "ctx")
    assert row["fwd speed-up: compiled"] == f"{paired_ratio(eager, compiled, 'forward'):.2f}x"


# ---- comparisons: interleaved on every axis ----


def test_a_model_comparison_is_interleaved_a_b_b_a_and_named(tmp_path, capsys, recorded):
    code, records = run_main(tmp_path, "--in-process", "--model", "a=test_bench_e2e:model_a",
                             "b=test_bench_e2e:model_b", "--steps", "2", "--warmup", "1")
    assert code == 0 and [tag for tag, _ in recorded] == ["a", "b", "a", "b", "b", "a"]  # warm-ups, then timed
    assert [r["config"]["model_name"] for r in records] == ["a", "b"]
    assert records[0]["pairing"]["group"] == records[1]["pairing"]["group"]
    out = capsys.readouterr().out
    assert [r["model"] for r in cells(out, "step ms")] == ["a", "b"]
    assert "## Comparison: a vs b (speed-ups over a)" in out and "test_bench_e2e:model_a" not in out.split("|")[-1]


def test_your_model_shows_its_own_parameter_count_and_ours_is_named_ours_in_both_tables(tmp_path, capsys):
    code, records = run_main(tmp_path, "--in-process", "--model", "ours", "mine=test_bench_e2e:narrow", "--steps",
                             "2", "--warmup", "0")
    ours, mine = (results.ModelConfig(64, d_ff, 1, 4, 256, 16).num_params for d_ff in (128, 64))
    assert code == 0 and [r["model_num_params"] for r in records] == [ours, mine]
    out = capsys.readouterr().out
    assert [(r["model"], r["params"]) for r in cells(out, "step ms")] == [("ours", ""), ("mine", f"{mine:,}")]
    assert cells(out, "d_model")[0]["params (model.TransformerLM)"] == f"{ours:,}"  # the sizes table: ours, named
    assert "## Comparison: ours vs mine" in out and "step ms: ours |" in out  # as docs/bench_e2e.md says


def test_a_dtype_comparison_is_interleaved_a_b_b_a(tmp_path, recorded):
    code, _ = run_main(tmp_path, "--in-process", "--model", "a=test_bench_e2e:model_a", "--dtype", "fp32", "bf16",
                       "--steps", "2", "--warmup", "1")
    assert code == 0 and [dtype for _, dtype in recorded][2:] == ["fp32", "bf16", "bf16", "fp32"]


def fake_variant(name, calls, resident=0, transient=0, allocator=None, steps=12, step_s=0.001):
    """A Workload builder for measure_interleaved whose step notes its variant in `calls` and claims `step_s`; with
    `allocator` (a fake CUDA allocator) it holds `resident` bytes and each step allocates `transient` more."""
    def prepare():
        calls.append(f"build {name}")
        if allocator is not None:
            allocator["now"] += resident

        def step():
            calls.append(name)
            if allocator is not None:
                allocator["peak"] = max(allocator["peak"], allocator["now"] + transient)
            return {"forward": step_s / 2, "step": step_s}
        run = SimpleNamespace(warmup=1, steps=steps, compile=False, profile_results_dir=None, flops="formula")
        return SimpleNamespace(step=step, device=torch.device("cpu"), run=run, model=torch.nn.Module())
    return prepare


def test_interleaved_variants_warm_up_alone_then_alternate_in_blocks():
    calls = []
    records = bench_e2e.measure_interleaved(torch.device("cpu"), [fake_variant("A", calls), fake_variant("B", calls)])
    assert calls[:4] == ["build A", "A", "build B", "B"]  # each built and warmed up on its own, in turn
    # 1 ms steps: blocks of 2 (5 ms wanted, but 12 steps must leave the 6 rounds of a 95% interval): A B | B A | ...
    assert "".join(c for c in calls[4:] if c in "AB") == "AABBBBAA" * 3
    for record in records:
        assert len(record["step_ms"]) == 12 and record["pairing"]["rounds"] == [[i, i + 2] for i in range(0, 12, 2)]


def test_each_interleaved_variant_keeps_its_own_peak_memory(monkeypatch):
    """On CUDA a variant's peak is what it holds plus what its own steps allocate, as if it ran alone (a fake
    allocator stands in for CUDA's counters)."""
    allocator = {"now": 1000, "peak": 1000}
    monkeypatch.setattr(bench_e2e, "allocated_bytes", lambda device: allocator["now"])
    monkeypatch.setattr(bench_e2e, "reset_peak_memory", lambda device: allocator.update(peak=allocator["now"]))
    monkeypatch.setattr(bench_e2e, "peak_memory_bytes", lambda device: {"peak_mem_allocated_bytes": allocator["peak"]})
    monkeypatch.setattr(runner, "environment", lambda device: {"device": str(device)})
    monkeypatch.setattr(runner, "machine_load", lambda device: {})
    records = bench_e2e.measure_interleaved(torch.device("cuda"), [
        fake_variant("A", [], resident=100, transient=50, allocator=allocator),
        fake_variant("B", [], resident=300, transient=20, allocator=allocator)])
    assert [r["peak_mem_allocated_bytes"] for r in records] == [150, 320]


def synthetic_record(ctx, dtype, means=None, status="ok"):
    """A record as the sweep makes it with known phase times (ms, two equal samples); means None = failed."""
    run = runner.RunConfig(size="tiny", model=get_config("tiny", context_length=ctx), dtype=dtype, warmup=0)
    record = {"experiment": "bench_e2e", "config": dataclasses.asdict(run), "label": run.label(), "status": status,
              "environment": {"device": "cpu", "device_name": "cpu", "torch": torch.__version__, "threads": 2}}
    if means is not None:
        for phase, ms in zip(("forward", "backward", "optimizer", "step"), means):
            record[f"{phase}_ms"] = [ms, ms]
        record.update(runner.derive_figures(run, record))
    return record


def test_comparison_speedups_come_from_the_rows_above():
    records = [synthetic_record(128, "fp32", (10.0, 20.0, 6.0, 36.0)),
               synthetic_record(128, "bf16", (4.0, 11.0, 5.0, 20.0)),
               synthetic_record(128, "fp16", status="OOM"),
               synthetic_record(256, "fp32", status="OOM"),
               synthetic_record(256, "bf16", (8.0, 16.0, 5.0, 29.0))]  # ctx 256 fp16: never ran
    text = report.render_e2e(records, "github")
    first, second = cells(text.split("## Comparison: fp32 vs bf16 vs fp16 (speed-ups over fp32)")[1], "ctx")
    assert [first[f"{p} ms: bf16"] for p in ("fwd", "bwd", "opt", "step")] == ["4.00", "11.00", "5.00", "20.00"]
    # fwd 10/4, fwd+bwd (10+20)/(4+11), step 36/20
    assert [first[f"{r} speed-up: bf16"] for r in ("fwd", "fwd+bwd", "step")] == ["2.50x", "2.00x", "1.80x"]
    assert first["fwd ms: fp16"] == "OOM" and first["step speed-up: fp16"] == "OOM"  # a status, never a number
    assert second["fwd speed-up: bf16"] == "baseline OOM" and second["fwd ms: fp16"] == "not run"
    assert "## Comparison" not in report.render_e2e(records[:1], "github")


def test_a_comparison_is_paired_in_one_process_and_drift_is_reported(tmp_path, capsys):
    # the second optimizer slows its own model's forward (test_faults_helper): the phase both variants run alike,
    # the control of an optimizer comparison, changes between them as if the machine slowed down for one of them
    slow = "test_faults_helper:SlowForwardAdamW"
    code, records = run_main(tmp_path, "--optimizer", "ours", slow, "--steps", "4")
    assert code == 0 and records[0]["pid"] == records[1]["pid"] != os.getpid()  # one child, both variants
    (row,) = cells(capsys.readouterr().out.split(f"## Comparison: our AdamW vs {slow}")[1], "ctx")
    assert row[f"fwd speed-up: {slow}"] == f"{paired_ratio(*records, 'forward'):.2f}x"
    moved = results.drift(*records, "forward")
    assert moved is not None and f"drift: forward changed by {moved.change:+.0%} ({slow})" in row["notes"]


def test_warmup_study_puts_each_warmup_in_its_own_row(tmp_path, capsys):
    """Variants with warm-up 0 run each in its own process (as --interleave runs): interleaved in one, only the
    first would pay the process's one-time costs in its first timed step."""
    code, records = run_main(tmp_path, "--warmup", "0", "2", "--in-process", "--dtype", "fp32", "bf16")
    assert [(r["config"]["dtype"], r["config"]["warmup"]) for r in records] == [
        ("fp32", 0), ("bf16", 0), ("fp32", 2), ("bf16", 2)]
    assert [r["pairing"]["mode"] for r in records] == ["runs", "runs", "steps", "steps"]
    comparison = capsys.readouterr().out.split("## Comparison")[1]
    assert [r["warmup"] for r in cells(comparison, "ctx")] == ["0", "2"]
    assert "bf16: 1 round, too few for a 95% interval (--interleave runs --repeats 6 or more)" in comparison


def test_interleave_runs_alternates_whole_runs(tmp_path, capsys):
    code, records = run_main(tmp_path, "--interleave", "runs", "--repeats", "2", "--attn", "naive", "sdpa",
                             "--steps", "2", "--warmup", "0")
    starts = [line.split("warmup=0")[0].split()[-1] for line in capsys.readouterr().err.splitlines()
              if " starting " in line]
    assert code == 0 and starts == ["naive", "sdpa", "sdpa", "naive"]  # A B | B A, each in a child of its own
    assert all(r["pairing"]["mode"] == "runs" and r["pairing"]["rounds"] == [[0, 2], [2, 4]] for r in records)


# ---- failures are rows ----


def test_an_oom_is_a_row_and_skips_the_larger_contexts(tmp_path, capsys):
    code, records = run_main(tmp_path, "--in-process", "--model", "test_bench_e2e:oom_from_ctx_32",
                             "--context-length", "16", "32", "64", "--steps", "1", "--warmup", "0")
    assert code == 0 and [r["status"] for r in records][1:] == ["OOM", "skipped: OOM at ctx=32"]
    assert records[0]["status"] in ("ok", "noisy") and "OOM" in capsys.readouterr().out


def test_a_variant_that_fails_beside_the_others_is_measured_alone(tmp_path):
    code, records = run_main(tmp_path, "--in-process", "--model", "ours", "big=test_bench_e2e:oom_from_ctx_32",
                             "--context-length", "32")
    assert code == 0 and records[0]["status"] in ("ok", "noisy") and records[1]["status"] == "OOM"
    assert all(r["interleave_fallback"] == "measured alone: the interleaved child failed (OOM)" for r in records)


@pytest.mark.xfail(len(common.failure_status(ValueError("x" * 400))) < 400, strict=True,
                   reason="common.failure_status cuts a status at 200 characters (shared-run's, #31 item 4)")
def test_an_error_row_keeps_its_whole_cause_in_the_record_and_on_stderr(tmp_path, capsys):
    code, (ok, failed) = run_main(tmp_path, "--in-process", "--model", "ours", "mine=test_bench_e2e:long_error")
    assert code == 0 and ok["status"] in ("ok", "noisy")
    assert failed["status"] == f"error: ValueError: {LONG_CAUSE.strip()}"
    out, err = capsys.readouterr()
    assert failed["status"] in err
    (row,) = [r for r in cells(out, "step ms") if r["model"] == "mine"]
    assert row["status"].startswith("error: ValueError: the keyword") and len(row["status"]) <= report.STATUS_CELL
    assert row["status"].endswith(LONG_CAUSE.strip()[-40:])  # its end: where a hint to fix it would be


def test_a_sweep_whose_every_configuration_fails_exits_1_and_its_cell_keeps_the_hint(tmp_path, capsys):
    """A misspelt --model fails every configuration: exit 1 after the table; the cell ends with where the module
    was looked for."""
    code, records = run_main(tmp_path, "--in-process", "--model", "no_such_lm:make", "--steps", "1")
    out, err = capsys.readouterr()
    assert code == 1 and [r["status"].split(":")[0] for r in records] == ["error"]
    assert err.strip().splitlines()[-1].startswith("error: every configuration failed (1 of 1")
    (row,) = cells(out, "status")
    assert row["status"].endswith("PYTHONPATH or the installed packages")


def test_ctrl_c_on_a_real_sweep(tmp_path):
    """SIGINT to the whole process group, as a terminal's Ctrl-C does, while a child is running."""
    cmd = [sys.executable, str(HERE / "bench_e2e.py"), *SMALL, "--warmup", "0", "200", "200", "200",
           "--results-dir", str(tmp_path), "--out", "c"]
    # a suite started as a background job ignores SIGINT, and a child would inherit that: give it the default
    proc = subprocess.Popen(cmd, cwd=HERE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    jsonl = tmp_path / "e2e" / "c.jsonl"
    deadline = time.monotonic() + 240  # a loaded machine starts torch slowly, twice (this run, its fork server)
    while time.monotonic() < deadline and not (jsonl.exists() and jsonl.read_text().strip()):
        time.sleep(0.2)
    os.killpg(proc.pid, signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 130 and "Traceback" not in err, err
    assert len(read_records(jsonl)) >= 1 and "interrupted" in err


# ---- the machine's ceiling: Ctrl-C while it is measured, --quiet, a full disk, one measured under load ----

INTERRUPTED = "interrupted by Ctrl-C while this machine's ceiling was measured: no file made"


@pytest.mark.parametrize("script, argv", [
    (bench_e2e, SMALL), (bench_attention, ["--device", "cpu", "--batch-size", "2", "--d", "8", "--iters", "3"]),
    (leaderboard, ["--device", "cpu", "--num-layers", "1", "--d-model", "64", "--num-heads", "2", "--d-ff", "128",
                   "--vocab-size", "256", "--context-length", "32"])])
def test_ctrl_c_while_the_ceiling_is_measured_is_one_line_exit_130_and_no_file(script, argv, tmp_path, monkeypatch,
                                                                                 capsys):
    """A fresh results folder: the ceiling is measured before any file is made, so Ctrl-C leaves none."""
    monkeypatch.delenv(common.CEILINGS_ENV)

    def interrupted(*args):
        raise KeyboardInterrupt

    monkeypatch.setattr(common, "measure_ceiling", interrupted)
    with pytest.raises(SystemExit) as stop:
        script.main([*argv, "--in-process", "--quiet", "--results-dir", str(tmp_path / "results")])
    assert stop.value.code == 130 and capsys.readouterr().err.splitlines() == [INTERRUPTED]
    assert not (tmp_path / "results").exists()


# in every Python started with this folder on PYTHONPATH, the fork server's too: a calibration that lasts until the
# test's Ctrl-C, announced once it has begun
CALIBRATING = """
import sys, time
import common

def calibrating(*args):
    print("calibrating", file=sys.stderr, flush=True)
    time.sleep(600)

common.measure_ceiling = calibrating
"""


def test_ctrl_c_while_a_child_measures_the_ceiling(tmp_path):
    """SIGINT to the process group, as a terminal's Ctrl-C, while the fork server's child measures the ceiling."""
    (tmp_path / "hook").mkdir()
    (tmp_path / "hook" / "sitecustomize.py").write_text(CALIBRATING)
    env = {**{k: v for k, v in os.environ.items() if k != common.CEILINGS_ENV},
           "PYTHONPATH": os.pathsep.join([str(tmp_path / "hook"), str(HERE)])}
    cmd = [sys.executable, str(HERE / "bench_e2e.py"), *SMALL, "--results-dir", str(tmp_path / "results")]
    # a suite started as a background job ignores SIGINT, and a child would inherit that: give it the default
    proc = subprocess.Popen(cmd, cwd=HERE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                            start_new_session=True, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    said = []
    for line in proc.stderr:
        said.append(line.rstrip("\n"))
        if line == "calibrating\n":
            os.killpg(proc.pid, signal.SIGINT)
    proc.wait(timeout=120)
    assert proc.returncode == 130 and said[1:] == ["calibrating", INTERRUPTED], said
    assert said[0].startswith("measuring this machine's ceiling") and not (tmp_path / "results").exists()


def test_quiet_says_nothing_of_the_ceiling_and_a_full_disk_is_one_line(tmp_path, monkeypatch, capsys):
    """--quiet --plot on a fresh results folder whose disk is full but for the records: the ceiling measured and
    not saved, the figures not drawn, in one line."""
    monkeypatch.delenv(common.CEILINGS_ENV)
    monkeypatch.setattr(common, "CALIBRATION", TINY_CALIBRATION)
    import matplotlib.figure

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", full)
    monkeypatch.setattr(common, "replace_text", full)  # ceilings.json
    code, records = run_main(tmp_path, "--in-process", "--quiet", "--plot")
    err = capsys.readouterr().err
    assert code == 1 and records[0]["floors"]["roofs"]["ceiling"] == "measured"
    (line,) = err.splitlines()
    assert line.startswith("error: figure ") and line.endswith(" not drawn: No space left on device"), err
    assert not (tmp_path / "ceilings.json").exists()


def test_a_ceiling_measured_under_load_is_measured_again_once_a_phase_beats_its_floor(tmp_path, monkeypatch, capsys):
    """A cached ceiling far below the machine's (measured under load): the first row beats its floors, so the ceiling
    is measured again (once) and the next row divides by the better one, which the file keeps."""
    path, cpu = tmp_path / "ceilings.json", torch.device("cpu")
    monkeypatch.setenv(common.CEILINGS_ENV, str(path))
    monkeypatch.setattr(common, "CALIBRATION", TINY_CALIBRATION)
    key = f"{socket.gethostname()} | {common.device_name(cpu)} | torch {torch.__version__}"
    low = {"matmul_tflops": {"fp32": 1e-9, "bf16": 1e-9, "fp16": 1e-9}, "matmul_n": {"fp32": 64, "bf16": 64,
           "fp16": 64}, "copy_gbs": 1e-9, "copy_bytes": 2**20, "loadavg_1m": 40.0}
    path.write_text(json.dumps({key: low}))
    code, (first, second) = run_main(tmp_path, "--in-process", "--context-length", "16", "32")
    assert code == 0 and first["floors"]["phases"]["forward"]["of_floor"] > 1
    assert first["floors"]["roofs"]["measured"] == {"tflops": 1e-9, "gbs": 1e-9, "loadavg_1m": 40.0}
    saved = json.loads(path.read_text())[key]
    assert saved["matmul_tflops"]["fp32"] > 1e-6 and saved["copy_gbs"] > 1e-6 and saved["loadavg_1m"] != 40.0
    assert second["floors"]["roofs"]["measured"]["tflops"] == saved["matmul_tflops"]["fp32"]
    err = capsys.readouterr().err
    assert err.count("measuring this machine's ceiling") == 1 and "beat its floor" in err


# ---- the longest context ----


def test_max_context_search_doubles_to_the_first_oom_then_bisects(tmp_path, monkeypatch, capsys):
    # a small device: every context from 330 up runs out of memory
    code, records = run_main(tmp_path, "--context-length", "max", "--max-context", "65536", "--steps", "1",
                             "--model", "test_faults_helper:oom330up")
    probes, answer = records[:-1], records[-1]
    assert code == 0 and [(r["config"]["model"]["context_length"], r["status"]) for r in probes] == [
        (128, "ok"), (256, "ok"), (512, "OOM"), (384, "OOM"), (320, "ok")]  # doubling, then bisecting by 64
    assert len({r["pid"] for r in probes}) == 5 and os.getpid() not in {r["pid"] for r in probes}
    assert (answer["longest_context"], answer["longest_power_of_two"], answer["first_oom"]) == (320, 256, 384)
    assert answer["answer"] == ("the longest that fits, to within 64: 384 runs out of memory (the longest power of "
                                "two: 256)")
    saved = (tmp_path / "e2e" / "t.md").read_text()  # a saved run re-renders the same, from its records alone
    assert report.render_e2e(read_records(tmp_path / "e2e" / "t.jsonl"), "github") == saved.rstrip("\n")
    (row,) = cells(saved.split("## Longest context")[1], "longest ctx")
    assert (row["longest ctx"], row["longest 2^k"], row["last probe"]) == ("320", "256", "320: ok")


def test_search_answers_and_the_bisection_budget():
    bisection = runner.Bisection(fits=256, fails=512, resolution=64, budget=8)
    tried = []
    while (size := bisection.next_size()) is not None:
        tried.append(size)
        bisection.record(size, fits=size < 400)  # the fake limit: 399
    assert tried == [384, 448] and (bisection.fits, bisection.fails) == (384, 448)  # resolved: 64 apart
    spent = runner.Bisection(fits=1024, fails=2048, resolution=64, budget=2)
    for _ in range(2):
        spent.record(spent.next_size(), fits=True)
    assert spent.next_size() is None and spent.fails - spent.fits > spent.resolution  # the budget ended it

    def answer(*probes, cap=4096, budget=8):
        seen = [{"context_length": n, "status": s} for n, s in probes]
        return report.search_answer(seen, cap, 64, budget)["answer"]

    assert answer((128, "OOM")) == "none: OOM already at 128"
    assert answer((128, "ok"), (256, "ok"), cap=300) == "at least this: the search stops at --max-context 300"
    assert answer((128, "ok"), (256, "ok")) == "incomplete: the search was interrupted"
    assert "timed out" in answer((128, "ok"), (256, "timeout after 900 s"))
    assert answer((128, "ok"), (256, "ok"), (512, "OOM"), (384, "ok"), budget=1) == (
        "between 384 and 512: the bisection spent its budget of 1 probe (--search-probes)")
    assert answer((128, "ok"), (256, "ok"), (512, "OOM"), (384, "ok"), (448, "error: RuntimeError: boom")) == (
        "inconclusive: 448 failed with an error, not an OOM (see its row); the limit lies between 384 and 512")


# ---- the command line ----


def parse_error(capsys, *argv):
    with pytest.raises(SystemExit) as exc:
        bench_e2e.parse_args(["--device", "cpu", *argv])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and len(err.strip().splitlines()) == 1
    return err


@pytest.mark.parametrize("argv,message", [
    (["--size", "huge"], "unknown preset 'huge'; valid presets in handout 2026: tiny, small"),
    (["--batch-size", "0"], "must be a positive integer"),
    (["--size", "tiny", "--num-heads", "7"], "d_model (512) must be divisible by num_heads (7)"),
    (["--mode", "train", "--no-grad"], "--no-grad only applies to --mode forward"),
    (["--tf32", "on"], "--tf32 needs a CUDA device"),
    (["--size", "2.7B"], "preset '2.7B' is in handout 2025's table, not in handout 2026's"),
    (["--compile", "maybe"], "argument --compile: invalid choice: 'maybe' (choose from 'off', 'on')"),
    (["--model", "a=ours", "a=x:y"], "--model: give each model once, and each a name of its own"),
    (["--model", "ours", "ours=x:y"], "--model: give each model once, and each a name of its own"),
    (["--mode", "train", "--optimizer", "a=optim:AdamW", "a=torch.optim:AdamW"],
     "--optimizer: give each optimizer a name of its own"),
    (["--mode", "train", "--optimizer", "ours", "ours=optim:AdamW"], "--optimizer: give each optimizer a name"),
    (["--model", "a b=x:y"], "model name 'a b': letters, digits"),
    (["--context-length", "max", "512"], "give max or numbers, not both (got max 512)"),
    (["--context-length", "most"], "must be a positive integer or max, got 'most'"),
    (["--max-context", "1024"], "--max-context only applies to --context-length max"),
    (["--context-length", "max", "--in-process"], "drop --in-process"),
    (["--context-length", "max", "--warmup", "0", "--steps", "1"], "needs --warmup + --steps >= 2"),
    (["--world-size", "8", "--dry-run"], "--world-size only applies to --parallel"),
    (["--columns", "size", "step_ms"], "--columns: unknown column 'step_ms'; valid columns: size, d_model"),
])
def test_bad_input_exits_2_with_one_line(capsys, argv, message):
    assert message in parse_error(capsys, *argv)


def test_help_says_the_model_default_as_a_user_gives_it(capsys):
    with pytest.raises(SystemExit):
        bench_e2e.parse_args(["--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert "records (default: ours)" in out and "None" not in out


def test_bad_input_from_the_shell_is_one_line_without_a_traceback():
    result = subprocess.run([sys.executable, str(HERE / "bench_e2e.py"), "--size", "huge"], cwd=HERE,
                            capture_output=True, text=True, timeout=120,
                            env={**os.environ, results.HANDOUT_ENV: "2026"})
    assert result.returncode == 2 and len(result.stderr.strip().splitlines()) == 1
    assert "unknown preset 'huge'" in result.stderr


def test_size_names_and_the_default_context_follow_the_handout(monkeypatch):
    _, (run,) = bench_e2e.parse_args(["--size", "xl", "--device", "cpu"])
    assert (run.handout, run.context_length, run.model.d_model, run.model.num_layers) == ("2026", 512, 2560, 32)
    monkeypatch.setenv(results.HANDOUT_ENV, "2025")  # read when the arguments are parsed, not at import
    _, runs = bench_e2e.parse_args(["--size", "all", "--device", "cpu"])
    assert [r.size for r in runs] == ["small", "medium", "large", "xl", "2.7B"]
    assert {(r.handout, r.context_length) for r in runs} == {("2025", 128)}


def test_dry_run_lists_the_plan_the_comparison_and_the_searches(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(runner, "run_configurations", lambda *a, **k: pytest.fail("--dry-run ran the sweep"))
    code = bench_e2e.main(["--size", "xl", "--device", "cpu", "--context-length", "max", "--max-context", "1024",
                           "--dtype", "fp32", "bf16", "--dry-run", "--results-dir", str(tmp_path)])
    out = capsys.readouterr().out
    assert code == 0 and not (tmp_path / "e2e").exists() and "3,406,809,600" in out
    plan = [line.strip() for line in out.splitlines() if line.startswith("  ")]
    assert plan[0] == (f"1. xl ctx=128 train fp32 naive warmup=5 (predicted state {16 * 3_406_809_600 / 2**30:.2f} "
                       "GiB per rank, activations aside)")  # 16 bytes per parameter: weights, grads, 2 moments
    flat = " ".join(out.split())
    assert "then a comparison table: fp32 vs bf16, one row per size and context, speed-ups over fp32" in flat
    assert "context search: 2 searches" in flat and "each trying ctx 128, 256, 512, 1024 in turn" in flat


def test_dry_run_plans_a_parallel_run_without_torchrun(capsys):
    assert bench_e2e.main(["--size", "10B", "--parallel", "fsdp", "--world-size", "8", "--device", "cpu",
                           "--dry-run"]) == 0
    plan = [line for line in capsys.readouterr().out.splitlines() if line.startswith("  ")]
    assert f"{parallel.state_bytes_per_rank(get_config('10B'), 'fsdp', 8, 'train')['state_bytes'] / 2**30:.2f}" == (
        "23.90")  # docs/bench_e2e.md quotes it
    assert plan == ["  1. 10B ctx=512 train fp32 naive warmup=5 fsdp x8 (predicted state 23.90 GiB per rank, "
                    "activations aside)"]


def test_columns_choose_and_order_the_results_table(tmp_path, capsys):
    code, _ = run_main(tmp_path, "--in-process", "--columns", "ctx", "size", "step ms")
    header = [line for line in table_lines(capsys.readouterr().out) if "step ms" in line][0]
    assert code == 0 and [c.strip() for c in header.strip("|").split("|")] == ["ctx", "size", "step ms"]
    assert header in (tmp_path / "e2e" / "t.md").read_text()
