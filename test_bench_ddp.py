"""bench_ddp.py and kernel_tables' communication table: the hidden/exposed split on the real 2-GPU NCCL DDP trace
(../shared/realdata) against an independent count on a 0.1 µs boolean timeline."""
from __future__ import annotations

import gzip
import json
from pathlib import Path

import numpy as np
import pytest

import kernel_tables as kt

HERE = Path(__file__).resolve().parent
# ../shared/realdata from the main checkout; a worktree sits one level deeper
REALDATA = next((folder for folder in (HERE.parent / "shared" / "realdata", HERE.parent.parent / "shared" / "realdata")
                 if folder.is_dir()), None)
DDP_TRACE = "ddp_2xa100_nccl_rank0_torch_profiler.json.gz"


def realdata(name: str) -> Path:
    if REALDATA is None or not (REALDATA / name).is_file():
        pytest.skip(f"no {name}: the real GPU material is read from ../shared/realdata, absent here")
    return REALDATA / name


# ---- the communication table on the real DDP trace ----


def timeline_count(path: Path) -> dict[tuple[int, str], tuple[float, float]]:
    """(step, phase) -> (comm ms, hidden ms), counted another way: every GPU operation painted onto a boolean
    timeline of 0.1 µs cells; a collective belongs to the annotation range that holds its launch (its CUDA runtime
    call, by correlation id); hidden = cells where a collective and any other GPU operation both run."""
    events = [e for e in json.load(gzip.open(path, "rt"))["traceEvents"] if e.get("ph") == "X"]
    gpu = [e for e in events if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")]
    launch = {e["args"]["correlation"]: e["ts"] for e in events if e.get("cat") == "cuda_runtime"}
    t0, cell = min(e["ts"] for e in gpu), 0.1
    cells = int((max(e["ts"] + e["dur"] for e in gpu) - t0) / cell) + 2

    def paint(kernels):
        mask = np.zeros(cells, dtype=bool)
        for e in kernels:
            mask[round((e["ts"] - t0) / cell):round((e["ts"] + e["dur"] - t0) / cell)] = True
        return mask

    compute = paint(e for e in gpu if "nccl" not in e["name"].lower())
    annotations = [e for e in events if e.get("cat") == "user_annotation"]
    steps = sorted((e for e in annotations if e["name"].startswith("ProfilerStep#")), key=lambda e: e["ts"])
    out = {}
    for number, step in enumerate(steps, 1):
        for name, phase in (("## forward ##", "forward"), ("## backward ##", "backward"),
                            (step["name"], kt.WHOLE_STEP)):
            window = next(e for e in annotations if e["name"] == name and step["ts"] <= e["ts"] <= step["ts"] +
                          step["dur"])
            comm = paint(e for e in gpu if "nccl" in e["name"].lower() and
                         window["ts"] <= launch[e["args"]["correlation"]] <= window["ts"] + window["dur"])
            out[number, phase] = (comm.sum() * cell / 1e3, (comm & compute).sum() * cell / 1e3)
    return out


def test_communication_table_on_the_real_ddp_trace_agrees_with_a_timeline_count():
    trace = realdata(DDP_TRACE)
    rows = kt.communication_rows(kt.load_torch_trace(trace))
    counted = timeline_count(trace)
    by = {(r["step"], r["phase"]): r for r in rows}
    assert {k for k in by if k[0] != "mean"} >= set(counted) and len(counted) == 9  # 3 ProfilerSteps x 3
    for key, (comm_ms, hidden_ms) in counted.items():
        assert by[key]["comm_ms"] == pytest.approx(comm_ms, abs=0.005), key
        assert by[key]["hidden_ms"] == pytest.approx(hidden_ms, abs=0.005), key
        assert by[key]["exposed_ms"] == pytest.approx(comm_ms - hidden_ms, abs=0.01), key
    backward = [by[s, "backward"] for s in (1, 2, 3)]
    assert all(r["collectives"] == "all-reduce x5" and r["comm_ms"] > 10 for r in backward)  # DDP's 5 buckets
    assert by["mean", kt.WHOLE_STEP]["comm_ms"] == pytest.approx(sum(counted[s, kt.WHOLE_STEP][0]
                                                                     for s in (1, 2, 3)) / 3, abs=0.005)
    assert 0 < by["mean", "backward"]["hidden_share"] < 1
    text = kt.render_tables(kt.build_tables(kt.load_torch_trace(trace)))
    assert "### 5. Communication" in text and "whole step" in text
