"""Your own code measured by our scripts: MODULE:CALLABLE specs (common.py), your model (build_model,
bench_e2e --model, mem_profile --model, nsys_run.sh's pass-through), your optimizer (--optimizer MODULE:CLASS) and
the FLOPs behind TFLOP/s and MFU (--flops). Test-local modules written to a temporary current directory stand in
for the student's code. (Your attention kernel: test_bench_attention.py.)"""
from __future__ import annotations

import argparse
import sys

import pytest
import torch

import bench_e2e
import common
import mem_profile
import results
import runner
from model import ADAMW_SETTINGS, STAFF_MODEL_KEYWORDS, build_model, build_optimizer
from results import read_records

# A student's model and optimizers. TinyLM has the staff constructor's exact signature but is not our architecture
# (blocks of one Linear each, lm_head tied to the embedding), so its FLOPs are not our formula's:
# forward = 2 * tokens * (num_layers * d_model^2 + d_model * vocab), and backward twice that.
STUDENT_LM = '''
import torch
import torch.nn as nn
import torch.nn.functional as F


class Block(nn.Module):
    def __init__(self, d_model):
        super().__init__()
        self.linear = nn.Linear(d_model, d_model, bias=False)

    def forward(self, x):
        return x + torch.relu(self.linear(x))


class TinyLM(nn.Module):
    def __init__(self, vocab_size: int, context_length: int, d_model: int, num_layers: int, num_heads: int,
                 d_ff: int, rope_theta: float):
        super().__init__()
        self.embedding = nn.Embedding(vocab_size, d_model)
        self.layers = nn.ModuleList(Block(d_model) for _ in range(num_layers))

    def forward(self, token_ids):
        x = self.embedding(token_ids)
        for layer in self.layers:
            x = layer(x)
        return F.linear(x, self.embedding.weight)


class LastPositionOnly(TinyLM):
    def forward(self, token_ids):
        return super().forward(token_ids)[:, -1]


def not_a_module(**keywords):
    return {"d_model": keywords["d_model"]}


def from_config(config):
    return TinyLM(**config)


class SGD(torch.optim.Optimizer):
    def __init__(self, params, lr):
        super().__init__(params, {"lr": lr})

    @torch.no_grad()
    def step(self):
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is not None:
                    p.add_(p.grad, alpha=-group["lr"])


class NoLearningRate(SGD):
    def __init__(self, params):
        super().__init__(params, lr=0.1)


def not_an_optimizer(params, lr):
    return [lr]
'''

# a custom size small enough for a loaded 2-core CPU
SMALL = ["--d-model", "32", "--d-ff", "64", "--num-layers", "2", "--num-heads", "2", "--vocab-size", "64",
         "--context-length", "16", "--batch-size", "2", "--warmup", "0", "--steps", "2", "--device", "cpu",
         "--in-process"]
SMALL_CONFIG = results.ModelConfig(d_model=32, d_ff=64, num_layers=2, num_heads=2, vocab_size=64,
                                        context_length=16)


@pytest.fixture
def student(tmp_path, monkeypatch):
    """student_lm.py in a directory made the current one; imported fresh, sys.path restored afterwards."""
    folder = tmp_path / "student"
    folder.mkdir()
    (folder / "student_lm.py").write_text(STUDENT_LM)
    monkeypatch.chdir(folder)
    monkeypatch.delitem(sys.modules, "student_lm", raising=False)
    monkeypatch.setattr(sys, "path", list(sys.path))
    yield folder
    sys.modules.pop("student_lm", None)


def tiny_lm_train_flops(cfg: results.ModelConfig, batch: int) -> int:
    """TinyLM's training-step FLOPs (the comment above STUDENT_LM)."""
    tokens = batch * cfg.context_length
    return 3 * 2 * tokens * (cfg.num_layers * cfg.d_model**2 + cfg.d_model * cfg.vocab_size)


# ---- the spec and the loader ----


@pytest.mark.parametrize("text,name", [("student_lm:TinyLM", "student_lm:TinyLM"), ("a:B.c", "a:B.c"),
                                       ("staff=cs336_basics.model:BasicsTransformerLM", "staff"), ("ours", "ours"),
                                       ("flash-v2.1=flash:Outer.Inner", "flash-v2.1")])
def test_spec_forms_accepted_and_named(text, name):
    assert common.named_or_spec(["ours"])(text) == text
    given, spec = common.named_model(text)  # what tables and records call it: NAME, else the value
    assert (given or spec) == name


@pytest.mark.parametrize("text", ["student_lm", "student_lm:", ":TinyLM", "a:b:c", "a-b:c", "a:1b", "a.:b", "torch",
                                  "=a:b", "a b=c:d"])
def test_spec_forms_refused_as_usage_errors(text):
    with pytest.raises(argparse.ArgumentTypeError, match=r"choose from ours, or \[NAME=\]MODULE:CALLABLE for your"):
        common.named_or_spec(["ours"])(text)


def test_load_finds_the_current_directory_and_says_why_not_in_one_line(student):
    assert common.load("student_lm:TinyLM").__name__ == "TinyLM"
    assert common.load("mine=student_lm:TinyLM").__name__ == "TinyLM"  # NAME= only names it
    assert common.load("student_lm:SGD.step").__name__ == "step"  # a dotted attribute
    (student / "broken_syntax.py").write_text("def f(:\n")
    (student / "needs_triton.py").write_text("import a_package_nobody_installed\n")
    cases = {"nowhere_lm:TinyLM": "cannot import nowhere_lm (for nowhere_lm:TinyLM): no module named 'nowhere_lm' in "
                                  f"the current directory ({student})",
             "student_lm:Missing": "student_lm (",
             "broken_syntax:f": "importing broken_syntax (for broken_syntax:f) failed: SyntaxError: ",
             "needs_triton:f": "failed: ModuleNotFoundError: No module named 'a_package_nobody_installed'"}
    for spec, message in cases.items():
        with pytest.raises(common.LoadError) as exc:
            common.load(spec)
        assert message in str(exc.value) and "\n" not in str(exc.value), str(exc.value)
    with pytest.raises(common.LoadError, match=r"has no 'Missing' \(for student_lm:Missing\)"):
        common.load("student_lm:Missing")
    with pytest.raises(common.LoadError, match=r"broken_syntax.py, line 1\)"):
        common.load("broken_syntax:f")
    (student / "optim.py").write_text("raise SystemExit('an impostor ran')\n")  # named as one of ours
    with pytest.raises(common.LoadError, match=r"optim.py has the name of this toolkit's optim.py: rename it"):
        common.load("optim:AdamW")


def test_your_module_importing_your_own_module_named_as_ours_is_refused(student):
    """Python would hand `from optim import AdamW` this toolkit's optim, already imported: a table would then
    compare ours with ours under your name."""
    (student / "optim.py").write_text("class AdamW: pass\n")
    (student / "my_opt.py").write_text("import torch\nfrom optim import AdamW\n")
    (student / "model.py").write_text("")
    (student / "pkg").mkdir()
    (student / "pkg" / "lm.py").write_text("import model\n")
    for spec, theirs in (("my_opt:AdamW", student / "optim.py"), ("pkg.lm:make", student / "model.py")):
        with pytest.raises(common.LoadError) as exc:
            common.load(spec)
        assert f"but this toolkit's {theirs.stem}.py would run in place of {theirs}: rename yours" in str(exc.value)
    (student / "model.py").unlink()
    (student / "uses_ours.py").write_text("from model import TransformerLM\n")  # no model.py of yours: ours meant
    assert common.load("uses_ours:TransformerLM").__name__ == "TransformerLM"


# ---- your model and optimizer, built where ours are ----


def test_build_model_calls_your_factory_with_the_staff_keywords(student):
    model = build_model(SMALL_CONFIG, factory="student_lm:TinyLM")
    assert type(model).__name__ == "TinyLM" and model.embedding.weight.shape == (64, 32)
    assert list(STAFF_MODEL_KEYWORDS) == ["vocab_size", "context_length", "d_model", "num_layers", "num_heads",
                                                 "d_ff", "rope_theta"]
    with pytest.raises(common.LoadError, match="cannot be called with the staff model's keywords"):
        build_model(SMALL_CONFIG, factory="student_lm:from_config")
    with pytest.raises(common.LoadError, match="returned a dict, not a torch.nn.Module"):
        build_model(SMALL_CONFIG, factory="student_lm:not_a_module")
    assert type(build_model(SMALL_CONFIG)).__name__ == "TransformerLM"  # ours without a factory


def test_build_optimizer_yours_beside_ours(student):
    params = [torch.nn.Parameter(torch.ones(3))]
    sgd = build_optimizer("student_lm:SGD", params, torch.device("cpu"))
    assert type(sgd).__name__ == "SGD" and sgd.param_groups[0]["lr"] == ADAMW_SETTINGS["lr"]
    assert build_optimizer("student_lm:NoLearningRate", params, torch.device("cpu")).param_groups[0]["lr"] == 0.1
    with pytest.raises(common.LoadError, match="made a list, which has no step"):
        build_optimizer("student_lm:not_an_optimizer", params, torch.device("cpu"))
    assert type(build_optimizer("torch.optim:SGD", params, torch.device("cpu"))) is torch.optim.SGD


def test_optimizer_help_says_the_keywords_it_passes():
    parser = argparse.ArgumentParser()
    common.add_model_args(parser, "ours", flops=False)
    (help_text,) = [a.help for a in parser._actions if a.dest == "optimizer"]
    assert f"CLASS(params, {', '.join(f'{k}={v}' for k, v in ADAMW_SETTINGS.items())})" in help_text


@pytest.mark.parametrize("script", [bench_e2e, mem_profile])
def test_a_model_given_twice_runs_once_and_says_so(script, capsys):
    args = script.parse_args(["--model", "ours", "mine=student_lm:TinyLM", "ours", "--device", "cpu"])[0]
    assert len(args.model) == 2  # ours, then yours
    assert "note: --model ours is given 2 times: it runs once" in capsys.readouterr().err


def test_logits_of_the_wrong_shape_fail_the_first_forward(student):
    run = runner.RunConfig(size="custom", model=SMALL_CONFIG, batch_size=2, mode="forward", device="cpu",
                           model_factory="student_lm:LastPositionOnly")
    work = runner.Workload(run)
    with pytest.raises(ValueError, match=r"student_lm:LastPositionOnly returned \(2, 64\) torch.float32 for token "
                                         r"ids \(2, 16\); expected floating-point logits \(batch, seq, vocab\) = "
                                         r"\(2, 16, 64\)"):
        work.forward()


# ---- bench_e2e --model, --optimizer, --flops ----


def run_e2e(tmp_path, *argv):
    code = bench_e2e.main([*SMALL, *argv, "--results-dir", str(tmp_path)])
    (jsonl,) = (tmp_path / "e2e").glob("*.jsonl")
    return code, read_records(jsonl)


def test_counted_flops_see_sdpa_on_a_cpu_too(tmp_path):
    """As torch counts its CUDA kernels: our formula, plus backward's recomputed Q K^T (flash attention's)."""
    code, (record,) = run_e2e(tmp_path, "--attn", "sdpa", "--flops", "counted")
    recomputed = SMALL_CONFIG.num_layers * 2 * 2 * 16 * 16 * SMALL_CONFIG.d_model  # 2 B S^2 d per layer, batch 2
    assert code == 0 and record["counted_step_flops"] == results.step_flops(SMALL_CONFIG, 2, 16, "train") + recomputed


def test_your_model_beside_ours_counted_flops_and_the_model_named(student, tmp_path, capsys):
    code, records = run_e2e(tmp_path, "--model", "ours", "student_lm:TinyLM", "--flops", "counted")
    assert code == 0 and [r["status"] in ("ok", "noisy") for r in records] == [True, True]
    ours, yours = records
    assert ours["config"]["model_factory"] is None and yours["config"]["model_factory"] == "student_lm:TinyLM"
    # counted on one untimed step: ours equals the formula exactly; yours is what its two matmuls per block cost
    assert ours["counted_step_flops"] == results.step_flops(SMALL_CONFIG, 2, 16, "train")
    assert yours["counted_step_flops"] == tiny_lm_train_flops(SMALL_CONFIG, 2)
    assert yours["step_flops"] == yours["counted_step_flops"] and yours["flops_source"] == "counted"
    assert yours["achieved_tflops"] > 0
    out = capsys.readouterr().out
    assert "model: ours (model.TransformerLM) and student_lm:TinyLM" in out
    assert "FLOPs: torch.utils.flop_counter.FlopCounterMode, one untimed step" in out
    assert "| student_lm:TinyLM " in out  # the model column
    assert "## Comparison: ours vs student_lm:TinyLM" in out


def test_flops_of_your_model_only_when_you_say(student, tmp_path, capsys):
    code, (record,) = run_e2e(tmp_path / "a", "--model", "student_lm:TinyLM")
    assert code == 0 and record["config"]["flops"] == "none"
    assert record["step_flops"] is None and record["achieved_tflops"] is None and record["mfu"] is None
    assert record["tokens_per_s"] > 0
    assert "FLOPs: none (no TFLOP/s, no MFU)" in capsys.readouterr().out
    code, (record,) = run_e2e(tmp_path / "b", "--model", "student_lm:TinyLM", "--flops", "formula")
    assert record["step_flops"] == results.step_flops(SMALL_CONFIG, 2, 16, "train")  # you confirmed it


def test_a_model_with_the_wrong_output_is_a_row_and_the_sweep_goes_on(student, tmp_path, capsys):
    code, records = run_e2e(tmp_path, "--model", "student_lm:LastPositionOnly", "ours", "--mode", "forward")
    assert code == 0
    assert records[0]["status"].startswith("error: ValueError: student_lm:LastPositionOnly returned (2, 64)")
    assert records[1]["status"] in ("ok", "noisy")


def test_your_optimizer_beside_ours(student, tmp_path, capsys):
    code, records = run_e2e(tmp_path, "--optimizer", "ours", "student_lm:SGD")
    assert code == 0 and [r["config"]["optimizer"] for r in records] == ["ours", "student_lm:SGD"]
    assert all(r["status"] in ("ok", "noisy") and r["optimizer_ms_mean"] > 0 for r in records)
    assert "optimizer=student_lm:SGD" in records[1]["label"]
    assert "## Comparison: our AdamW vs student_lm:SGD" in capsys.readouterr().out


@pytest.mark.parametrize("script, argv, message", [
    (bench_e2e, ["--model", "student_lm"], "invalid choice: 'student_lm' (choose from ours, or [NAME=]MODULE:CALLABLE"),
    (bench_e2e, ["--model", "student_lm:TinyLM", "--attn", "sdpa"], "--attn changes our model only"),
    (bench_e2e, ["--optimizer", "sgd"], "invalid choice: 'sgd' (choose from ours, torch, or [NAME=]MODULE:CALLABLE"),
    (bench_e2e, ["--flops", "measured"], "invalid choice: 'measured'"),
    (mem_profile, ["--model", "student_lm:TinyLM", "--checkpoint", "2"], "--checkpoint changes our model only"),
])
def test_usage_errors_exit_2_with_one_line(script, argv, message, capsys):
    with pytest.raises(SystemExit) as exc:
        script.parse_args(["--device", "cpu", *argv])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and message in err and len(err.strip().splitlines()) == 1


def test_dry_run_rows_of_your_model_are_not_multiplied_by_our_attention(student, capsys):
    _, runs = bench_e2e.parse_args(["--device", "cpu", "--model", "ours", "student_lm:TinyLM", "--attn", "naive",
                                    "sdpa"])
    assert [run.label() for run in runs] == ["tiny ctx=512 train fp32 naive warmup=5",
                                             "tiny ctx=512 train fp32 sdpa warmup=5",
                                             "tiny ctx=512 train fp32 student_lm:TinyLM warmup=5"]
    assert [run.flops for run in runs] == ["formula", "formula", "none"]


# ---- mem_profile --model, nsys_run.sh -- --model ----


def test_mem_profile_saved_for_backward_and_accounting_of_your_model(student, tmp_path, capsys):
    argv = ["--size", "tiny", "--context-length", "16", "--batch-size", "2", "--mode", "train", "--device", "cpu",
            "--model", "student_lm:TinyLM", "--results-dir", str(tmp_path)]
    assert mem_profile.main(argv) == 0
    (record,) = read_records(next((tmp_path / "memory").glob("*.jsonl")))
    tiny = results.get_config("tiny", context_length=16)
    params = tiny.vocab_size * tiny.d_model + tiny.num_layers * tiny.d_model**2  # tied head: embedding + blocks
    assert record["model_num_params"] == params and record["weights_bytes"] == 4 * params
    assert record["saved_status"] == "ok" and record["saved_blocks_bytes"] > 0  # its blocks are layers.N
    out = capsys.readouterr().out
    assert "model: student_lm:TinyLM" in out and "| student_lm:TinyLM " in out
