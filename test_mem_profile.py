"""Tests for mem_profile.py and memory_snapshot.py: saved-for-backward accounting on small models (fake and
real tensors), the snapshot reader on a hand-built snapshot in the real format, the CUDA-only recording logic
with fakes, the CPU path, failures as rows and bad input."""
from __future__ import annotations

import json
import pickle
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import lm_memory
import mem_profile
import memory_snapshot
import memory_tables
import runner
import sweep
from memory_snapshot import BEFORE_RECORDING, PROJECT_ROOT
from model import TransformerLM, cross_entropy
from model_config import ModelConfig
from optim import AdamW
from results import read_records
from runner import RunConfig

MIB = 2**20
SMALL = ModelConfig(d_model=32, d_ff=64, num_layers=2, num_heads=4, vocab_size=50, context_length=16)
BATCH = 2


def saved(cfg: ModelConfig = SMALL, **kwargs) -> list[dict]:
    return lm_memory.saved_for_backward(cfg, BATCH, **kwargs)


def total(cfg: ModelConfig = SMALL, **kwargs) -> int:
    return sum(s["bytes"] for s in saved(cfg, **kwargs))


# ---- saved for backward ----


def test_naive_attention_keeps_score_matrices_and_sdpa_does_not():
    score_shape = [BATCH, SMALL.num_heads, SMALL.context_length, SMALL.context_length]
    naive = [s for s in saved(attn="naive") if s["shape"] == score_shape]
    assert {s["op"] for s in naive} >= {"Where", "Exp", "Div"}  # masked scores, exp, probabilities
    assert all(s["module"].endswith(".attn") for s in naive)
    assert len(naive) == 3 * SMALL.num_layers  # counted once each, though the probabilities are saved as a view
    assert not [s for s in saved(attn="sdpa") if s["shape"] == score_shape]


def test_saved_bytes_grow_linearly_in_layers_and_every_block_saves_the_same():
    totals = [total(ModelConfig(**{**SMALL.__dict__, "num_layers": n})) for n in (1, 2, 3, 5)]
    per_layer = totals[1] - totals[0]
    assert per_layer > 0
    assert totals == [totals[0] + k * per_layer for k in (0, 1, 2, 4)]
    summary = lm_memory.summarize_saved(saved(ModelConfig(**{**SMALL.__dict__, "num_layers": 3})), 3)
    assert summary["saved_block_bytes_min"] == summary["saved_block_bytes_max"] == per_layer
    assert summary["saved_total_bytes"] == summary["saved_blocks_bytes"] + summary["saved_outside_bytes"]
    assert sum(r["share"] for r in summary["saved_block_top"]) <= 1.0


def test_checkpointing_reduces_saved_bytes():
    cfg = ModelConfig(**{**SMALL.__dict__, "num_layers": 4})
    none, every_2, every_1 = (total(cfg, checkpoint_every=k) for k in (0, 2, 1))
    assert every_2 < every_1 < none  # K=1 keeps one residual per block, K=2 one per two blocks


# ---- activation checkpointing: the predicted peak against real CPU peaks ----

DEEP = ModelConfig(d_model=64, d_ff=128, num_layers=8, num_heads=4, vocab_size=256, context_length=128)


def cpu_peak_bytes(cfg: ModelConfig, batch: int, k: int, mode: str) -> int:
    """The most bytes the CPU allocator held during one step (forward, backward, and our AdamW's step in train
    mode, after a first step made its moments), above what was allocated before it: from the stream of allocations
    and frees torch.profiler records with profile_memory=True (the CPU's counterpart of max_memory_allocated)."""
    torch.manual_seed(0)
    model = TransformerLM(cfg, checkpoint_every=k)
    optimizer = AdamW(model.parameters()) if mode == "train" else None
    tokens = torch.randint(0, cfg.vocab_size, (batch, cfg.context_length))

    def step():
        loss = cross_entropy(model(tokens), tokens)
        loss.backward()
        del loss
        if optimizer:
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        else:
            model.zero_grad(set_to_none=True)

    if optimizer:
        step()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], profile_memory=True) as prof:
        step()
    events = sorted((e for e in prof.profiler.kineto_results.events() if e.name() == "[memory]"),
                    key=lambda e: e.start_ns())
    now = peak = 0
    for event in events:
        now += event.nbytes()
        peak = max(peak, now)
    return peak


def test_the_predicted_peak_matches_the_cpu_allocators_peak_for_each_k():
    """Train mode: its peak can fall in any of the moments (backward starts, a segment's backward, the optimizer
    step). Measured within 7% for K = 0, 1, 2, 4 in train and forward-backward modes on this CPU (3 K here: each
    profiled step costs seconds on a loaded machine)."""
    predicted, measured, mode = {}, {}, "train"
    for k in (0, 1, 4):
        run = RunConfig(size="custom", model=DEEP, batch_size=4, mode=mode, checkpoint_every=k, device="cpu")
        prediction = mem_profile.saved_for_backward_record(run)["checkpoint_prediction"]
        predicted[k] = prediction["predicted_peak_bytes"]
        # the weights (and AdamW's moments) were allocated before the step: add them to the measured window
        measured[k] = cpu_peak_bytes(DEEP, 4, k, mode) + prediction["state_bytes"]
        assert measured[k] == pytest.approx(predicted[k], rel=0.10), (k, measured[k] / predicted[k])
    # it points the right way: the same best K, where the saved-for-backward totals alone would pick the largest
    assert min(predicted, key=predicted.get) == min(measured, key=measured.get) == 1 == prediction["best_k"]


def test_the_prediction_is_made_of_the_fake_runs_figures():
    run = RunConfig(size="custom", model=DEEP, batch_size=4, mode="train", checkpoint_every=3, device="cpu")
    record = mem_profile.saved_for_backward_record(run)
    p = record["checkpoint_prediction"]
    # with K = 3 the 8 blocks keep 3 segment inputs: 3 residual-stream tensors, as the fake run measured
    assert p["kept_bytes"] == record["saved_blocks_bytes"] == 3 * p["boundary_bytes"] == 3 * 4 * 128 * 64 * 4
    unchecked = lm_memory.summarize_saved(lm_memory.saved_for_backward(DEEP, 4), 8)  # K = 0's figures
    assert (p["block_bytes"], p["outside_bytes"]) == (unchecked["saved_block_bytes_max"],
                                                      unchecked["saved_outside_bytes"])
    curve = {point["k"]: point["predicted_peak_bytes"] for point in p["curve"]}
    assert sorted(curve) == list(range(9)) and curve[3] == p["predicted_peak_bytes"]
    assert p["best_k"] == min(curve, key=curve.get) and p["best_predicted_peak_bytes"] == min(curve.values())
    moments = lm_memory.peak_moments(3, 8, p["boundary_bytes"], p, lm_memory.static_memory_bytes(DEEP, "train"),
                                       "train")
    assert set(moments) == {"backward starts", "first segment's backward", "backward ends", "optimizer step"}
    assert max(moments.values()) == p["predicted_peak_bytes"] and p["peak_moment"] == max(moments, key=moments.get)


def test_checkpoint_runs_print_the_predicted_peak_for_each_k_on_a_cpu(tmp_path, capsys):
    assert mem_profile.main(["--size", "tiny", "--context-length", "64", "--mode", "train", "--checkpoint", "0", "1",
                             "2", "--device", "cpu", "--results-dir", str(tmp_path), "--out", "k"]) == 0
    out = capsys.readouterr().out
    table = out.split("### Activation checkpointing: the predicted peak for each K (any device)")[1]
    rows = [line for line in table.splitlines() if line.startswith("| tiny")]
    records = read_records(tmp_path / "memory" / "k.jsonl")
    assert len(rows) == 3 and [r["config"]["checkpoint_every"] for r in records] == [0, 1, 2]
    for row, record in zip(rows, records):
        assert f"{record['checkpoint_prediction']['predicted_peak_bytes'] / 2**30:.3f}" in row
    best = records[0]["checkpoint_prediction"]
    assert f"Smallest predicted peak over K = 0..N: tiny ctx 64 train fp32 naive: K = {best['best_k']}" in table


def test_fake_tensors_save_exactly_what_real_ones_do():
    for kwargs in ({"attn": "naive"}, {"attn": "sdpa", "dtype": "bf16"}, {"checkpoint_every": 1}):
        fake, real = saved(fake=True, **kwargs), saved(fake=False, **kwargs)
        key = lambda rows: sorted((s["module"], s["op"], tuple(s["shape"]), s["dtype"], s["bytes"]) for s in rows)
        assert key(fake) == key(real), kwargs


def test_weights_are_not_counted_but_autocast_weight_copies_are():
    weight_shapes = {tuple(p.shape) for p in torch.nn.Linear(SMALL.d_model, SMALL.d_ff).parameters()}
    assert not [s for s in saved(dtype="fp32") if tuple(s["shape"]) in weight_shapes]
    copies = [s for s in saved(dtype="bf16") if s["op"] == "ToCopy" and s["module"].endswith("ffn.w1")
              and s["shape"] == [SMALL.d_ff, SMALL.d_model]]
    assert len(copies) == SMALL.num_layers and copies[0]["dtype"] == "bfloat16"


def test_tensor_made_in_a_module_is_attributed_to_it_not_to_the_submodule_that_saves_it():
    ffn_in_w2 = [s for s in saved() if s["module"] == "layers.0.ffn" and s["op"] == "Mul"]
    assert ffn_in_w2 and not [s for s in saved() if s["module"] == "layers.0.ffn.w2"]


def test_accounting_residual_stream_and_scores():
    run = RunConfig(size="xl", model=mem_profile.get_config("xl", "2025", context_length=512), handout="2025",
                    mode="train", dtype="bf16")
    acc = mem_profile.accounting(run)
    assert acc["residual_stream_bytes"] == 4 * 512 * 1600 * 4 == 12.5 * MIB
    assert acc["residual_stream_formula"] == "4 x 512 x 1600 x 4 B"
    assert acc["attention_scores_layer_bytes"] == 4 * 25 * 512 * 512 * 2
    assert acc["grads_bytes"] == acc["weights_bytes"] and acc["adamw_state_bytes"] == 2 * acc["weights_bytes"]
    forward = lm_memory.static_memory_bytes(run.model, "forward")
    assert forward["grads_bytes"] == forward["adamw_state_bytes"] == 0


# ---- the snapshot reader, on a hand-built snapshot in torch's format ----

MODEL_FRAME = {"filename": str(PROJECT_ROOT / "model.py"), "line": 57, "name": "naive_attention"}
OPTIM_FRAME = {"filename": str(PROJECT_ROOT / "optim.py"), "line": 70, "name": "_adamw_foreach"}
TORCH_FRAME = {"filename": "/usr/lib/python3.11/site-packages/torch/nn/functional.py", "line": 9, "name": "linear"}
CPP_FRAME = {"filename": "??", "line": 0, "name": "at::native::empty_cuda"}
MARKS = [("forward", 1005.0), ("backward", 1035.0), ("optimizer", 1055.0), ("end", 1070.0)]


def event(action: str, addr: int, mib: float, time_us: int, *frames: dict) -> dict:
    return {"action": action, "addr": addr, "size": int(mib * MIB), "stream": 0, "time_us": time_us,
            "frames": list(frames)}


def synthetic_snapshot(with_segments: bool = True) -> dict:
    """Before recording: 8 MiB of weights (live throughout) and a 2 MiB block that the trace frees.
    Recorded: +4 (fwd), -2 (the earlier block), +6 (fwd), +6 (bwd) = peak, -6, -6 (free_completed only), +1."""
    trace = [
        event("segment_alloc", 0x100000, 32, 1000),
        event("alloc", 0x100000, 4, 1010, TORCH_FRAME, MODEL_FRAME),
        event("free_requested", 0x9000, 2, 1020),
        event("free_completed", 0x9000, 2, 1021),
        event("alloc", 0x500000, 6, 1030, MODEL_FRAME),
        event("alloc", 0xB00000, 6, 1040, CPP_FRAME),
        event("free_requested", 0x500000, 6, 1050),
        event("free_completed", 0x500000, 6, 1051),
        event("free_completed", 0xB00000, 6, 1052),
        event("alloc", 0x500000, 1, 1060, OPTIM_FRAME),
    ]
    segments = [
        {"device": 0, "address": 0x1000, "total_size": 16 * MIB, "stream": 0, "segment_type": "large",
         "blocks": [{"address": 0x1000, "size": 8 * MIB, "requested_size": 8 * MIB, "state": "active_allocated"},
                    {"address": 0x1000 + 8 * MIB, "size": 8 * MIB, "state": "inactive"}]},
        {"device": 0, "address": 0x100000, "total_size": 32 * MIB, "stream": 0, "segment_type": "large",
         "blocks": [{"address": 0x100000, "size": 4 * MIB, "requested_size": 4 * MIB, "state": "active_allocated"},
                    {"address": 0x500000, "size": 1 * MIB, "requested_size": 1 * MIB, "state": "active_allocated"},
                    {"address": 0x600000, "size": 27 * MIB, "state": "inactive"}]},
    ]
    return {"segments": segments if with_segments else [], "device_traces": [trace]}


def test_timeline_baseline_peak_and_reserved_from_segments():
    tl = memory_snapshot.rebuild_timeline(synthetic_snapshot())
    assert tl.baseline_bytes == 10 * MIB  # 13 MiB held at the end minus the trace's net +3 MiB
    assert tl.peak_bytes == 24 * MIB and tl.peak_index == 5
    assert tl.allocated_bytes[-1] == 13 * MIB
    assert tl.freed_before_recording_bytes == 2 * MIB  # requested + completed counted once
    assert tl.baseline_reserved_bytes == 16 * MIB and tl.reserved_bytes[0] == tl.reserved_bytes[-1] == 48 * MIB
    assert tl.x_axis()[0][:2] == [0.0, 0.01]  # ms since the first event


def test_free_of_a_block_from_before_recording_first_without_segments_never_goes_negative():
    snapshot = synthetic_snapshot(with_segments=False)
    trace = snapshot["device_traces"][0]
    trace.insert(0, trace.pop(2))  # the earlier block's free_requested is the very first event
    tl = memory_snapshot.rebuild_timeline(snapshot)
    assert tl.baseline_bytes == 2 * MIB
    assert min(tl.allocated_bytes) >= 0
    assert tl.peak_bytes == 16 * MIB


def test_largest_allocations_sizes_counts_sites_and_phases():
    spans = memory_snapshot.phase_spans(MARKS)
    rows = memory_snapshot.largest_allocations(synthetic_snapshot(), top=2, spans=spans)
    assert [(r["size_bytes"], r["count"]) for r in rows] == [(6 * MIB, 2), (4 * MIB, 1)]
    assert "model.py:57 naive_attention (x1)" in rows[0]["sites"]
    assert "(no Python frame" in rows[0]["sites"]
    assert rows[0]["phases"] in ("forward x1, backward x1", "backward x1, forward x1")
    assert rows[1]["sites"] == "model.py:57 naive_attention (x1)"  # the innermost frame in project code


def test_live_at_peak_adds_up_to_the_peak():
    snapshot = synthetic_snapshot()
    tl = memory_snapshot.rebuild_timeline(snapshot)
    rows = memory_snapshot.live_at_peak(snapshot, tl)
    assert rows[0] == {"site": BEFORE_RECORDING, "count": None, "bytes": 8 * MIB, "share": 8 / 24}
    assert sum(r["bytes"] for r in rows) == tl.peak_bytes
    assert rows[1]["site"] == "model.py:57 naive_attention" and rows[1]["bytes"] == 10 * MIB


def test_expandable_segments_map_and_unmap_move_the_reserved_line():
    # PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True: one segment grows by mapping pages and shrinks by unmapping
    trace = [event("segment_map", 0x100000, 20, 1000), event("alloc", 0x100000, 16, 1010, MODEL_FRAME),
             event("segment_map", 0x1500000, 20, 1020), event("alloc", 0x1500000, 16, 1030, MODEL_FRAME),
             event("free_requested", 0x1500000, 16, 1040), event("free_completed", 0x1500000, 16, 1041),
             event("segment_unmap", 0x1500000, 20, 1050)]
    tl = memory_snapshot.rebuild_timeline({"segments": [], "device_traces": [trace]})
    assert [r // MIB for r in tl.reserved_bytes] == [20, 20, 40, 40, 40, 40, 20]
    assert tl.peak_bytes == 32 * MIB and min(r - a for r, a in zip(tl.reserved_bytes, tl.allocated_bytes)) >= 0


def test_peak_check_compares_with_the_requested_peak_and_shows_the_rounded_one_beside():
    exact = memory_snapshot.peak_check(24 * MIB, 24 * MIB, 24 * MIB + 600 * 1024)
    assert exact["status"] == "ok (exact)" and exact["allocator_rounding_bytes"] == 600 * 1024
    assert memory_snapshot.peak_check(24 * MIB, 24 * MIB + 100 * 1024)["status"] == "ok (within 1%)"
    assert memory_snapshot.peak_check(24 * MIB, 30 * MIB)["status"].startswith("MISMATCH")
    assert memory_snapshot.peak_check(24 * MIB, None, 25 * MIB)["status"].startswith("no requested_bytes")


def write_snapshot(folder: Path, measured: int | None, requested: int | None = 24 * MIB) -> Path:
    path = folder / "run_tiny_ctx16_train_fp32_naive.pickle"
    path.write_bytes(pickle.dumps(synthetic_snapshot()))
    if measured is not None:
        mem_profile.snapshot_meta_path(path).write_text(json.dumps(
            {"phase_marks": MARKS, "max_memory_allocated_bytes": measured, "requested_bytes_peak": requested}))
    return path


def test_analyze_writes_png_and_tables(tmp_path, capsys):
    path = write_snapshot(tmp_path, measured=24 * MIB + 4096)
    assert mem_profile.main(["--analyze", str(path), "--results-dir", str(tmp_path), "--out", "a"]) == 0
    out = capsys.readouterr().out
    assert "ok (exact)" in out and "model.py:57 naive_attention" in out and BEFORE_RECORDING in out
    png = tmp_path / "memory" / "a_timeline.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000
    record = read_records(tmp_path / "memory" / "a.jsonl")[0]
    assert record["snapshot_peak_check"]["rebuilt_peak_bytes"] == 24 * MIB


def foreign_snapshot() -> dict:
    """A snapshot recorded on someone else's machine: their model under /home/u/proj (two packages), torch in a
    .venv inside it, one frame of a notebook elsewhere, and a backward allocation with only C++ frames."""
    def frame(filename: str, line: int, name: str) -> dict:
        return {"filename": filename, "line": line, "name": name}
    model = frame("/home/u/proj/pkg_model/layers/linear.py", 36, "forward")
    train = frame("/home/u/proj/pkg_train/train.py", 80, "main")
    torch_frame = frame("/home/u/proj/.venv/lib/python3.12/site-packages/torch/nn/modules/module.py", 1750,
                        "_call_impl")
    notebook = frame("/tmp/ipykernel_1/cell.py", 3, "<module>")
    cpp = [frame("??", 0, "torch::unwind::unwind()"),
           frame("CUDACachingAllocator.cpp", 0, "c10::cuda::CUDACachingAllocator::DeviceCachingAllocator::malloc"),
           frame("??", 0, "at::_ops::empty_memory_format::call(c10::ArrayRef<c10::SymInt>)"),
           frame("??", 0, "at::_ops::bmm::call(at::Tensor const&, at::Tensor const&)"),
           frame("??", 0, "torch::autograd::generated::BmmBackward0::apply(std::vector<at::Tensor>&&)")]
    trace = [event("alloc", 0x1000 * i, 1, 1000 + i, model, torch_frame, train) for i in range(1, 20)]
    trace += [event("alloc", 0x90000, 2, 1100, notebook), event("alloc", 0xA0000, 4, 1200, *cpp)]
    return {"segments": [], "device_traces": [trace]}


def test_a_foreign_snapshots_own_code_is_found_and_named():
    snapshot = foreign_snapshot()
    root = memory_snapshot.code_root(snapshot)
    assert str(root) == "/home/u/proj"  # both packages, not the .venv inside it, not the notebook elsewhere
    rows = memory_snapshot.largest_allocations(snapshot, top=3, root=root)
    assert [row["sites"] for row in rows] == ["BmmBackward0 > bmm (no Python frame: autograd's C++ backward) (x1)",
                                              "cell.py:3 <module> (outside the project) (x1)",
                                              "pkg_model/layers/linear.py:36 forward (x19)"]
    narrower = memory_snapshot.largest_allocations(snapshot, top=3, root=root / "pkg_train")
    assert narrower[-1]["sites"] == "train.py:80 main (x19)"  # --code-root: whose lines are named
    assert memory_snapshot.code_root({"segments": [], "device_traces": [[event("alloc", 1, 1, 1)]]}) is None


def test_cpp_only_stacks_are_named_by_their_first_meaningful_frame():
    def names(*functions: str) -> list[dict]:
        return [{"filename": "??", "line": 0, "name": f} for f in functions]
    assert memory_snapshot.cpp_site(names("at::_ops::sum_dim_IntList::call(at::Tensor const&)")) == \
        "sum_dim_IntList (no Python frame: C++ operator)"
    assert memory_snapshot.cpp_site(names("torch::unwind::unwind()", "my_extension::launch(int)")) == \
        "my_extension::launch (no Python frame: C++)"
    assert memory_snapshot.cpp_site(names("torch::unwind::unwind()", "??")).startswith("(no Python frame")


def test_code_root_goes_with_analyze(capsys):
    with pytest.raises(SystemExit) as exit_info:
        mem_profile.parse_args(["--code-root", "/x"])
    assert exit_info.value.code == 2 and "--code-root goes with --analyze" in capsys.readouterr().err


def test_analyze_rejects_a_pickle_that_is_not_a_snapshot(tmp_path):
    path = tmp_path / "x.pickle"
    path.write_bytes(pickle.dumps({"something": 1}))
    assert mem_profile.main(["--analyze", str(path), "--results-dir", str(tmp_path)]) == 2


@pytest.mark.parametrize("content", [
    pickle.dumps([1, 2]),  # a pickle, not a dict
    pickle.dumps({"device_traces": 5}),
    pickle.dumps({"device_traces": [[{"action": "alloc"}]]}),  # an entry without its fields
    pickle.dumps({"device_traces": [[]], "segments": [{"blocks": 3}]})[:-5],  # truncated
    b"plain text, not a pickle",
    b"",
], ids=["list", "traces-not-a-list", "entry-without-fields", "truncated", "text", "empty"])
def test_analyze_on_anything_but_a_snapshot_is_one_line_exit_2(content: bytes, tmp_path, capsys):
    path = tmp_path / "x.pickle"
    path.write_bytes(content)
    assert mem_profile.main(["--analyze", str(path), "--results-dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: cannot analyse") and len(err.strip().splitlines()) == 1
    assert not list((tmp_path / "memory").iterdir())  # no empty result file left behind


def test_analyze_on_a_folder_or_a_missing_file_is_a_usage_error(tmp_path, capsys):
    for path in (tmp_path, tmp_path / "missing.pickle"):
        with pytest.raises(SystemExit) as exit_:
            mem_profile.parse_args(["--analyze", str(path)])
        assert exit_.value.code == 2 and len(capsys.readouterr().err.strip().splitlines()) == 1


# ---- the CUDA-only recording, with fakes ----


class FakeCuda:
    """Stands in for the torch.cuda calls record_snapshot makes, and remembers them. `allocated` is what
    max_memory_allocated says: the requested peak (24 MiB, the synthetic trace's) plus the allocator's rounding."""

    def __init__(self, monkeypatch, fail_in_step: bool = False, allocated: int = 24 * MIB):
        self.calls: list[tuple] = []
        for name in ("synchronize", "reset_peak_memory_stats"):
            monkeypatch.setattr(torch.cuda, name, lambda *a, _n=name, **k: self.calls.append((_n,)))
        monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda *a: allocated)
        monkeypatch.setattr(torch.cuda, "memory_stats", lambda *a: {"requested_bytes.all.peak": 24 * MIB,
                                                                    "allocated_bytes.all.peak": allocated})
        monkeypatch.setattr(torch.cuda.memory, "_record_memory_history",
                            lambda enabled="all", **k: self.calls.append(("record", enabled, k.get("max_entries"))))
        monkeypatch.setattr(torch.cuda.memory, "_snapshot", lambda *a: synthetic_snapshot())
        self.fail_in_step = fail_in_step


class StubWork:
    def __init__(self, cuda: FakeCuda):
        self.device, self.cuda = torch.device("cuda"), cuda
        self.run = RunConfig(size="tiny", model=SMALL, mode="train")

    def forward(self):
        if self.cuda.fail_in_step:
            raise torch.OutOfMemoryError("CUDA out of memory (fake)")
        return None

    def backward(self, loss):
        pass

    def optimizer_step(self):
        pass


def test_record_snapshot_records_one_step_and_always_stops_recording(tmp_path, monkeypatch):
    cuda = FakeCuda(monkeypatch)
    path = str(tmp_path / "s.pickle")
    out = mem_profile.record_snapshot(StubWork(cuda), path, max_entries=1_000_000)
    records = [c for c in cuda.calls if c[0] == "record"]
    assert records == [("record", "all", 1_000_000), ("record", None, None)]
    assert cuda.calls.index(("reset_peak_memory_stats",)) < cuda.calls.index(records[0])
    assert [m[0] for m in out["snapshot_phase_marks"]] == ["forward", "backward", "optimizer", "end"]
    meta = json.loads(mem_profile.snapshot_meta_path(path).read_text())
    assert meta["max_memory_allocated_bytes"] == 24 * MIB and meta["requested_bytes_peak"] == 24 * MIB
    assert memory_snapshot.load_snapshot(path)["device_traces"]

    failing = FakeCuda(monkeypatch, fail_in_step=True)
    with pytest.raises(torch.OutOfMemoryError):
        mem_profile.record_snapshot(StubWork(failing), str(tmp_path / "t.pickle"), 10)
    assert [c for c in failing.calls if c[0] == "record"][-1] == ("record", None, None)


def test_large_model_rounding_is_no_false_mismatch(tmp_path, monkeypatch):
    # large/xl training: max_memory_allocated counts rounded blocks, 2-3% above the requested bytes the trace has
    cuda = FakeCuda(monkeypatch, allocated=int(24 * MIB * 1.025))
    path = str(tmp_path / "s.pickle")
    out = mem_profile.record_snapshot(StubWork(cuda), path, max_entries=1_000_000)
    fields = mem_profile.analyze_snapshot(path, out["snapshot_phase_marks"], out["snapshot_max_allocated_bytes"],
                                          tmp_path / "t.png", "xl", 5, out["snapshot_requested_peak_bytes"])
    check = fields["snapshot_peak_check"]
    assert check["status"] == "ok (exact)" and check["allocator_rounding_bytes"] == int(24 * MIB * 0.025)
    report = memory_tables.snapshot_report("xl", fields, "github")
    assert "requested peak MiB" in report and "24.60" in report  # max_memory_allocated beside it


def test_cuda_report_has_peak_table_and_snapshot_section(tmp_path, monkeypatch):
    snap = write_snapshot(tmp_path, measured=None)

    def fake_measure(run, snapshot_path=None, max_entries=0):
        Path(snapshot_path).write_bytes(snap.read_bytes())
        return {"environment": {"device": "cuda:0", "device_name": "Fake GPU", "torch": torch.__version__,
                                "cuda": "12.8", "tf32_matmul": False, "threads": 1},
                "peak_mem_allocated_bytes": 3 * 2**30, "peak_mem_reserved_bytes": 4 * 2**30,
                "step_ms": [10.0], "step_ms_mean": 10.0, "snapshot_path": snapshot_path,
                "snapshot_phase_marks": MARKS, "snapshot_max_allocated_bytes": 24 * MIB,
                "snapshot_requested_peak_bytes": 24 * MIB}

    monkeypatch.setattr(mem_profile, "measure_config", fake_measure)
    args, runs = mem_profile.parse_args(["--size", "tiny", "--context-length", "16", "--mode", "train",
                                         "--snapshot", "--in-process", "--device", "cpu",
                                         "--results-dir", str(tmp_path)])
    files = mem_profile.ResultFiles(tmp_path, "memory", "c", "memory")
    records, _ = mem_profile.profile_sweep(runs, args, files, measure=True)
    text = memory_tables.render_report(records, "github")
    assert "### Peak memory" in text and "3072.00" in text  # 3 GiB allocated, in MiB
    by_context = text.split("### Peak allocated memory per context length")[1]
    assert "|   fp32 train GiB |" in by_context and "| tiny   |    16 |            3.000 |" in by_context
    assert "#### Snapshot: tiny ctx=16 train fp32 naive warmup=3" in text and "ok (exact)" in text
    assert Path(records[0]["snapshot_png"]).is_file()


# ---- the CPU path, failures, bad input ----


def test_cpu_run_prints_accounting_and_saved_tables_and_never_touches_cuda(tmp_path, capsys, monkeypatch):
    def forbidden(*args, **kwargs):
        raise AssertionError("a CUDA-only call was reached on a CPU run")

    for name in ("_record_memory_history", "_snapshot"):
        monkeypatch.setattr(torch.cuda.memory, name, forbidden)
    for name in ("max_memory_allocated", "reset_peak_memory_stats", "synchronize"):
        monkeypatch.setattr(torch.cuda, name, forbidden)
    argv = ["--size", "tiny", "--context-length", "16", "32", "--mode", "forward", "train", "--attn", "naive",
            "sdpa", "--snapshot", "--device", "cpu", "--in-process", "--results-dir", str(tmp_path), "--out", "cpu"]
    assert mem_profile.main(argv) == 0
    out = capsys.readouterr().out
    assert "### Accounting" in out and "### Saved for backward" in out and "16 x 16 x 16 x 4 B" in out
    assert "measured peaks and snapshots need a CUDA device" in out and "### Peak memory" not in out
    assert "Model sizes from handout 2026 (v26.1.1):" in out and "sizes from: handout 2026 (v26.1.1)" in out
    assert "Peak allocated memory per context length" not in out  # nothing measured: no empty numbers
    records = read_records(tmp_path / "memory" / "cpu.jsonl")
    assert len(records) == 8 and all(r["status"].startswith("skipped") for r in records)
    assert {r["config"]["handout"] for r in records} == {"2026"}
    assert all(r["saved_status"] == "ok" for r in records)


def test_a_failed_configuration_is_a_row_and_the_others_still_run(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("BENCH_INJECT_FAULT", "oom:context_length=32,stage=saved")
    argv = ["--size", "tiny", "--context-length", "16", "32", "--mode", "train", "--device", "cpu",
            "--results-dir", str(tmp_path), "--out", "f"]  # on a CPU only fake tensors run: in this process
    assert mem_profile.main(argv) == 0
    records = read_records(tmp_path / "memory" / "f.jsonl")
    assert [r["saved_status"] for r in records] == ["ok", "OOM"]
    assert "| OOM" in capsys.readouterr().out


@pytest.mark.parametrize("argv, message", [
    (["--size", "huge"], "unknown preset 'huge'"),
    (["--context-length", "0"], "must be a positive integer"),
    (["--analyze", "/nonexistent.pickle"], "no such file"),
    (["--size", "10B", "--handout", "2025"], "preset '10B' is in handout 2026's table, not in handout 2025's"),
    (["--size", "2.7B"], "preset '2.7B' is in handout 2025's table, not in handout 2026's"),
    (["--handout", "2024"], "invalid choice: '2024'"),
    (["--analyze", "x.pickle", "--dry-run"], "--analyze runs none"),
    pytest.param(["--device", "cuda"], "CUDA is not available",
                 marks=pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")),
])
def test_bad_input_exits_2_with_one_line(argv, message):
    proc = subprocess.run([sys.executable, "mem_profile.py", *argv], capture_output=True, text=True,
                          cwd=Path(__file__).resolve().parent, timeout=60)
    assert proc.returncode == 2
    last = proc.stderr.strip().splitlines()[-1]
    assert message in last and "Traceback" not in proc.stderr


# ---- handouts, --dry-run and the per-context peak table ----


def sizes_and_contexts(runs):
    return (list(dict.fromkeys(r.size for r in runs)), list(dict.fromkeys(r.context_length for r in runs)),
            {r.batch_size for r in runs}, {r.handout for r in runs})


def test_default_size_and_contexts_are_the_handouts_memory_question(monkeypatch):
    def parse(*argv):
        return sizes_and_contexts(mem_profile.parse_args([*argv, "--device", "cpu"])[1])

    assert parse() == (["xl"], [128, 2048], {4}, {"2026"})
    assert parse("--handout", "2025") == (["2.7B"], [128, 256, 512], {4}, {"2025"})
    # gradient_checkpointing (b) of 2026: xl, batch 4, context 2048; 2025 has no such question
    assert parse("--mode", "train", "--checkpoint", "0", "2", "4") == (["xl"], [2048], {4}, {"2026"})
    assert parse("--handout", "2025", "--checkpoint", "2") == (["2.7B"], [128, 256, 512], {4}, {"2025"})
    # what the user gives wins, the rest follows the handout
    assert parse("--size", "tiny") == (["tiny"], [128, 2048], {4}, {"2026"})
    assert parse("--context-length", "64", "--batch-size", "2", "--checkpoint", "1") == (["xl"], [64], {2}, {"2026"})
    monkeypatch.setenv("CS336_HANDOUT", "2025")
    assert parse() == (["2.7B"], [128, 256, 512], {4}, {"2025"})
    args, runs = mem_profile.parse_args(["--size", "all", "--device", "cpu"])
    assert [r.size for r in runs[::6]] == ["small", "medium", "large", "xl", "2.7B"]  # 3 contexts x 2 modes each
    assert runs[18].model.d_model == 1600  # 2025's xl


def test_dry_run_lists_the_plan_and_builds_nothing(tmp_path, capsys, monkeypatch):
    def forbidden(*args, **kwargs):
        raise AssertionError("--dry-run built a model or started a configuration")

    monkeypatch.setattr(mem_profile, "Workload", forbidden)  # models are built by runner.build_model, below
    monkeypatch.setattr(lm_memory, "TransformerLM", forbidden)
    for name in ("TransformerLM", "Workload"):
        monkeypatch.setattr(runner, name, forbidden)
    for name in ("run_isolated", "run_sweep"):
        monkeypatch.setattr(sweep, name, forbidden)
    assert mem_profile.main(["--handout", "2025", "--dtype", "fp32", "bf16", "--device", "cpu", "--dry-run",
                             "--results-dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert not (tmp_path / "memory").exists()
    assert "Model sizes from handout 2025 (Spring 2025):" in out and "| 2.7B " in out
    assert "dry run: 12 configurations would run" in out
    assert ("   1. 2.7B ctx=128 forward fp32 naive warmup=3\n   2. 2.7B ctx=128 forward bf16 naive warmup=3\n"
            in out)
    assert "  12. 2.7B ctx=512 train bf16 naive warmup=3\n" in out


def peak_record(size, ctx, mode, dtype, peak_gib=None, status="ok", attn="naive", ckpt=0):
    record = {"config": {"size": size, "handout": "2026", "model": {"context_length": ctx}, "mode": mode,
                         "dtype": dtype, "attn": attn, "checkpoint_every": ckpt}, "status": status}
    if peak_gib is not None:
        record["peak_mem_allocated_bytes"] = int(peak_gib * 2**30)
    return record


def table_cells(text):
    lines = [line for line in text.splitlines() if line.startswith("|")]
    return [[cell.strip() for cell in line.strip("|").split("|")] for line in lines[:1] + lines[2:]]


def test_peak_per_context_table_puts_forward_beside_train_and_fp32_beside_bf16():
    records = [peak_record("xl", 128, "forward", "fp32", 13.5), peak_record("xl", 128, "forward", "bf16", 14.25),
               peak_record("xl", 128, "train", "fp32", 52.125), peak_record("xl", 128, "train", "bf16", 50.0),
               peak_record("xl", 2048, "forward", "fp32", 20.0), peak_record("xl", 2048, "forward", "bf16", 18.5),
               peak_record("xl", 2048, "train", "fp32", status="OOM"),
               peak_record("xl", 2048, "train", "bf16", 75.75)]
    header, *rows = table_cells(memory_tables.peak_by_context_table(records, "github"))
    assert header == ["size", "ctx", "fp32 forward GiB", "fp32 train GiB", "bf16 forward GiB", "bf16 train GiB"]
    assert rows == [["xl", "128", "13.500", "52.125", "14.250", "50.000"],
                    ["xl", "2048", "20.000", "OOM", "18.500", "75.750"]]


def test_peak_per_context_table_shows_what_varies_and_nothing_unmeasured():
    records = [peak_record("tiny", 16, "forward", "fp32", 1.0, ckpt=0), peak_record("tiny", 16, "train", "fp32", 3.0),
               peak_record("tiny", 16, "train", "fp32", 2.0, ckpt=2)]
    header, *rows = table_cells(memory_tables.peak_by_context_table(records, "github"))
    assert header == ["size", "ctx", "ckpt", "fp32 forward GiB", "fp32 train GiB"]
    assert rows == [["tiny", "16", "0", "1.000", "3.000"], ["tiny", "16", "2", "", "2.000"]]
    skipped = [peak_record("tiny", 16, "train", "fp32", status="skipped: measured peaks need a CUDA device")]
    assert memory_tables.peak_by_context_table(skipped, "github") is None


def test_unknown_column_is_a_usage_error(tmp_path, capsys):
    with pytest.raises(SystemExit) as exc:
        mem_profile.main(["--size", "tiny", "--device", "cpu", "--columns", "peak", "--results-dir", str(tmp_path)])
    assert exc.value.code == 2 and "valid columns: size, ctx, mode, dtype" in capsys.readouterr().err


def test_num_heads_overrides_the_preset_and_changes_what_a_block_saves():
    # the handout's section 3.2 builds the xl block with 16 heads (Table 1: 32): fewer heads, smaller S x S tensors
    _, runs = mem_profile.parse_args(["--size", "xl", "--num-heads", "16", "--device", "cpu"])
    assert {run.model.num_heads for run in runs} == {16} and {run.model.d_model for run in runs} == {2560}
    small = dict(d_model=64, d_ff=128, num_layers=1, vocab_size=256, context_length=64)
    per_block = {}
    for heads in (2, 4):
        rows = lm_memory.saved_for_backward(ModelConfig(num_heads=heads, **small), batch=2)
        per_block[heads] = sum(r["bytes"] for r in rows if (r["module"] or "").startswith("layers.0"))
    assert per_block[4] > per_block[2]
    with pytest.raises(SystemExit) as exit_:
        mem_profile.parse_args(["--size", "xl", "--num-heads", "7", "--device", "cpu"])
    assert exit_.value.code == 2
