"""leaderboard.py: the behaviour check, do_bench's headline and the split on a scaled-down CPU step, the record that
report.py renders again, the refusals; and the house rule that experiment scripts import shared modules only."""
import ast
import math
import os
import sys
import tempfile
from pathlib import Path

import pytest
import torch

import bench_e2e
import common
import leaderboard
import report
import results
from results import read_records
from test_bench_e2e import cells, tagged

HERE = Path(__file__).resolve().parent
# the behaviour check called directly: the check's 2 layers and 2 heads at a small width and context (seconds less)
SMALL = results.ModelConfig(d_model=64, d_ff=168, num_layers=2, num_heads=2, vocab_size=256, context_length=64)


LEADERBOARD = ["--device", "cpu", "--num-layers", "1", "--d-model", "64", "--num-heads", "2", "--d-ff", "128",
               "--vocab-size", "256", "--context-length", "32", "--steps", "2", "--warmup", "1", "--rep-ms", "5",
               "--warmup-ms", "1"]


def w2_scaled(**kw):
    """Ours, but layer 0's w2 acts as 1.5 x its weight: one weight changed, behind the same names."""
    m = tagged("w2", **kw)
    w2 = m.layers[0].ffn.w2
    w2.forward = lambda x: torch.nn.functional.linear(x, 1.5 * w2.weight)
    return m


def renamed(**kw):
    m = tagged("renamed", **kw)
    m.head = m.lm_head
    del m.lm_head
    m.forward = lambda tokens: m.head(m.ln_final(m._run_layers(m.token_embeddings(tokens), 0, len(m.layers))))
    return m


def renamed_map(m):
    return {n: n.replace("head.", "lm_head.", 1) if n.startswith("head.") else n for n, _ in m.named_parameters()}


def run_leaderboard(tmp_path, *extra, out="lb"):
    code = leaderboard.main([*LEADERBOARD, "--results-dir", str(tmp_path), "--out", out, *extra])
    return code, read_records(tmp_path / "e2e" / f"{out}.jsonl")


def test_leaderboard_checks_then_times_a_full_step_with_the_sync_timer(tmp_path, capsys):
    code, (record,) = run_leaderboard(tmp_path)  # in a child process, as every run
    out = capsys.readouterr().out
    assert code == 0 and record["check"]["ok"] and record["check"]["reference"] == "ours" and record["pid"]
    assert record["check"]["max_error"] < leaderboard.CHECK_TOLERANCE and record["check"]["steps"] == 3
    assert record["check"]["shape"]["d_model"] == 2 * 32 and record["check"]["shape"]["context_length"] == 512
    assert record["recheck"]["ok"] and record["recheck"]["shape"]["context_length"] == 32  # the timed objects
    assert record["trained_dtypes"] == ["float32"] and record["global_settings_changed"] == {}
    lb = record["leaderboard"]
    assert lb["method"] == "sync timer" and lb["ms"] > 0
    assert (lb["warmup_ms"], lb["rep_ms"]) == (1, 5)
    assert lb["calls_in_all"] == 1 + 5 + lb["warmup_calls"] + lb["calls"] and lb["clocks_disagree"] < 0.05
    assert all(len(record[f"{p}_ms"]) == 2 for p in ("forward", "backward", "optimizer", "step"))
    assert record["config"]["dtype"] == "bf16" and record["config"]["batch_size"] == 2
    assert record["wall_s"] > 0 and record["over_10_min"] is False and record["config"]["world_size"] == 1
    assert "a scaled-down shape" in out and "| 2026 best" in out and "not comparable" in out and "3,837" in out
    md = (tmp_path / "e2e" / "lb.md").read_text()  # the report again from the record alone, in any format
    assert report.main([str(tmp_path / "e2e" / "lb.jsonl"), "--results-dir", str(tmp_path / "again")]) == 0
    assert md.strip() in capsys.readouterr().out and "## Where it stands" in md and "| 2026 best" in md
    assert report.main([str(tmp_path / "e2e" / "lb.jsonl"), "--fmt", "latex_booktabs", "--results-dir",
                        str(tmp_path / "tex")]) == 0
    tex = next((tmp_path / "tex").rglob("*.tex")).read_text()
    assert "2026 best" in tex and "sync timer" in tex and "|" not in tex.split("Where it stands")[1]


def test_a_compiled_step_is_timed_after_its_compiling_call_and_agrees_with_the_split(tmp_path, monkeypatch):
    """--compile: the first call compiles, from empty caches in a folder made for the run and removed after it; the
    headline is the mean of the calls after the estimate and the warm-up, close to the split's step. torch.compile
    here is dynamo's real capture with a backend that records the caches it would fill and runs the graph as
    captured: inductor's cold compile is a minute of g++ on this machine, and test_bench_e2e compiles a
    training step with it."""
    caches = []

    def recording_backend(graph, example_inputs):
        caches.append({name: os.environ[name] for name in ("TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR")})
        return graph.forward

    compile = torch.compile
    monkeypatch.setattr(torch, "compile", lambda model, **kw: compile(model, backend=recording_backend, **kw))
    code, (record,) = run_leaderboard(tmp_path, "--compile", "--in-process", "--rep-ms", "200", "--warmup-ms", "20",
                                      "--steps", "3")
    torch._dynamo.reset()
    lb = record["leaderboard"]
    assert code == 0 and record["recheck"]["ok"], record["status"]
    assert lb["calls"] > 1 and lb["first_call_ms"] > 3 * lb["ms"], lb
    assert 1 / 4 < lb["ms"] / record["step_ms_mean"] < 4, (lb, record["step_ms"])  # this machine's load swings
    (folder,) = {os.path.dirname(path) for paths in caches for path in paths.values()}  # one, for both caches
    assert os.path.basename(folder).startswith("leaderboard-cache-") and not os.path.exists(folder), folder


def test_the_staff_model_is_the_reference_when_cs336_basics_imports(tmp_path, monkeypatch):
    package = tmp_path / "staff" / "cs336_basics"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "model.py").write_text(
        "import model, results\n\n"
        "def BasicsTransformerLM(vocab_size, context_length, d_model, num_layers, num_heads, d_ff, rope_theta):\n"
        "    return model.TransformerLM(results.ModelConfig(d_model, d_ff, num_layers, num_heads, vocab_size,\n"
        "                                                   context_length, rope_theta))\n")
    monkeypatch.syspath_prepend(str(tmp_path / "staff"))
    check = leaderboard.behaviour_check(None, None, torch.device("cpu"), shape=SMALL)
    assert check["reference"] == leaderboard.STAFF_MODEL and check["ok"], check
    assert sys.modules["cs336_basics.model"].__file__.startswith(str(tmp_path))
    for name in ("cs336_basics", "cs336_basics.model"):
        monkeypatch.delitem(sys.modules, name)


def test_one_changed_weight_is_wrong_with_the_tensor_named_and_not_timed(tmp_path, capsys):
    code, (record,) = run_leaderboard(tmp_path, "--model", "w2=test_leaderboard:w2_scaled", "--in-process")
    assert code == 1 and "leaderboard" not in record and not record["check"]["ok"]
    assert record["status"].startswith("WRONG: ") and record["check"]["worst"] in record["status"]
    assert record["check"]["worst"] in ("logits", "loss") or "layers.0" in record["check"]["worst"]
    assert "WRONG" in capsys.readouterr().out


def exits(**kw):
    sys.exit(3)


def test_your_model_calling_sys_exit_is_an_error_row_and_exit_1(tmp_path):
    code, (record,) = run_leaderboard(tmp_path, "--model", "test_leaderboard:exits")
    assert code == 1 and record["status"] == "error: SystemExit: 3"


def test_other_parameter_names_need_the_mapping_hook():
    cpu = torch.device("cpu")
    unmapped = leaderboard.behaviour_check("test_leaderboard:renamed", None, cpu, shape=SMALL)
    assert not unmapped["ok"] and "head.weight match no reference parameter" in unmapped["problem"]
    mapped = leaderboard.behaviour_check("test_leaderboard:renamed", "test_leaderboard:renamed_map", cpu,
                                         shape=SMALL)
    assert mapped["ok"], mapped


class NoWeightDecay(torch.optim.AdamW):
    def __init__(self, params, lr=1e-3):
        super().__init__(params, lr=lr, weight_decay=0.0)


class AlgorithmOne(torch.optim.Optimizer):  # assignment 1's AdamW, as the staff's: epsilon beside sqrt(v)
    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01):
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay))

    @torch.no_grad()
    def step(self):
        for group in self.param_groups:
            (b1, b2), lr = group["betas"], group["lr"]
            for p in group["params"]:
                state = self.state[p]
                t = state["t"] = state.get("t", 0) + 1
                m = state["m"] = b1 * state.get("m", 0) + (1 - b1) * p.grad
                v = state["v"] = b2 * state.get("v", 0) + (1 - b2) * p.grad ** 2
                p.mul_(1 - lr * group["weight_decay"])
                p.sub_(lr * math.sqrt(1 - b2 ** t) / (1 - b1 ** t) * m / (v.sqrt() + group["eps"]))


class HiddenDefaults(torch.optim.AdamW):  # the course's defaults in its signature, another lr inside
    def __init__(self, params, **settings):
        super().__init__(params, lr=3e-4)


class Forgetful(torch.optim.AdamW):  # AdamW that forgets its moments and step count after each step
    def step(self, closure=None):
        self.state.clear()
        return super().step(closure)


class NoOpAfterFive(torch.optim.AdamW):  # right for the check's steps, then nothing
    def step(self, closure=None):
        self.calls = getattr(self, "calls", 0) + 1
        return super().step(closure) if self.calls <= 5 else None


_built = []


def right_once(**kw):  # right when the check builds it, wrong when the timed model is built
    _built.append(kw)
    return tagged("once", **kw) if len(_built) == 1 else w2_scaled(**kw)


def frozen_head(**kw):
    m = tagged("frozen", **kw)
    m.lm_head.weight.requires_grad_(False)
    return m


def fused(**kw):  # ours, returning the loss itself when given targets (a head fused with its loss)
    m = tagged("fused", **kw)
    logits_of = m.forward

    def forward(tokens, targets=None):
        logits = logits_of(tokens)
        return logits if targets is None else torch.nn.functional.cross_entropy(logits.flatten(0, 1).float(),
                                                                                targets.flatten())
    m.forward = forward
    return m


def fused_step(model, optimizer, tokens, targets):
    loss = model(tokens, targets)
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return loss


def step_without_update(model, optimizer, tokens, targets):
    loss = model(tokens, targets)
    loss.backward()
    optimizer.zero_grad(set_to_none=True)
    return loss


def torch_loss(logits, targets):
    return torch.nn.functional.cross_entropy(logits.flatten(0, 1).float(), targets.flatten())


class OtherDefaults(torch.optim.AdamW):  # a correct AdamW whose defaults are not the staff's
    def __init__(self, params, lr=1e-2, betas=(0.8, 0.9), eps=1e-6, weight_decay=0.1):
        super().__init__(params, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay)


def test_an_optimizer_step_unlike_adamws_is_wrong_with_the_parameter_named(tmp_path):
    code, (record,) = run_leaderboard(tmp_path, "--optimizer", "test_leaderboard:NoWeightDecay", "--in-process")
    assert code == 1 and "leaderboard" not in record and record["status"].startswith("WRONG: step ")
    assert "against AdamW(lr=0.001, betas=(0.9, 0.999), eps=1e-08, weight_decay=0.01) as torch.optim.AdamW or as " \
        "Algorithm 1 of assignment 1" in record["status"]
    cpu = torch.device("cpu")
    assert not leaderboard.behaviour_check(None, None, cpu, optimizer="torch.optim:SGD", shape=SMALL)["ok"]  # not AdamW
    assert leaderboard.behaviour_check(None, None, cpu, optimizer="torch", shape=SMALL)["ok"]
    other = leaderboard.behaviour_check(None, None, cpu, optimizer="test_leaderboard:OtherDefaults",
                                        shape=SMALL)
    assert not other["ok"] and "default lr is 0.01, the course AdamW's 0.001" in other["problem"]
    hidden = leaderboard.behaviour_check(None, None, cpu, optimizer="test_leaderboard:HiddenDefaults",
                                         shape=SMALL)
    assert not hidden["ok"] and hidden["problem"].startswith("step "), hidden.get("problem")
    forgetful = leaderboard.behaviour_check(None, None, cpu, optimizer="test_leaderboard:Forgetful", shape=SMALL)
    first = [e for k, e in forgetful["errors"].items() if k.startswith("step 1 of ")]
    assert not forgetful["ok"] and max(first) < leaderboard.STEP_TOLERANCE  # right once, wrong from its 2nd step
    algorithm_one = leaderboard.behaviour_check(None, None, cpu, optimizer="test_leaderboard:AlgorithmOne",
                                                shape=SMALL)
    assert algorithm_one["ok"] and algorithm_one["step_reference"] == "Algorithm 1 of assignment 1"
    assert leaderboard.behaviour_check(None, None, cpu, optimizer="ours", shape=SMALL)["ok"]


def test_a_parameter_without_gradient_is_named_as_such():
    check = leaderboard.behaviour_check("test_leaderboard:frozen_head", None, torch.device("cpu"), shape=SMALL)
    assert not check["ok"] and check["problem"] == "lm_head.weight has no gradient (the reference's has one)"


@pytest.mark.parametrize("argv,message", [
    (["--nvtx"], "unrecognized arguments: --nvtx"),  # a sweep's flags are bench_e2e.py's
    (["--model", "ours", "test_leaderboard:renamed"], "give --model and --optimizer one value each"),
    (["--parallel", "fsdp"], "--parallel needs torchrun"),
    (["--dtype", "bf16-weights", "--parallel", "fsdp"], "--dtype bf16-weights runs in one process"),
    (["--loss", "a:b", "--step", "a:c"], "give --loss or --step"),
    (["--context-length", "max"], "invalid int value: 'max'")])
def test_leaderboard_refuses_in_one_line(capsys, argv, message):
    with pytest.raises(SystemExit) as exc:
        leaderboard.parse_args(["--device", "cpu", *argv])
    err = capsys.readouterr().err
    fsdp2_refused = common.fsdp2_unsupported(torch.device("cpu"))  # torch 2.6: FSDP2 on the CPU, in its own line
    assert exc.value.code == 2 and len(err.strip().splitlines()) == 1, err
    assert message in err or ("fsdp" in argv and fsdp2_refused and fsdp2_refused in err), err


def test_bench_e2e_points_to_the_leaderboard_script(capsys):
    with pytest.raises(SystemExit) as exc:
        bench_e2e.parse_args(["--leaderboard", "full", "--model", "mine=my_lm:make_model", "--rep-ms", "5"])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and len(err.strip().splitlines()) == 1 and "python3 leaderboard.py" in err


def test_leaderboard_dry_run_of_the_full_shape_predicts_the_state_per_device(capsys):
    assert leaderboard.main(["full", "--device", "cpu", "--dry-run"]) == 0
    out = capsys.readouterr().out
    params = results.ModelConfig(4096, 11008, 34, 32, 151_936, 32_768).num_params
    assert "the leaderboard's shape: d_model 4096" in out and f"model.TransformerLM's {params:,} parameters" in out
    rows = {r["layout"]: float(r["state per device GiB"]) for r in cells(out, "layout")}
    assert rows["one process"] == pytest.approx(16 * params / 2**30, rel=1e-3)
    assert rows == {"one process": 121.08, "ddp x2": 121.08, "fsdp x2": 60.54}  # 7.8e9 params x 16 bytes (fp32 AdamW)
    assert leaderboard.main(["--device", "cpu", "--dry-run"]) == 0  # scaled: 658,048, not 0.00e9
    assert f"model.TransformerLM's {leaderboard.SCALED.num_params:,} parameters" in capsys.readouterr().out


def test_the_full_shape_refuses_in_one_line_where_it_cannot_fit(capsys, monkeypatch):
    monkeypatch.setattr(common, "free_memory_bytes", lambda device: 80 * 2**30)
    with pytest.raises(SystemExit) as exit_info:
        leaderboard.main(["full", "--device", "cpu"])
    err = capsys.readouterr().err.strip()
    assert exit_info.value.code == 2 and len(err.splitlines()) == 1
    assert "needs 121.1 GiB per device" in err and "80.0 GiB free" in err


def bf16_weights(**kw):
    return tagged("bf16", **kw).to(torch.bfloat16)


def test_the_full_shape_is_predicted_from_your_model_and_force_runs_it_anyway(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(common, "free_memory_bytes", lambda device: 80 * 2**30)
    code = leaderboard.main(["full", "--device", "cpu", "--in-process", "--model", "test_leaderboard:bf16_weights",
                             "--results-dir", str(tmp_path), "--out", "lb"])
    (record,) = read_records(tmp_path / "e2e" / "lb.jsonl")
    params = results.ModelConfig(4096, 11008, 34, 32, 151_936, 32_768).num_params
    assert code == 1 and record["status"].startswith("refused: the training state alone needs 90.8 GiB per device")
    assert f"your model's {params:,} parameters in bfloat16" in record["status"] and "--force" in record["status"]
    assert leaderboard.parse_args(["full", "--device", "cpu", "--force"])[1].size == "leaderboard-full"


def test_leaderboard_time_runs_the_counts_the_ranks_agreed_on():
    """Under torchrun every rank must call the step (and its collectives) equally often: `agree` sets the counts."""
    calls = []
    timed = common.leaderboard_time(lambda: calls.append(1), torch.device("cpu"), warmup_ms=1e6, rep_ms=1e6,
                                    agree=lambda n: 3)
    assert timed["method"] == "sync timer" and timed["calls"] == 3 and len(calls) == 1 + 5 + 3 + 3


def test_a_replaced_clock_shows_as_two_clocks_that_disagree(monkeypatch):
    real = common.clock
    monkeypatch.setattr(common, "clock", lambda: real() / 4)  # a clock a quarter as fast
    timed = common.leaderboard_time(lambda: sum(range(20_000)), torch.device("cpu"), warmup_ms=1, rep_ms=20)
    assert timed["clocks_disagree"] > 0.5 and timed["ms"] < timed["second_clock_ms"]


# ---- the house: experiment scripts stand on shared modules, never on each other ----

EXPERIMENTS = {"bench_e2e", "bench_attention", "mem_profile", "precision_demo", "toy_autocast", "study", "leaderboard"}


def project_imports() -> dict[str, set[str]]:
    """Each root module (tests aside) -> the root modules it imports anywhere in its source, functions included."""
    modules = {p.stem: p for p in HERE.glob("*.py") if not p.name.startswith("test_") and p.name != "conftest.py"}
    graph = {}
    for name, path in modules.items():
        found = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                found |= {a.name.split(".")[0] for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                found.add(node.module.split(".")[0])
        graph[name] = found & set(modules) - {name}
    return graph


def test_no_experiment_script_imports_another_and_the_house_is_at_most_eight_floors():
    graph = project_imports()
    experiments = {m for m in graph if m in EXPERIMENTS or m.startswith("bench_")}
    assert EXPERIMENTS <= set(graph)
    assert {(a, b) for a in experiments for b in graph[a] & experiments} == set()

    def floor(name, seen=()):  # a module that imports none of ours is floor 1
        return 0 if name in seen else 1 + max((floor(d, seen + (name,)) for d in graph[name]), default=0)
    assert max(map(floor, graph)) <= 8


# ---- what the student's code cannot do to the leaderboard: game the check or the clock, hang it, end it ----

def test_a_factory_or_an_optimizer_that_changes_after_the_check_is_caught_after_the_timing(tmp_path):
    code, (record,) = run_leaderboard(tmp_path, "--model", "test_leaderboard:right_once")
    assert code == 1 and record["check"]["ok"] and "leaderboard" in record
    assert record["status"].startswith("WRONG after the timing: ") and not record["recheck"]["ok"]
    code, (record,) = run_leaderboard(tmp_path, "--optimizer", "test_leaderboard:NoOpAfterFive", out="noop")
    assert code == 1 and record["check"]["ok"] and record["status"].startswith("WRONG after the timing: step 1 of ")


def test_a_replaced_clock_or_global_setting_in_your_module_changes_no_headline(tmp_path, monkeypatch):
    (tmp_path / "sly_lm.py").write_text(
        "import time, timeit, torch, test_bench_e2e\n"
        "real = time.perf_counter\n"
        "time.perf_counter = timeit.default_timer = lambda: real() / 10  # a step ten times as fast\n"
        "torch.set_float32_matmul_precision('medium')\n"
        "def make(**kw):\n"
        "    return test_bench_e2e.tagged('sly', **kw)\n")
    monkeypatch.chdir(tmp_path)
    code, (record,) = run_leaderboard(tmp_path, "--model", "sly_lm:make")
    lb = record["leaderboard"]
    assert code == 0 and record["status"] in ("ok", "noisy") and lb["clocks_disagree"] < 0.05
    assert lb["ms"] == pytest.approx(lb["second_clock_ms"], rel=0.05)
    assert record["global_settings_changed"] == {"float32 matmul precision": "medium"}


def test_a_hanging_model_is_a_timeout_row_and_os_exit_an_error_row(tmp_path, monkeypatch):
    (tmp_path / "stuck_lm.py").write_text(
        "import os, time\n"
        "def hangs(**kw):\n"
        "    time.sleep(600)\n"
        "def ends(**kw):\n"
        "    os._exit(7)\n")
    monkeypatch.chdir(tmp_path)
    made, make = [], tempfile.TemporaryDirectory
    # the folders the run makes, recorded where they are made (a TMPDIR of the test's would hold the fork server's
    # socket too, and its path can pass the 107 characters a socket's may have)
    monkeypatch.setattr(tempfile, "TemporaryDirectory", lambda **kw: made.append(make(**kw)) or made[-1])
    code, (record,) = run_leaderboard(tmp_path, "--model", "stuck_lm:hangs", "--timeout", "3")
    assert code == 1 and record["status"] == "timeout after 3 s"
    (caches,) = [folder.name for folder in made if "leaderboard-cache-" in folder.name]
    assert not os.path.exists(caches)  # removed, though the child was killed
    code, (record,) = run_leaderboard(tmp_path, "--model", "stuck_lm:ends", out="ends")
    assert code == 1 and record["status"] == "error: child process died with exit code 7"


def test_your_whole_step_or_your_loss_is_timed_and_checked(tmp_path):
    code, (record,) = run_leaderboard(tmp_path, "--model", "test_leaderboard:fused", "--step",
                                      "test_leaderboard:fused_step", "--in-process")
    assert code == 0 and record["check"]["ok"] and record["recheck"]["ok"] and record["leaderboard"]["ms"] > 0
    errors = record["check"]["errors"]
    assert {"loss", "grad lm_head.weight", "step 3 of lm_head.weight"} <= set(errors) and "logits" not in errors
    assert "forward_ms" not in record and len(record["step_ms"]) == 2 and record["step_ms_mean"] > 0
    lazy = leaderboard.behaviour_check("test_leaderboard:fused", None, torch.device("cpu"), shape=SMALL,
                                       step="test_leaderboard:step_without_update")
    assert not lazy["ok"] and lazy["problem"] == "your step called optimizer.step() 0 times in one step"
    code, (record,) = run_leaderboard(tmp_path, "--loss", "test_leaderboard:torch_loss", "--in-process", out="loss")
    assert code == 0 and record["check"]["ok"] and "logits" not in record["check"]["errors"]
    assert len(record["forward_ms"]) == 2


def test_bf16_weights_train_your_model_in_bf16_without_autocast_and_say_so(tmp_path, capsys):
    code, (record,) = run_leaderboard(tmp_path, "--dtype", "bf16-weights", "--in-process")
    assert code == 0 and record["check"]["ok"] and record["recheck"]["ok"], record["status"]
    assert record["trained_dtypes"] == ["bfloat16"] and record["precision"] == "bf16 weights, no autocast"
    assert "not rechecked" in record["recheck"]["optimizer"] and "bf16 weights, no autocast over parameters in " \
        "bfloat16" in capsys.readouterr().out
