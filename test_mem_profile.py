"""Tests for mem_profile.py: saved-for-backward accounting on small models (fake against real tensors, blocks found
by structure), the compiled block's count, the checkpointing prediction against the CPU allocator's real peak, the
snapshot reader on a hand-built snapshot in torch's format, hostile and broken inputs, a student's model that
exits, hangs or returns the wrong shape, the CUDA-only recording with fakes, the tables."""
from __future__ import annotations

import json
import dataclasses
import math
import os
import pickle
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import torch.nn as nn
import torch.utils.checkpoint

import mem_profile
import report
from mem_profile import BEFORE_RECORDING, PROJECT_ROOT, MemConfig
from model import RotaryEmbedding, TransformerBlock, TransformerLM, cross_entropy
from results import TINY, ModelConfig, read_records
from optim import AdamW

HERE = Path(__file__).resolve().parent
MIB = 2**20
SMALL = ModelConfig(d_model=32, d_ff=64, num_layers=2, num_heads=4, vocab_size=50, context_length=16)
BATCH = 2


def run_of(cfg: ModelConfig = SMALL, **fields) -> MemConfig:
    return MemConfig(size="custom", model=cfg, batch_size=fields.pop("batch_size", BATCH), device="cpu", **fields)


def saved(cfg: ModelConfig = SMALL, fake: bool = True, **fields) -> list[dict]:
    return mem_profile.saved_for_backward(run_of(cfg, **fields), fake=fake)["rows"]


def total(cfg: ModelConfig = SMALL, **fields) -> int:
    return sum(s["bytes"] for s in saved(cfg, **fields))


# ---- saved for backward ----


def test_naive_attention_keeps_score_matrices_and_sdpa_does_not():
    score_shape = [BATCH, SMALL.num_heads, SMALL.context_length, SMALL.context_length]
    naive = [s for s in saved(attn="naive") if s["shape"] == score_shape]
    assert {s["op"] for s in naive} == {"Exp", "Div"}  # exp and probabilities: max keeps no masked scores
    assert all(s["module"].endswith(".attn") for s in naive)
    assert len(naive) == 2 * SMALL.num_layers  # counted once each, though the probabilities are saved as a view
    assert not [s for s in saved(attn="sdpa") if s["shape"] == score_shape]


def test_saved_bytes_grow_linearly_in_layers_and_every_block_saves_the_same():
    totals = [total(ModelConfig(**{**SMALL.__dict__, "num_layers": n})) for n in (1, 2, 3, 5)]
    per_layer = totals[1] - totals[0]
    assert per_layer > 0 and totals == [totals[0] + k * per_layer for k in (0, 1, 2, 4)]
    summary = mem_profile.summarize_saved(mem_profile.saved_for_backward(run_of(
        ModelConfig(**{**SMALL.__dict__, "num_layers": 3}))))
    assert summary["saved_block_bytes_max"] == summary["saved_block_bytes_mean"] == per_layer
    assert summary["saved_total_bytes"] == summary["saved_blocks_bytes"] + summary["saved_outside_bytes"]
    assert sum(r["share"] for r in summary["saved_block_top"]) <= 1.0
    # a row adds up several tensors and says how many: SwiGLU's two gate products, per block
    (gate,) = [r for r in summary["saved_block_top"] if r["module"] == "ffn" and r["op"] == "Mul"]
    assert gate["tensors"] == 2 and gate["bytes"] == 2 * BATCH * SMALL.context_length * SMALL.d_ff * 4


def test_checkpointing_reduces_saved_bytes():
    cfg = ModelConfig(**{**SMALL.__dict__, "num_layers": 4})
    none, every_2, every_1 = (total(cfg, checkpoint_every=k) for k in (0, 2, 1))
    assert every_2 < every_1 < none  # K=1 keeps one residual per block, K=2 one per two blocks


def test_fake_tensors_save_exactly_what_real_ones_do():
    for fields in ({"attn": "naive"}, {"attn": "sdpa", "dtype": "bf16"}, {"checkpoint_every": 1}):
        key = lambda rows: sorted((s["module"], s["op"], tuple(s["shape"]), s["dtype"], s["bytes"]) for s in rows)
        assert key(saved(fake=True, **fields)) == key(saved(fake=False, **fields)), fields


def test_weights_are_not_counted_but_autocast_weight_copies_are():
    weight_shapes = {tuple(p.shape) for p in nn.Linear(SMALL.d_model, SMALL.d_ff).parameters()}
    assert not [s for s in saved(dtype="fp32") if tuple(s["shape"]) in weight_shapes]
    copies = [s for s in saved(dtype="bf16") if s["op"] == "ToCopy" and s["module"].endswith("ffn.w1")
              and s["shape"] == [SMALL.d_ff, SMALL.d_model]]
    assert len(copies) == SMALL.num_layers and copies[0]["dtype"] == "bfloat16"


def test_tensor_made_in_a_module_is_attributed_to_it_not_to_the_submodule_that_saves_it():
    rows = saved()
    assert [s for s in rows if s["module"] == "layers.0.ffn" and s["op"] == "Mul"]
    assert not [s for s in rows if s["module"] == "layers.0.ffn.w2"]


class RenamedLM(nn.Module):
    """Our model with its blocks in `transformer_blocks` beside another ModuleList (of norms): found by
    structure, not by our name `layers`."""

    def __init__(self, vocab_size, context_length, d_model, num_layers, num_heads, d_ff, rope_theta):
        super().__init__()
        inner = TransformerLM(ModelConfig(d_model=d_model, d_ff=d_ff, num_layers=num_layers, num_heads=num_heads,
                                          vocab_size=vocab_size, context_length=context_length))
        self.embed, self.head, self.norm = inner.token_embeddings, inner.lm_head, inner.ln_final
        self.transformer_blocks = inner.layers
        self.extra_norms = nn.ModuleList(nn.LayerNorm(d_model) for _ in range(2))

    def forward(self, tokens):
        x = self.embed(tokens)
        for block in self.transformer_blocks:
            x = block(x)
        return self.head(self.norm(x))


def test_blocks_are_found_by_structure_with_their_gradient_memory(monkeypatch):
    monkeypatch.chdir(HERE)  # the factory is imported from the current directory
    theirs = mem_profile.saved_for_backward(run_of(model_factory="test_mem_profile:RenamedLM"))
    ours = mem_profile.saved_for_backward(run_of())
    assert theirs["blocks"] == ["transformer_blocks.0", "transformer_blocks.1"]
    summary, reference = mem_profile.summarize_saved(theirs), mem_profile.summarize_saved(ours)
    assert summary["num_blocks"] == 2 and summary["saved_blocks_bytes"] > 0
    assert summary["saved_block_bytes_mean"] == reference["saved_block_bytes_mean"]
    block_params = 4 * SMALL.d_model**2 + 3 * SMALL.d_model * SMALL.d_ff + 2 * SMALL.d_model
    assert theirs["block_grad_bytes"] == ours["block_grad_bytes"] == 4 * block_params


# ---- your model: every failure a row, accounting only for what was counted ----


class NoParameters(nn.Module):
    def __init__(self, vocab_size, **_):
        super().__init__()
        self.vocab_size = vocab_size

    def forward(self, tokens):
        return nn.functional.one_hot(tokens, self.vocab_size).float()


def no_parameters(**keywords):
    return NoParameters(**keywords)


def exits(**_):
    sys.exit(0)


def exits_hard(**_):
    os._exit(0)


def fails(**_):
    raise RuntimeError("my factory is broken")


def hangs(**_):
    import time
    time.sleep(3600)


class WrongLogits(NoParameters):
    def forward(self, tokens):
        return super().forward(tokens)[:, -1]  # the last position only: (batch, vocab)


def wrong_logits(**keywords):
    return WrongLogits(**keywords)


def test_your_model_exits_hangs_or_fails_and_every_configuration_is_a_row(tmp_path, monkeypatch, capfd):
    monkeypatch.chdir(HERE)
    factories = ["no_parameters", "exits", "exits_hard", "wrong_logits", "fails", "hangs", "RenamedLM"]
    argv = ["--size", "tiny", "--context-length", "16", "--batch-size", "2", "--mode", "train", "--device", "cpu",
            "--timeout", "8", "--results-dir", str(tmp_path), "--out", "y", "--model",  # room for a loaded machine
            *[f"test_mem_profile:{name}" for name in factories]]
    assert mem_profile.main(argv) == 0
    records = {r["config"]["model_factory"].split(":")[1]: r for r in read_records(tmp_path / "memory" / "y.jsonl")}
    assert list(records) == factories  # each in its own child, the later ones ran
    assert records["no_parameters"]["saved_status"] == "ok" and records["no_parameters"]["weights_bytes"] == 0
    assert records["exits"]["status"] == "error: SystemExit: 0"
    assert records["exits_hard"]["status"] == "error: child process died with exit code 0"
    assert records["hangs"]["status"] == "timeout after 8 s"
    message = ("error: ValueError: test_mem_profile:wrong_logits returned (2, 10000) torch.float32 for token ids "
               "(2, 16); expected floating-point logits (batch, seq, vocab) = (2, 16, 10000)")
    assert records["wrong_logits"]["saved_status"] == message[:200]
    assert records["fails"]["saved_status"] == "error: RuntimeError: my factory is broken"
    for name in ("exits", "exits_hard", "fails", "hangs", "wrong_logits"):  # nothing of ours under their name
        assert "weights_bytes" not in records[name] and "residual_stream_bytes" not in records[name], name
    assert records["RenamedLM"]["num_blocks"] == 4 and records["RenamedLM"]["block_grad_bytes"] > 0
    out, err = capfd.readouterr()
    assert "Traceback" not in err and "FakeTensor" not in err and message[:120] in err
    assert "not counted: error: SystemExit: 0" in out


def test_a_sweep_whose_every_configuration_fails_exits_1(tmp_path, capfd):
    assert mem_profile.main(["--size", "tiny", "--context-length", "16", "--device", "cpu", "--in-process",
                             "--model", "no_such_lm:make", "--results-dir", str(tmp_path)]) == 1
    out, err = capfd.readouterr()
    assert "no module named 'no_such_lm'" in out and "every configuration failed" in err.splitlines()[-1]


def test_ctrl_c_after_the_first_configuration_prints_its_row(tmp_path):
    """The first context finishes, the second hangs in its child: Ctrl-C to the process group, as a terminal's."""
    cmd = [sys.executable, str(HERE / "mem_profile.py"), "--size", "tiny", "--context-length", "16", "24",
           "--batch-size", "2", "--mode", "train", "--device", "cpu", "--model", "test_faults_helper:hang24",
           "--results-dir", str(tmp_path), "--out", "i"]
    # a suite started as a background job ignores SIGINT, and a child would inherit that: give it the default
    proc = subprocess.Popen(cmd, cwd=HERE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    jsonl, deadline = tmp_path / "memory" / "i.jsonl", time.monotonic() + 240
    while time.monotonic() < deadline and not (jsonl.exists() and jsonl.read_text().strip()):
        time.sleep(0.2)
    os.killpg(proc.pid, signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 130 and "Traceback" not in err, err
    assert "interrupted by Ctrl-C after 1 of 2 configurations" in err
    contexts = {line.split("|")[2].strip() for line in out.splitlines() if line.startswith("| tiny   |    ")}
    assert "16" in contexts and "24" not in contexts, out  # the finished configuration's rows; none of the hung one
    assert f"wrote {tmp_path / 'memory' / 'i.md'}" in out


# ---- the handout's compiled block (§3.2) ----


def test_the_compiled_blocks_saved_tensors_equal_what_its_backward_node_holds():
    cfg = ModelConfig(d_model=24, d_ff=40, num_layers=1, num_heads=2, vocab_size=50, context_length=12)
    block = TransformerBlock(cfg, RotaryEmbedding(cfg.context_length, cfg.d_head))
    x = torch.randn(3, cfg.context_length, cfg.d_model, requires_grad=True)
    counted, tensors, out = mem_profile.count_saved(torch.compile(block, fullgraph=True), x)
    # independently: what the compiled autograd node holds for backward, the parameters left out
    params = {p.data_ptr() for p in block.parameters()}
    held = [t for t in out.grad_fn.saved_tensors if t.data_ptr() not in params]
    assert (counted, tensors) == (sum(t.numel() * t.element_size() for t in held), len(held))
    eager, eager_tensors, _ = mem_profile.count_saved(block, x)
    assert counted < eager and tensors < eager_tensors  # inductor recomputes cheap pointwise ops in backward


# ---- activation checkpointing: the predicted peak against real CPU peaks ----

DEEP = ModelConfig(d_model=64, d_ff=128, num_layers=8, num_heads=4, vocab_size=256, context_length=128)


def cpu_peak_bytes(cfg: ModelConfig, batch: int, k: int) -> int:
    """The most bytes the CPU allocator held during one training step (after a first step made AdamW's moments),
    above what was allocated before it: from the allocations and frees torch.profiler records with
    profile_memory=True, the CPU's counterpart of max_memory_allocated."""
    torch.manual_seed(0)
    model = TransformerLM(cfg, checkpoint_every=k)
    optimizer = AdamW(model.parameters())
    tokens = torch.randint(0, cfg.vocab_size, (batch, cfg.context_length))

    def step():
        loss = cross_entropy(model(tokens), tokens)
        loss.backward()
        del loss
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

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


def prediction(k: int, cfg: ModelConfig = DEEP, batch: int = 4) -> tuple[dict, dict]:
    record = mem_profile.measure(run_of(cfg, batch_size=batch, mode="train", checkpoint_every=k), False, None, 1)
    return record, record["checkpoint_prediction"]


@pytest.mark.parametrize("context, batch", [(128, 4), (512, 2)])
def test_the_predicted_peak_matches_the_cpu_allocators_peak_for_each_k(context: int, batch: int):
    """At long contexts the recomputed segment's backward (softmax's score-sized temporaries) sets the peak. One
    run predicts every K (its curve), from the figures of the model without checkpointing."""
    cfg, measured = dataclasses.replace(DEEP, context_length=context), {}
    p = prediction(0, cfg, batch)[1]
    predicted = {k: p["curve"][k]["predicted_peak_bytes"] for k in (0, 1, 4)}
    for k in predicted:
        measured[k] = cpu_peak_bytes(cfg, batch, k) + p["state_bytes"]  # weights and moments were there before
        assert measured[k] == pytest.approx(predicted[k], rel=0.08), (k, measured[k] / predicted[k])
    # the same best K, where the saved-for-backward totals alone would pick the largest
    assert min(predicted, key=predicted.get) == min(measured, key=measured.get) == 1 == p["best_k"]


def nested_checkpointing_forward(self, token_ids):
    """Recursive halving: each half a checkpoint of its own halves, down to one block (the toolkit's model runs
    single-level only; this is the strategy whose peak mem_profile predicts as "nested")."""
    def run(x, lo, hi):
        if hi - lo == 1:
            return self.layers[lo](x)
        mid = (lo + hi) // 2
        x = torch.utils.checkpoint.checkpoint(run, x, lo, mid, use_reentrant=False)
        return torch.utils.checkpoint.checkpoint(run, x, mid, hi, use_reentrant=False)

    return self.lm_head(self.ln_final(run(self.token_embeddings(token_ids), 0, len(self.layers))))


def test_the_nested_prediction_matches_the_cpu_allocators_peak_of_recursive_halving(monkeypatch):
    p = prediction(1)[1]
    monkeypatch.setattr(TransformerLM, "forward", nested_checkpointing_forward)
    measured = cpu_peak_bytes(DEEP, 4, 0) + p["state_bytes"]
    assert measured == pytest.approx(p["nested_predicted_peak_bytes"], rel=0.10)


def test_the_prediction_is_made_of_the_fake_runs_figures_single_level_and_nested():
    record, p = prediction(3)
    b = 4 * 128 * 64 * 4
    assert p["kept_bytes"] == record["saved_blocks_bytes"] == 3 * b == 3 * p["boundary_bytes"]  # ceil(8/3) inputs
    unchecked = mem_profile.summarize_saved(mem_profile.saved_for_backward(run_of(DEEP, batch_size=4)))
    assert (p["block_bytes"], p["outside_bytes"]) == (unchecked["saved_block_bytes_max"],
                                                      unchecked["saved_outside_bytes"])
    curve = {point["k"]: point["predicted_peak_bytes"] for point in p["curve"]}
    assert sorted(curve) == list(range(9)) and curve[3] == p["predicted_peak_bytes"]
    assert p["best_k"] == min(curve, key=curve.get) and p["best_predicted_peak_bytes"] == min(curve.values())
    static = mem_profile.static_memory_bytes(DEEP, "train")
    moments = mem_profile.peak_moments(3 * b, 3, p, static, "train")
    assert set(moments) == {"backward starts", "first segment's backward", "backward ends", "optimizer step"}
    assert max(moments.values()) == p["predicted_peak_bytes"] and p["peak_moment"] == max(moments, key=moments.get)
    # nested: ceil(log2 8) + 1 = 4 boundaries on the recursion's stack and one block recomputed
    assert p["nested_kept_bytes"] == 4 * b
    assert p["nested_predicted_peak_bytes"] == max(mem_profile.peak_moments(4 * b, 1, p, static, "train").values())
    assert p["sqrt_k"] == pytest.approx(math.sqrt(8 * b / p["block_bytes"]))


def test_checkpoint_runs_print_the_predicted_peak_for_each_k_and_the_nested_one(tmp_path, capsys):
    assert mem_profile.main(["--size", "tiny", "--context-length", "64", "--mode", "train", "--checkpoint", "0", "1",
                             "2", "--device", "cpu", "--results-dir", str(tmp_path), "--out", "k"]) == 0
    table = capsys.readouterr().out.split("### Activation checkpointing: the predicted peak for each K")[1]
    rows = [line for line in table.splitlines() if line.startswith("| tiny")]
    records = read_records(tmp_path / "memory" / "k.jsonl")
    assert len(rows) == 3 and [r["config"]["checkpoint_every"] for r in records] == [0, 1, 2]
    for row, record in zip(rows, records):
        assert f"{record['checkpoint_prediction']['predicted_peak_bytes'] / 2**30:.3f}" in row
    p = records[0]["checkpoint_prediction"]
    assert (f"smallest predicted peak at K = {p['best_k']} ({p['best_predicted_peak_bytes'] / 2**30:.3f} GiB); "
            f"nested (recursive halving, ceil(log2 N) + 1 = 3 boundaries kept, one block recomputed): "
            f"{p['nested_predicted_peak_bytes'] / 2**30:.3f} GiB") in table


def test_cpu_autocast_rows_say_cuda_autocast_differs_under_each_table(tmp_path, capsys):
    """CPU autocast keeps the loss's exp in bfloat16; CUDA's runs exp in float32: the CPU figures are not CUDA's."""
    assert mem_profile.main(["--size", "tiny", "--context-length", "16", "--mode", "train", "--dtype", "bf16",
                             "--checkpoint", "0", "1", "--device", "cpu", "--results-dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert re.search(r"\| Exp +\| 4x16x10000 \| bfloat16 ", out)
    assert out.count("note: the bf16/fp16 rows ran under cpu autocast") == 2  # saved for backward, checkpointing


def test_accounting_residual_stream_and_scores():
    run = MemConfig(size="xl", model=mem_profile.get_config("xl", "2025", context_length=512), handout="2025",
                    mode="train", dtype="bf16")
    record = {"status": "skipped: no GPU"}
    mem_profile.finish_record(run, record, 5)
    assert record["residual_stream_bytes"] == 4 * 512 * 1600 * 4 == 12.5 * MIB
    assert record["residual_stream_formula"] == "4 x 512 x 1600 x 4 B"
    assert record["attention_scores_layer_bytes"] == 4 * 25 * 512 * 512 * 2
    assert record["grads_bytes"] == record["weights_bytes"] and record["adamw_state_bytes"] == 2 * record["grads_bytes"]
    forward = mem_profile.static_memory_bytes(run.model, "forward")
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


ROOT = mem_profile.PurePosixPath(PROJECT_ROOT)
SPANS = [(name, start, end) for (name, start), (_, end) in zip(MARKS, MARKS[1:])]


def test_timeline_baseline_peak_and_reserved_from_segments():
    tl = mem_profile.rebuild_timeline(synthetic_snapshot())
    assert tl.baseline_bytes == 10 * MIB  # 13 MiB held at the end minus the trace's net +3 MiB
    assert tl.peak_bytes == 24 * MIB and tl.peak_index == 5
    assert tl.allocated_bytes[-1] == 13 * MIB
    assert tl.freed_before_recording_bytes == 2 * MIB  # requested + completed counted once
    assert tl.baseline_reserved_bytes == 16 * MIB and tl.reserved_bytes[0] == tl.reserved_bytes[-1] == 48 * MIB


def test_free_of_a_block_from_before_recording_first_without_segments_never_goes_negative():
    snapshot = synthetic_snapshot(with_segments=False)
    trace = snapshot["device_traces"][0]
    trace.insert(0, trace.pop(2))  # the earlier block's free_requested is the very first event
    tl = mem_profile.rebuild_timeline(snapshot)
    assert tl.baseline_bytes == 2 * MIB and min(tl.allocated_bytes) >= 0 and tl.peak_bytes == 16 * MIB


def test_largest_allocations_sizes_counts_sites_and_phases():
    rows = mem_profile.largest_allocations(synthetic_snapshot(), 2, ROOT, SPANS)
    assert [(r["size_bytes"], r["count"]) for r in rows] == [(6 * MIB, 2), (4 * MIB, 1)]
    assert "model.py:57 naive_attention (x1)" in rows[0]["sites"] and "(no Python frame" in rows[0]["sites"]
    assert rows[0]["phases"] in ("forward x1, backward x1", "backward x1, forward x1")
    assert rows[1]["sites"] == "model.py:57 naive_attention (x1)"  # the innermost frame in project code


def test_live_at_peak_adds_up_to_the_peak():
    snapshot = synthetic_snapshot()
    tl = mem_profile.rebuild_timeline(snapshot)
    rows = mem_profile.live_at_peak(snapshot, tl, 10, ROOT)
    assert rows[0] == {"site": BEFORE_RECORDING, "count": None, "bytes": 8 * MIB, "share": 8 / 24}
    assert sum(r["bytes"] for r in rows) == tl.peak_bytes
    assert rows[1]["site"] == "model.py:57 naive_attention" and rows[1]["bytes"] == 10 * MIB


def test_expandable_segments_map_and_unmap_move_the_reserved_line():
    # PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True: one segment grows by mapping pages and shrinks by unmapping
    trace = [event("segment_map", 0x100000, 20, 1000), event("alloc", 0x100000, 16, 1010, MODEL_FRAME),
             event("segment_map", 0x1500000, 20, 1020), event("alloc", 0x1500000, 16, 1030, MODEL_FRAME),
             event("free_requested", 0x1500000, 16, 1040), event("free_completed", 0x1500000, 16, 1041),
             event("segment_unmap", 0x1500000, 20, 1050)]
    tl = mem_profile.rebuild_timeline({"segments": [], "device_traces": [trace]})
    assert [r // MIB for r in tl.reserved_bytes] == [20, 20, 40, 40, 40, 40, 20]
    assert tl.peak_bytes == 32 * MIB and min(r - a for r, a in zip(tl.reserved_bytes, tl.allocated_bytes)) >= 0


def test_peak_check_compares_with_the_requested_peak_and_shows_the_rounded_one_beside():
    exact = mem_profile.peak_check(24 * MIB, 24 * MIB, 24 * MIB + 600 * 1024)
    assert exact["status"] == "ok (exact)" and exact["allocator_rounding_bytes"] == 600 * 1024
    assert mem_profile.peak_check(24 * MIB, 24 * MIB + 100 * 1024)["status"] == "ok (within 1%)"
    assert mem_profile.peak_check(24 * MIB, 30 * MIB)["status"].startswith("MISMATCH")
    assert mem_profile.peak_check(24 * MIB, None, 25 * MIB)["status"].startswith("no requested_bytes")


def write_snapshot(folder: Path, measured: int | None, content: object = None) -> Path:
    path = folder / "run_tiny_ctx16_train_fp32_naive.pickle"
    path.write_bytes(pickle.dumps(synthetic_snapshot() if content is None else content))
    if measured is not None:
        mem_profile.snapshot_meta_path(path).write_text(json.dumps(
            {"phase_marks": MARKS, "max_memory_allocated_bytes": measured, "requested_bytes_peak": 24 * MIB}))
    return path


def test_analyze_writes_the_tables_the_png_and_torchs_interactive_html(tmp_path, capsys):
    path = write_snapshot(tmp_path, measured=24 * MIB + 4096)
    assert mem_profile.main(["--analyze", str(path), "--results-dir", str(tmp_path), "--out", "a"]) == 0
    out = capsys.readouterr().out
    assert "ok (exact)" in out and "model.py:57 naive_attention" in out and BEFORE_RECORDING in out
    png, html = tmp_path / "memory" / "a_timeline.png", tmp_path / "memory" / "a_timeline.html"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000
    assert "Active Memory Timeline" in html.read_text()  # torch.cuda._memory_viz.trace_plot's page
    record = read_records(tmp_path / "memory" / "a.jsonl")[0]
    assert record["snapshot_peak_check"]["rebuilt_peak_bytes"] == 24 * MIB


def test_an_analyze_run_renders_again_as_its_md_byte_for_byte(tmp_path, capsys):
    path = write_snapshot(tmp_path, measured=24 * MIB)
    assert mem_profile.main(["--analyze", str(path), "--results-dir", str(tmp_path), "--out", "a"]) == 0
    assert report.main([str(tmp_path / "memory" / "a.jsonl"), "--results-dir", str(tmp_path), "--out", "b"]) == 0
    assert (tmp_path / "report" / "b.md").read_text() == (tmp_path / "memory" / "a.md").read_text()
    capsys.readouterr()
    assert report.main([str(tmp_path / "memory" / "a.jsonl"), "--results-dir", str(tmp_path), "--columns", "x"]) == 2
    assert "unknown column 'x'; this report has no table whose columns can be chosen" in capsys.readouterr().err


def test_a_snapshot_without_an_allocation_trace_says_how_to_record_one(tmp_path, capsys):
    """_dump_snapshot without _record_memory_history: the segments at the end, an empty trace, no peak to find."""
    path = write_snapshot(tmp_path, None, {**synthetic_snapshot(), "device_traces": [[]]})
    assert mem_profile.main(["--analyze", str(path), "--results-dir", str(tmp_path)]) == 2
    out, err = capsys.readouterr()
    assert not out and len(err.strip().splitlines()) == 1
    assert "no allocation trace" in err and "_record_memory_history(max_entries=" in err


class WritesAFile:
    """A pickle payload that runs code when loaded: it would create `path`."""

    def __init__(self, path: Path):
        self.path = path

    def __reduce__(self):
        return open, (str(self.path), "w")


@pytest.mark.parametrize("hidden", [False, True], ids=["alone", "inside-a-valid-snapshot"])
def test_a_code_running_pickle_is_refused_and_nothing_runs(hidden: bool, tmp_path, capsys):
    made = tmp_path / "made_by_the_pickle"
    payload = WritesAFile(made)
    path = write_snapshot(tmp_path, None, {**synthetic_snapshot(), "extra": payload} if hidden else payload)
    assert mem_profile.main(["--analyze", str(path), "--results-dir", str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and f"refused {open.__module__}.open" in err  # _io from 3.12
    assert not made.exists() and not list((tmp_path / "r" / "memory").iterdir())  # nothing run, nothing written


@pytest.mark.parametrize("content", [
    pickle.dumps([1, 2]),  # a pickle, not a dict
    pickle.dumps({"device_traces": 5}),
    pickle.dumps({"device_traces": [[{"action": "alloc"}]]}),  # an entry without its fields
    pickle.dumps({"device_traces": [[]], "segments": [{"blocks": 3}]})[:-5],  # truncated
    b"plain text, not a pickle",
    b"",
    *(pickle.dumps({"device_traces": [[{"action": "alloc", "addr": 1, "size": size, "stream": 0, "time_us": 0,
                                         "frames": []}]], "segments": []}) for size in (float("nan"), -5)),
    *(pickle.dumps({"device_traces": [[{"action": "alloc", "addr": 1, "size": 512, "stream": 0, **fields}]],
                    "segments": []}) for fields in ({"time_us": "late", "frames": []}, {"time_us": 0, "frames": [
                        MODEL_FRAME, {"filename": 5, "line": "x", "name": None}]})),
    pickle.dumps({"device_traces": [[{"action": "alloc", "addr": 1, "size": 2**64, "stream": 0, "frames": []}]]}),
], ids=["list", "traces-not-a-list", "entry-without-fields", "truncated", "text", "empty", "nan-size", "neg-size",
        "text-time", "mistyped-frame", "past-int64-size"])
def test_analyze_on_anything_but_a_snapshot_is_one_line_exit_2(content: bytes, tmp_path, capsys):
    path = tmp_path / "x.pickle"
    path.write_bytes(content)
    assert mem_profile.main(["--analyze", str(path), "--results-dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: cannot analyse") and len(err.strip().splitlines()) == 1
    assert not list((tmp_path / "memory").iterdir())  # no empty result file left behind


def test_a_2000_frame_stack_shared_by_2000_allocations_is_read_in_linear_time(tmp_path):
    """A pickle keeps one list for a stack many allocations share: 150 KiB here, 4 million frames if each were
    read per allocation (over a minute); each distinct stack is read once."""
    frames = [{"filename": f"/home/student/a2/m{i % 50}.py", "line": i, "name": f"f{i}"} for i in range(2000)]
    trace = [event("alloc", 4096 * i, 1, 1000 + i) | {"frames": frames} for i in range(2000)]
    path = write_snapshot(tmp_path, None, {"segments": [], "device_traces": [trace]})
    assert path.stat().st_size < 200_000
    started = time.perf_counter()
    fields = mem_profile.analyze_snapshot(mem_profile.load_snapshot(path), {}, 10)[0]
    assert time.perf_counter() - started < 10  # 0.2 s idle
    assert fields["snapshot_code_root"] == "/home/student/a2" and fields["snapshot_largest"][0]["count"] == 2000
    assert fields["snapshot_largest"][0]["sites"] == "m0.py:0 f0 (x2000)"


def test_analyze_on_a_full_disk_keeps_the_tables_and_says_so_in_one_line(tmp_path):
    """A file-size limit stands in for a full disk: the 1 KiB the tables' stem needs fits, the PNG does not."""
    path = write_snapshot(tmp_path, measured=24 * MIB)
    limit = "import resource; resource.setrlimit(resource.RLIMIT_FSIZE, (1024, resource.RLIM_INFINITY))"
    proc = subprocess.run([sys.executable, "-c", f"{limit}; import sys, mem_profile; sys.exit(mem_profile.main())",
                           "--analyze", str(path), "--results-dir", str(tmp_path), "--out", "full"],
                          capture_output=True, text=True, cwd=HERE, timeout=120)
    assert proc.returncode == 1 and "model.py:57 naive_attention" in proc.stdout  # the tables were printed
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("error: cannot write") and "the tables above are complete" in last
    assert "Traceback" not in proc.stderr


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
    root = mem_profile.code_root(snapshot)
    assert str(root) == "/home/u/proj"  # both packages, not the .venv inside it, not the notebook elsewhere
    rows = mem_profile.largest_allocations(snapshot, 3, root)
    assert [row["sites"] for row in rows] == ["BmmBackward0 > bmm (no Python frame: autograd's C++ backward) (x1)",
                                              "cell.py:3 <module> (outside the project) (x1)",
                                              "pkg_model/layers/linear.py:36 forward (x19)"]
    narrower = mem_profile.largest_allocations(snapshot, 3, root / "pkg_train")
    assert narrower[-1]["sites"] == "train.py:80 main (x19)"  # --code-root: whose lines are named
    assert mem_profile.code_root({"segments": [], "device_traces": [[event("alloc", 1, 1, 1)]]}) is None


def test_cpp_only_stacks_are_named_by_their_first_meaningful_frame():
    def names(*functions: str) -> list[str]:
        return list(functions)
    assert mem_profile.cpp_site(names("at::_ops::sum_dim_IntList::call(at::Tensor const&)")) == \
        "sum_dim_IntList (no Python frame: C++ operator)"
    assert mem_profile.cpp_site(names("torch::unwind::unwind()", "my_extension::launch(int)")) == \
        "my_extension::launch (no Python frame: C++)"
    assert mem_profile.cpp_site(names("torch::unwind::unwind()", "??")).startswith("(no Python frame")


# ---- the CUDA-only recording, with fakes ----


class FakeCuda:
    """Stands in for the torch.cuda calls record_snapshot makes, and remembers them. `allocated` is what
    max_memory_allocated says: the requested peak (24 MiB, the synthetic trace's) plus the allocator's rounding."""

    def __init__(self, monkeypatch, allocated: int = 24 * MIB):
        self.calls: list[tuple] = []
        for name in ("synchronize", "reset_peak_memory_stats"):
            monkeypatch.setattr(torch.cuda, name, lambda *a, _n=name, **k: self.calls.append((_n,)))
        monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda *a: allocated)
        monkeypatch.setattr(torch.cuda, "memory_stats", lambda *a: {"requested_bytes.all.peak": 24 * MIB})
        monkeypatch.setattr(torch.cuda.memory, "_record_memory_history",
                            lambda enabled="all", **k: self.calls.append(("record", enabled, k.get("max_entries"))))
        monkeypatch.setattr(torch.cuda.memory, "_snapshot", lambda *a, **k: synthetic_snapshot())


def marked_step(fail: bool = False):
    def step(mark=lambda phase: None):
        for phase in ("forward", "backward", "optimizer"):
            mark(phase)
            if fail:
                raise torch.OutOfMemoryError("CUDA out of memory (fake)")
        mark("end")
    return step


def test_record_snapshot_records_one_step_and_always_stops_recording(tmp_path, monkeypatch):
    cuda = FakeCuda(monkeypatch)
    path = str(tmp_path / "s.pickle")
    out = mem_profile.record_snapshot(marked_step(), torch.device("cuda"), path, max_entries=1_000_000)
    records = [c for c in cuda.calls if c[0] == "record"]
    assert records == [("record", "all", 1_000_000), ("record", None, None)]
    assert cuda.calls.index(("reset_peak_memory_stats",)) < cuda.calls.index(records[0])
    assert [m[0] for m in out["snapshot_meta"]["phase_marks"]] == ["forward", "backward", "optimizer", "end"]
    meta = json.loads(mem_profile.snapshot_meta_path(path).read_text())
    assert meta["max_memory_allocated_bytes"] == 24 * MIB and meta["requested_bytes_peak"] == 24 * MIB
    assert mem_profile.load_snapshot(path)["device_traces"]  # torch's own dump loads through the safe reader
    failing = FakeCuda(monkeypatch)
    with pytest.raises(torch.OutOfMemoryError):
        mem_profile.record_snapshot(marked_step(fail=True), torch.device("cuda"), str(tmp_path / "t.pickle"), 10)
    assert [c for c in failing.calls if c[0] == "record"][-1] == ("record", None, None)


@pytest.mark.parametrize("mode, phases", [("forward", ["forward"]), ("forward-backward", ["forward", "backward"]),
                                          ("train", ["forward", "backward", "optimizer"])])
def test_the_peak_is_measured_on_bench_e2es_step_phase_by_phase(mode: str, phases: list[str], monkeypatch):
    """measure_peak (CUDA in a real run) on a CPU: bench_e2e's step for the mode, its phases marked for the
    timeline, the timed steps recorded; a train step changes the weights, and no gradient outlives a step."""
    marks, workloads = [], []
    build = mem_profile.Workload

    def kept(run):
        workloads.append(build(run))
        return workloads[-1]

    monkeypatch.setattr(mem_profile, "Workload", kept)
    monkeypatch.setattr(mem_profile, "record_snapshot", lambda step, *_: step(marks.append) or {})
    run = run_of(mode=mode, warmup=1, steps=2)
    record = mem_profile.measure_peak(run, snapshot_path="unused", max_entries=1)
    assert len(record["step_ms"]) == 2 and "peak_mem_allocated_bytes" not in record  # no peak counter on a CPU
    assert marks == phases + ["end"]
    model = workloads[0].model
    assert all(p.grad is None for p in model.parameters())
    weights = [p.detach().clone() for p in model.parameters()]
    workloads[0].untimed_step()
    assert any(not torch.equal(w, p) for w, p in zip(weights, model.parameters())) == (mode == "train")


def test_cuda_report_has_peak_tables_and_a_snapshot_section_without_false_mismatch(tmp_path, monkeypatch):
    snap = write_snapshot(tmp_path, measured=None)
    rounded = int(24 * MIB * 1.025)  # large models: max_memory_allocated counts rounded blocks, 2-3% above

    def fake_peak(run, snapshot_path, max_entries):
        Path(snapshot_path).write_bytes(snap.read_bytes())
        return {"environment": {"device": "cuda:0", "device_name": "Fake GPU", "torch": torch.__version__,
                                "cuda": "12.8", "tf32_matmul": False, "threads": 1},
                "peak_mem_allocated_bytes": 3 * 2**30, "peak_mem_reserved_bytes": 4 * 2**30, "step_ms": [10.0],
                "step_ms_mean": 10.0, "snapshot_path": snapshot_path,
                "snapshot_meta": {"phase_marks": MARKS, "max_memory_allocated_bytes": rounded,
                                  "requested_bytes_peak": 24 * MIB}}

    monkeypatch.setattr(mem_profile, "measure_peak", fake_peak)
    monkeypatch.setattr(mem_profile, "resolve_device", lambda name: torch.device("cuda"))
    assert mem_profile.main(["--size", "tiny", "--context-length", "16", "--mode", "train", "--snapshot",
                             "--in-process", "--results-dir", str(tmp_path), "--out", "c"]) == 0
    (record,) = read_records(tmp_path / "memory" / "c.jsonl")
    text = report.render_memory([record], "github")
    assert "### Peak memory" in text and "3072.00" in text  # 3 GiB allocated, in MiB
    by_context = text.split("### Peak allocated memory per context length")[1]
    assert "|   fp32 train GiB |" in by_context and "| tiny   |    16 |            3.000 |" in by_context
    assert "#### Snapshot: tiny ctx=16 train fp32 naive" in text and "ok (exact)" in text and "24.60" in text
    assert record["snapshot_peak_check"]["allocator_rounding_bytes"] == rounded - 24 * MIB
    assert Path(record["snapshot_png"]).is_file() and Path(record["snapshot_html"]).is_file()


# ---- the CPU path and bad input ----


def test_cpu_run_prints_accounting_and_saved_tables_and_never_touches_cuda(tmp_path, capsys, monkeypatch):
    def forbidden(*args, **kwargs):
        raise AssertionError("a CUDA-only call was reached on a CPU run")

    for name in ("_record_memory_history", "_snapshot"):
        monkeypatch.setattr(torch.cuda.memory, name, forbidden)
    for name in ("max_memory_allocated", "reset_peak_memory_stats", "synchronize"):
        monkeypatch.setattr(torch.cuda, name, forbidden)
    argv = ["--size", "tiny", "--d-model", "64", "--d-ff", "128", "--num-layers", "1", "--vocab-size", "256",
            "--context-length", "16", "32", "--mode", "forward", "train", "--attn", "naive", "sdpa", "--snapshot",
            "--device", "cpu", "--results-dir", str(tmp_path), "--out", "cpu"]
    assert mem_profile.main(argv) == 0
    out = capsys.readouterr().out
    assert "### Accounting" in out and "### Saved for backward" in out and "16 x 16 x 16 x 4 B" in out
    assert "measured peaks and snapshots need a CUDA device" in out and "### Peak memory" not in out
    assert "autocast" not in out  # fp32: nothing ran under it
    assert "Model sizes from handout 2026 (v26.1.1):" in out and "sizes from: handout 2026 (v26.1.1)" in out
    assert re.search(r"\| tiny +\| +64 \| +128 \| +1 \| +16 \| +256 \|", out)  # the shape that ran
    records = read_records(tmp_path / "memory" / "cpu.jsonl")
    assert len(records) == 8 and all(r["status"].startswith("skipped") for r in records)
    assert all(r["saved_status"] == "ok" for r in records)


@pytest.mark.parametrize("argv, message", [
    (["--size", "huge"], "unknown preset 'huge'"),
    (["--context-length", "0"], "must be a positive integer"),
    (["--analyze", "/nonexistent.pickle"], "no such file"),
    (["--size", "10B", "--handout", "2025"], "preset '10B' is in handout 2026's table, not in handout 2025's"),
    (["--size", "2.7B"], "preset '2.7B' is in handout 2025's table, not in handout 2026's"),
    (["--handout", "2024"], "invalid choice: '2024'"),
    (["--analyze", "x.pickle", "--dry-run"], "--analyze runs none"),
    (["--code-root", "/x"], "--code-root goes with --analyze"),
    (["--columns", "peak"], "valid columns: size, ctx, mode, dtype"),
    (["--size", "xl", "--num-heads", "7"], "num_heads"),
    (["--d-model", "0"], "--d-model: must be a positive integer"),
    pytest.param(["--device", "cuda"], "CUDA is not available",
                 marks=pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")),
])
def test_bad_input_exits_2_with_one_line(argv, message, capsys):
    with pytest.raises(SystemExit) as exit_:
        mem_profile.parse_args(argv)
    err = capsys.readouterr().err.strip().splitlines()
    assert exit_.value.code == 2 and message in err[-1] and not any("Traceback" in line for line in err)


# ---- handouts, --dry-run and the per-context peak table ----


def test_default_size_and_contexts_are_the_handouts_memory_question(monkeypatch):
    def parse(*argv):
        runs = mem_profile.parse_args([*argv, "--device", "cpu"])[1]
        return (list(dict.fromkeys(r.size for r in runs)), list(dict.fromkeys(r.context_length for r in runs)),
                {r.batch_size for r in runs}, {r.handout for r in runs})

    assert parse() == (["xl"], [128, 2048], {4}, {"2026"})
    assert parse("--handout", "2025") == (["2.7B"], [128, 256, 512], {4}, {"2025"})
    # gradient_checkpointing (b) of 2026: xl, batch 4, context 2048; 2025 has no such question
    assert parse("--mode", "train", "--checkpoint", "0", "2", "4") == (["xl"], [2048], {4}, {"2026"})
    assert parse("--handout", "2025", "--checkpoint", "2") == (["2.7B"], [128, 256, 512], {4}, {"2025"})
    assert parse("--size", "tiny") == (["tiny"], [128, 2048], {4}, {"2026"})  # what is given wins
    assert parse("--context-length", "64", "--batch-size", "2", "--checkpoint", "1") == (["xl"], [64], {2}, {"2026"})
    monkeypatch.setenv("CS336_HANDOUT", "2025")
    assert parse() == (["2.7B"], [128, 256, 512], {4}, {"2025"})
    _, runs = mem_profile.parse_args(["--size", "xl", "--num-heads", "16", "--compile", "--handout", "2026",
                                      "--device", "cpu"])
    assert {(r.model.num_heads, r.model.d_model, r.compile) for r in runs} == {(16, 2560, True)}
    _, runs = mem_profile.parse_args(["--size", "tiny", "--d-model", "64", "--d-ff", "128", "--num-layers", "2",
                                      "--vocab-size", "512", "--context-length", "32", "--device", "cpu"])
    assert {dataclasses.astuple(r.model) for r in runs} == {dataclasses.astuple(
        dataclasses.replace(TINY, d_model=64, d_ff=128, num_layers=2, vocab_size=512, context_length=32))}


def test_dry_run_lists_the_plan_and_builds_nothing(tmp_path, capsys, monkeypatch):
    def forbidden(*args, **kwargs):
        raise AssertionError("--dry-run built a model or started a configuration")

    for name in ("build_model", "measure"):
        monkeypatch.setattr(mem_profile, name, forbidden)
    monkeypatch.setattr(mem_profile.runner, "run_configurations", forbidden)
    assert mem_profile.main(["--handout", "2025", "--dtype", "fp32", "bf16", "--device", "cpu", "--dry-run",
                             "--results-dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert not (tmp_path / "memory").exists()
    assert "Model sizes from handout 2025 (Spring 2025):" in out and "| 2.7B " in out
    assert "dry run: 12 configurations would run" in out
    assert "   1. 2.7B ctx=128 forward fp32 naive\n   2. 2.7B ctx=128 forward bf16 naive\n" in out
    assert "  12. 2.7B ctx=512 train bf16 naive\n" in out


def peak_record(size, ctx, mode, dtype, peak_gib=None, status="ok", ckpt=0):
    record = {"config": {"size": size, "model": {"context_length": ctx}, "mode": mode, "dtype": dtype,
                         "attn": "naive", "checkpoint_every": ckpt, "optimizer": "ours"}, "status": status}
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
               peak_record("xl", 2048, "train", "fp32", status="OOM"), peak_record("xl", 2048, "train", "bf16", 75.75)]
    header, *rows = table_cells(report.peak_by_context_table(records, "github"))
    assert header == ["size", "ctx", "fp32 forward GiB", "fp32 train GiB", "bf16 forward GiB", "bf16 train GiB"]
    assert rows == [["xl", "128", "13.500", "52.125", "14.250", "50.000"],
                    ["xl", "2048", "20.000", "OOM", "18.500", "75.750"]]


def test_peak_per_context_table_shows_what_varies_and_nothing_unmeasured():
    records = [peak_record("tiny", 16, "forward", "fp32", 1.0), peak_record("tiny", 16, "train", "fp32", 3.0),
               peak_record("tiny", 16, "train", "fp32", 2.0, ckpt=2)]
    header, *rows = table_cells(report.peak_by_context_table(records, "github"))
    assert header == ["size", "ctx", "ckpt", "fp32 forward GiB", "fp32 train GiB"]
    assert rows == [["tiny", "16", "0", "1.000", "3.000"], ["tiny", "16", "2", "", "2.000"]]
    skipped = [peak_record("tiny", 16, "train", "fp32", status="skipped: measured peaks need a CUDA device")]
    assert report.peak_by_context_table(skipped, "github") is None


def test_num_heads_changes_what_a_block_saves():
    small = dict(d_model=64, d_ff=128, num_layers=1, vocab_size=256, context_length=64)
    per_block = {heads: mem_profile.summarize_saved(mem_profile.saved_for_backward(
        run_of(ModelConfig(num_heads=heads, **small))))["saved_block_bytes_mean"] for heads in (2, 4)}
    assert per_block[4] > per_block[2]  # more heads, more S x S tensors
