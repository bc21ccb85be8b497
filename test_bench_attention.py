"""bench_attention.py: the implementations agree, the float64 check and what it names (non-causal,
NaN, inputs written in place), the timers hold only their phase, the memory formula against the
measured bytes, the fit guard, failures as rows, the tables (the flash table a student pastes), the
command line. Students' kernels are written to a temporary folder and named with --impl."""
import functools
import math
import sys
import types

import pytest
import torch

import bench_attention as ba
import common
import report
from results import read_records

TINY = ["--device", "cpu", "--batch-size", "2", "--d", "8", "--iters", "3", "--warmup", "1"]


def run_main(tmp_path, *argv, in_process=True):
    code = ba.main([*TINY, *argv, *(["--in-process"] if in_process else []),
                    "--results-dir", str(tmp_path)])
    (jsonl,) = (tmp_path / "attention").glob("*.jsonl")
    return code, read_records(jsonl), jsonl


def random_inputs(shape=(2, 16, 8), dtype=torch.float64):
    torch.manual_seed(0)
    return tuple(torch.randn(shape, dtype=dtype, requires_grad=True) for _ in range(3))


def outputs_and_grads(attention, inputs):
    out = attention(*inputs)
    return (out, *torch.autograd.grad(out, inputs, torch.ones_like(out)))


# Kernels as students write them, hostile ones included (#28, #31).
STUDENT_ATTENTION = '''
import math
import torch

SEEN = []  # what `inspector` found in q at each call


def correct(q, k, v, is_causal):
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    if is_causal:
        n = q.shape[-2]
        scores = scores.masked_fill(torch.ones(n, n, dtype=torch.bool, device=q.device).triu(1), float("-inf"))
    return torch.softmax(scores, dim=-1) @ v


def no_mask(q, k, v, is_causal):  # ignores is_causal, as the handout's flash_forward (a) may
    return correct(q, k, v, False)


def raises(q, k, v, is_causal):
    raise RuntimeError("kernel exploded\\nsecond line that must not reach the table")


def oom_at_32(q, k, v, is_causal):
    if q.shape[1] == 32:
        raise torch.OutOfMemoryError("CUDA out of memory (a test kernel)")
    return correct(q, k, v, is_causal)


def two_arguments(q, k):
    return q


def wrong_shape(q, k, v, is_causal):
    return correct(q, k, v, is_causal)[..., :1]


def with_lse(q, k, v, is_causal):
    return correct(q, k, v, is_causal), None


def scales_q_in_place(q, k, v, is_causal):
    with torch.no_grad():
        q.mul_(2)
    return correct(q, k, v, is_causal)


def inspector(q, k, v, is_causal):
    SEEN.append(float(q.detach().double().sum()))
    return correct(q, k, v, is_causal)


class FlashAttentionPytorch(torch.autograd.Function):
    """FlashAttention-2's equations in PyTorch: saves the log-sum-exp, recomputes P in backward."""

    @staticmethod
    def forward(ctx, q, k, v, is_causal):
        scores = (q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])).float()
        if is_causal:
            n = q.shape[-2]
            scores = scores.masked_fill(torch.ones(n, n, dtype=torch.bool, device=q.device).triu(1), float("-inf"))
        lse = torch.logsumexp(scores, dim=-1)
        out = torch.exp(scores - lse[..., None]).to(v.dtype) @ v
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.is_causal = is_causal
        return out

    @staticmethod
    def backward(ctx, grad_out):
        q, k, v, out, lse = ctx.saved_tensors
        scale = 1 / math.sqrt(q.shape[-1])
        scores = (q @ k.transpose(-2, -1) * scale).float()
        if ctx.is_causal:
            n = q.shape[-2]
            scores = scores.masked_fill(torch.ones(n, n, dtype=torch.bool, device=q.device).triu(1), float("-inf"))
        probs = torch.exp(scores - lse[..., None])
        dv = probs.to(v.dtype).transpose(-2, -1) @ grad_out
        dp = (grad_out @ v.transpose(-2, -1)).float()
        ds = (probs * (dp - (grad_out.float() * out.float()).sum(-1, keepdim=True))).to(q.dtype)
        return (ds @ k) * scale, (ds.transpose(-2, -1) @ q) * scale, dv, None


class ReturnsNaN(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, is_causal):
        return torch.full_like(q, float("nan"))

    @staticmethod
    def backward(ctx, grad_out):
        return grad_out, grad_out, grad_out, None


class ReturnsInf(ReturnsNaN):
    @staticmethod
    def forward(ctx, q, k, v, is_causal):
        return torch.full_like(q, float("inf"))


class NotAFunction:
    pass


NOT_CALLABLE = 3
'''


@pytest.fixture
def student(tmp_path, monkeypatch):
    """A folder holding student_attention.py, the current directory; the module imported fresh."""
    folder = tmp_path / "student"
    folder.mkdir()
    (folder / "student_attention.py").write_text(STUDENT_ATTENTION)
    monkeypatch.chdir(folder)
    monkeypatch.delitem(sys.modules, "student_attention", raising=False)
    monkeypatch.setattr(sys, "path", list(sys.path))  # common.load adds the current directory
    yield folder
    sys.modules.pop("student_attention", None)


# ---- numerics and the check ----


def test_naive_and_sdpa_agree_and_the_blocked_reference_equals_autograd(monkeypatch):
    inputs = random_inputs((2, 37, 8))
    naive = outputs_and_grads(ba.naive_attention, inputs)
    for a, b in zip(naive, outputs_and_grads(ba.sdpa_one_head, inputs)):
        torch.testing.assert_close(a, b, atol=1e-8, rtol=1e-8)
    torch.testing.assert_close(naive[0][:, 0], inputs[2][:, 0])  # causal: query 0 sees key 0 only
    monkeypatch.setattr(ba, "REFERENCE_BLOCK_BYTES", 2 * 37 * 8 * 6 * 5)  # blocks of 5 rows, then 2
    reference = ba.reference_attention(*inputs, torch.ones(2, 37, 8, dtype=torch.float64))
    for a, b in zip(reference, naive):  # a process's first float64 matmuls on a CPU came out up to 1.2e-9 apart
        torch.testing.assert_close(a, b, atol=1e-8, rtol=1e-8)


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_check_passes_pytorch_and_names_a_kernel_without_the_mask(student, dtype):
    torch.manual_seed(0)
    inputs = random_inputs((2, 64, 16), ba.DTYPES[dtype])
    grad_out = torch.randn(2, 64, 16, dtype=ba.DTYPES[dtype])
    for impl in ("naive", "sdpa", "student_attention:correct",
                 "student_attention:FlashAttentionPytorch"):
        check = ba.check_implementation(ba.attention_function(impl), inputs, grad_out, dtype, impl)
        assert check["ok"] and check["problems"] == [], (impl, check)
        assert check["max_error"] < (1e-5 if dtype == "fp32" else ba.TOLERANCE["bf16"])
    wrong = ba.check_implementation(ba.attention_function("student_attention:no_mask"), inputs,
                                    grad_out, dtype, "no_mask")
    assert not wrong["ok"] and wrong["max_error"] > 0.2  # of order 1, far above either tolerance
    assert wrong["problems"] == [
        "non-causal (it matches attention without the mask: is_causal ignored?)"]
    scaled = ba.check_implementation(lambda *qkv: 1.2 * ba.attention_function("naive")(*qkv), inputs, grad_out,
                                     dtype, "scaled")  # a wrong forward: its output named, not a gradient
    assert report.check_summary(scaled).startswith("WRONG: out error") and scaled["worst"] == "out"


def test_check_names_nan_and_inputs_written_in_place_against_pristine_copies(student):
    inputs, grad_out = random_inputs(dtype=torch.float32), torch.ones(2, 16, 8)
    nan = ba.check_implementation(ba.attention_function("student_attention:ReturnsNaN"), inputs,
                                  grad_out, "fp32", "nan")
    assert not nan["ok"] and nan["problems"] == ["out has NaN"] and nan["worst"] == "out"
    inf = ba.check_implementation(ba.attention_function("student_attention:ReturnsInf"), inputs,
                                  grad_out, "fp32", "inf")
    assert inf["problems"] == ["out has inf"] and inf["max_error"] == math.inf  # not float64's largest
    before = inputs[0].detach().clone()
    scaled = ba.check_implementation(ba.attention_function("student_attention:scales_q_in_place"),
                                     inputs, grad_out, "fp32", "scaled")
    assert scaled["problems"][0] == "modifies q in place" and not scaled["ok"]
    # the reference saw the q from before the kernel: the kernel's result (of 2q) differs from it
    assert scaled["errors"]["out"] > 1e-3
    torch.testing.assert_close(inputs[0].detach(), 2 * before)


@pytest.mark.parametrize("spec, message", [
    ("raises", "student_attention:raises raised RuntimeError: kernel exploded in forward"),
    ("wrong_shape", "returned (2, 16, 1) float32 on cpu in forward; expected (2, 16, 8) float32"),
    ("with_lse", "returned tuple in forward"),
    ("two_arguments", "raised TypeError: two_arguments() takes 2 positional arguments"),
])
def test_a_kernel_that_fails_is_one_line_naming_it(student, spec, message):
    spec = f"student_attention:{spec}"
    with pytest.raises(ba.ImplementationError) as exc:
        ba.check_implementation(ba.attention_function(spec), random_inputs(dtype=torch.float32),
                                torch.ones(2, 16, 8), "fp32", spec)
    assert message in str(exc.value) and "\n" not in str(exc.value)
    with pytest.raises(ba.ImplementationError, match="mine's output has no autograd graph"):
        ba.check_implementation(lambda q, k, v: q.detach(), random_inputs(), torch.ones(2, 16, 8), "fp32",
                                "mine")


@pytest.mark.parametrize("spec, message", [
    ("student_attention:NotAFunction", "<class 'student_attention.NotAFunction'>, not a function"),
    ("student_attention:NOT_CALLABLE", "is 3, not a function"),
    ("student_attention:missing", "has no 'missing'"),
    ("no_such_module:f", "no module named 'no_such_module' in the current directory"),
])
def test_what_cannot_be_loaded_is_a_load_error(student, spec, message):
    with pytest.raises(common.LoadError) as exc:
        ba.attention_function(spec)
    assert message in str(exc.value) and "\n" not in str(exc.value)


def test_a_grid_whose_every_configuration_fails_exits_1(tmp_path, capsys):
    code, records, _ = run_main(tmp_path, "--impl", "no_such_module:f", "--seq-len", "16")
    assert code == 1 and records and all(r["status"].startswith("error") for r in records)
    assert "every configuration failed" in capsys.readouterr().err


# ---- timing ----


class CountingAttention(torch.autograd.Function):
    events: list = []

    @staticmethod
    def forward(ctx, q, k, v):
        CountingAttention.events.append("forward")
        return q + k + v

    @staticmethod
    def backward(ctx, grad):
        CountingAttention.events.append("backward")
        return grad, grad, grad


def test_each_timer_holds_only_its_phase(monkeypatch):
    """The forward alone, the backward alone through one graph built outside the clock, then both;
    warm-up calls outside the clock."""
    events = CountingAttention.events = []
    monkeypatch.setattr(common, "synchronize", lambda device: events.append("sync"))
    time = functools.partial(ba.time_calls, device=torch.device("cpu"), warmup=1, iters=2,
                             warmup_ms=0, rep_ms=0)
    grad_out = torch.ones(2, 16, 8, dtype=torch.float64)
    samples = ba.time_phases(CountingAttention.apply, random_inputs(), grad_out, time)
    assert {phase: len(s) for phase, s in samples.items()} == {phase: 2 for phase in ba.ATTENTION_PHASE_SHORT}
    # what ran between the two syncs of each timed call
    spans = "".join("|" if e == "sync" else e[0] for e in events).split("|")[1::2]
    assert spans == ["f", "f", "b", "b", "fb", "fb"]
    assert events.count("forward") == 2 + 1 + 1 + 2 + 1  # timed, warm-up, the graph, fwd+bwd's
    assert events.count("backward") == 2 + 1 + 2 + 1


def fake_triton(monkeypatch, do_bench):
    triton = types.ModuleType("triton")
    triton.__version__ = "9.9.fake"
    triton.testing = types.ModuleType("triton.testing")
    triton.testing.do_bench = do_bench
    monkeypatch.setitem(sys.modules, "triton", triton)
    monkeypatch.setitem(sys.modules, "triton.testing", triton.testing)


def test_timing_method_by_device(monkeypatch):
    run = ba.AttentionRun("naive", 8, 16, warmup=1, iters=3, warmup_ms=5, rep_ms=20)
    cuda = torch.device("cuda")
    assert ba.timing_settings(run, torch.device("cpu"))["method"] == "sync timer"
    monkeypatch.setitem(sys.modules, "triton", None)  # import triton fails, installed or not
    monkeypatch.setitem(sys.modules, "triton.testing", None)
    assert ba.timing_settings(run, cuda) == {"method": "cuda events", "warmup_calls": 1,
                                             "timed_calls": 3,
                                             "why": "triton is not importable: no L2 flush"}
    calls = []
    fake_triton(monkeypatch, lambda fn, warmup, rep, return_mode:
                calls.append((warmup, rep, return_mode)) or [0.5, 0.25])
    assert ba.timing_settings(run, cuda)["method"] == "triton.testing.do_bench"
    assert ba.time_calls(lambda: None, "forward", cuda, 1, 3, 5, 20) == [0.5, 0.25]
    assert calls == [(5, 20, "all")]


# ---- memory ----


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_naive_prediction_equals_the_measured_saved_bytes(dtype):
    batch, seq, d = 2, 64, 8
    inputs = random_inputs((batch, seq, d), dtype)
    e = inputs[0].element_size()
    naive = ba.saved_tensor_bytes(ba.naive_attention, inputs)
    assert naive == ba.naive_saved_bytes(batch, seq, d, e) >= 2 * batch * seq * seq * e
    assert ba.saved_tensor_bytes(ba.sdpa_one_head, inputs) < batch * seq * seq * e  # no seq x seq
    # the study's case: batch 8, seq 1024, d 16, fp32
    assert ba.naive_saved_bytes(8, 1024, 16, 4) / 2**20 == pytest.approx(66.59375)


def test_predicted_need_and_free_memory(tmp_path, monkeypatch):
    run = ba.AttentionRun("naive", 64, 1024, batch_size=8)
    linear = 8 * 8 * 1024 * 64 * 4 + 8 * 8 * 1024 * 64 * 8 + 2**28  # + the check's float64
    assert ba.predicted_need_bytes(run) == 6.5 * 8 * 1024 * 1024 * 4 + linear
    fused = 4 * 8 * 1024 * 64 * 4 + 8 * 1024 * 4
    for impl, spec in (("sdpa", None), ("mine", "m:f")):
        assert ba.predicted_need_bytes(ba.AttentionRun(impl, 64, 1024, spec=spec)) == fused + linear
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:       24000000 kB\nMemAvailable:   2048 kB\n")
    assert common.free_memory_bytes(torch.device("cpu"), str(meminfo)) == 2048 * 1024
    assert common.free_memory_bytes(torch.device("cpu"), str(tmp_path / "missing")) is None
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (5 * 2**30, 80 * 2**30))
    assert common.free_memory_bytes(torch.device("cuda:0")) == 5 * 2**30


def test_fit_guard_skips_what_cannot_fit_and_force_runs_it(tmp_path, monkeypatch):
    code, (record,), _ = run_main(tmp_path, "--seq-len", "1048576", "--impl", "naive")
    assert code == 0 and record["status"].startswith("skipped: needs 53249.")  # 52 TiB of scores
    monkeypatch.setattr(common, "free_memory_bytes", lambda device: 1)  # nothing fits...
    _, (skipped,), _ = run_main(tmp_path / "b", "--seq-len", "16", "--impl", "sdpa")
    _, (forced,), _ = run_main(tmp_path / "c", "--seq-len", "16", "--impl", "sdpa", "--force")
    assert skipped["status"].startswith("skipped") and forced["status"] == "ok"  # ...but --force


# ---- runs: rows, tables, records ----


def test_compiled_is_checked_compiled_before_timing_and_compared(tmp_path, capsys):
    """The one torch.compile test."""
    code, (naive, compiled), _ = run_main(tmp_path, "--seq-len", "16", "--impl", "naive",
                                          "compiled")
    assert code == 0 and compiled["status"] == "ok" and compiled["check"]["max_error"] < 1e-5
    assert compiled["compile_s"] * 1e3 > compiled["forward_ms_max"] and "compile_s" not in naive
    out = capsys.readouterr().out
    assert "compile s" in out and "| compiled " in out[out.index("### comparison"):]


def test_tables_records_and_the_sdpa_backend(tmp_path, capsys):
    code, records, _ = run_main(tmp_path, "--seq-len", "16", "32", "--impl", "naive", "sdpa")
    assert code == 0 and len(records) == 4
    for record in records:
        assert len(record["forward_ms"]) == len(record["backward_ms"]) == 3  # raw samples
        assert record["forward_ms_p20"] <= record["forward_ms_median"] <= record["forward_ms_p80"]
        assert record["environment"]["torch"] == torch.__version__
        assert record["saved_tensor_bytes"] > 0
        assert record["pairing"]["variants"] == 2 and record["timing"]["method"] == "sync timer"
        assert record["forward_flops"] == 4 * 2 * record["config"]["seq_len"] ** 2 * 8 // 2  # causal: 4BS^2d / 2
    assert {r["sdpa_backend"] for r in records if r["config"]["impl"] == "sdpa"} == {"flash"}
    assert ba.sdpa_backend(ba.sdpa_attention, random_inputs(dtype=torch.float32)) == "math"  # 3-D
    out = capsys.readouterr().out
    assert out.index("### naive") < out.index("### sdpa") < out.index("### comparison") < out.index("## Floors")
    assert "4*B*S^2*d halved for the causal mask" in out
    # the floors: the same FLOPs, naive's seq x seq scores and probabilities (4 passes forward, 5 backward) more bytes
    by = {(r["config"]["impl"], r["config"]["seq_len"]): r["floors"] for r in records}
    for seq in (16, 32):
        naive, sdpa = by["naive", seq], by["sdpa", seq]
        assert (naive["bytes"], sdpa["bytes"]) == ("seq x seq materialized", "fused")
        for phase, passes in (("forward", 4), ("backward", 5), ("forward_backward", 9)):
            assert naive["phases"][phase]["flops"] == sdpa["phases"][phase]["flops"]
            assert naive["phases"][phase]["bytes"] - sdpa["phases"][phase]["bytes"] == passes * 2 * seq * seq * 4
        assert naive["fused_floor_ms"]["forward"] == sdpa["phases"]["forward"]["floor_ms"]
        assert sdpa["phases"]["forward"]["bytes"] == 4 * 2 * seq * 8 * 4 + 2 * seq * 4  # Q, K, V, O; log-sum-exp
    rows = [row for row in out[out.index("## Floors"):].splitlines() if row.startswith("| ")][1:]
    assert len(rows) == 2 * 2 * 3 and all("%" in row and "measured" in row for row in rows)


def test_your_kernels_and_failures_are_rows_in_child_processes(student, tmp_path, capsys):
    """Imported in the children from the current directory; an OOM is a row and the longer
    sequence of that kernel is skipped; a kernel that raises is a row; the others still run."""
    code, records, _ = run_main(tmp_path, "--seq-len", "16", "32", "64", "--impl", "naive",
                                "oom=student_attention:oom_at_32", "student_attention:raises",
                                in_process=False)
    status = {(r["config"]["impl"], r["config"]["seq_len"]): r["status"] for r in records}
    assert code == 0 and status[("oom", 16)] == "ok" and status[("oom", 32)] == "OOM"
    assert status[("oom", 64)] == "skipped: OOM at seq=32" and status[("naive", 64)] == "ok"
    assert status[("student_attention:raises", 16)] == (
        "error: ImplementationError: student_attention:raises raised RuntimeError: kernel exploded "
        "in forward")
    assert "second line" not in capsys.readouterr().out


def test_nan_and_in_place_kernels_are_named_rows_and_report_renders_them(student, tmp_path, capsys):
    """#28: a NaN kernel's row keeps its cause and later configurations run; a kernel writing into
    its inputs is named, and the others are timed on inputs it never touched."""
    module = sys.modules.get("student_attention")
    code, records, jsonl = run_main(tmp_path, "--seq-len", "16", "32", "--impl",
                                    "scale=student_attention:scales_q_in_place", "naive",
                                    "nan=student_attention:ReturnsNaN",
                                    "look=student_attention:inspector")
    by = {(r["config"]["impl"], r["config"]["seq_len"]): r for r in records}
    assert code == 0 and len(records) == 8
    for seq in (16, 32):
        assert by[("nan", seq)]["status"] == "WRONG: out has NaN"
        assert by[("scale", seq)]["status"].startswith("WRONG: modifies q in place")
        assert by[("naive", seq)]["status"] == by[("look", seq)]["status"] == "ok"
        assert len(by[("nan", seq)]["forward_ms"]) == 3  # still timed
    seen = sys.modules["student_attention"].SEEN
    assert module is None and len(seen) > 2 * 9 and len(set(seen)) == 2  # one q per sequence length
    capsys.readouterr()
    assert report.main([str(jsonl), "--results-dir", str(tmp_path / "again")]) == 0
    out = capsys.readouterr().out
    assert "| WRONG: out has NaN" in out and "WRONG: modifies q in place" in out


def test_flash_grid_plan_and_its_table_fits_160_characters(student, tmp_path, capsys):
    assert ba.main(["--grid", "flash", "--impl", "mine:attention", "--device", "cpu", "--dry-run",
                    "--results-dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "settings: grid flash, batch 1, bf16 fp32, causal" in out
    assert "dry run: 160 configurations would run" in out  # 2 dtypes x 4 d x 10 seq x 2 impls
    assert "  1. naive d=16 seq=128 bf16 (predicted need" in out
    assert "160. mine:attention d=128 seq=65536 fp32" in out
    code, records, _ = run_main(tmp_path, "--grid", "flash", "--d", "8", "16", "--seq-len", "16",
                                "32",
                                "--impl", "flash=student_attention:FlashAttentionPytorch",
                                "no_mask=student_attention:no_mask")
    assert code == 0 and len(records) == 2 * 2 * 2 * 3
    out = capsys.readouterr().out
    table = out[out.index("### comparison"):].split("\n\n")[1].splitlines()
    header = [c.strip() for c in table[0].strip("|").split("|")]
    assert header == ["d", "seq", "dtype", "impl", "naive fwd", "naive bwd", "naive fwd+bwd",
                      "fwd ms", "bwd ms", "fwd+bwd ms", "speed-up", "check"]
    assert len(table) == 2 + 2 * 2 * 2 * 2  # a row per (d, seq, dtype, impl)
    rows = [[c.strip() for c in line.strip("|").split("|")] for line in table[2:]]
    # 160 characters while times have at most 3 integer digits and speed-ups 1 (a loaded machine's may not)
    usual = all(float(x) < 100 for row in rows for x in row[4:10]) and all(
        float(x) < 10 for row in rows for x in row[10].rstrip("x").split("/"))
    assert max(map(len, table)) <= 160 or not usual
    tables = [block.splitlines() for block in out.split("\n\n") if block.startswith("|")]
    assert len(tables) == 3 * 2 + 2  # per implementation its times, then its memory and check; the comparison, floors
    assert max(len(line) for lines in tables for line in lines) <= 160 or not usual, [l for t in tables for l in t if len(l) > 160]
    assert {(row[3], row[-1]) for row in rows} == {("flash", "ok"),
                                                  ("no_mask", "WRONG: non-causal")}


def test_columns_apply_to_every_table_and_plot(tmp_path, capsys):
    code, records, _ = run_main(tmp_path, "--seq-len", "16", "32", "--impl", "naive", "sdpa",
                                "--columns", "impl", "seq", "fwd ms", "check", "of floor", "--plot")
    out = capsys.readouterr().out
    headers = [line for line in out.splitlines() if line.startswith("| impl")]
    cells = [[c.strip() for c in h.strip("|").split("|")] for h in headers]
    assert cells == [["impl", "seq", "fwd ms"]] * 2 + [["impl", "seq", "fwd ms", "check"],
                                                       ["impl", "seq", "phase", "of floor"]]
    for figure in ("attention", "roofline"):
        (png,) = (tmp_path / "attention").glob(f"*_{figure}.png")
        assert png.stat().st_size > 10_000 and str(png) in out


@pytest.mark.parametrize("argv,message", [
    (["--seq-len", "0"], "must be a positive integer"),
    (["--impl", "flash"], "invalid choice: 'flash'"),
    (["--impl", "flash:attention:x"], "invalid choice: 'flash:attention:x'"),
    (["--impl", "naive=m:f"], "invalid choice: 'naive=m:f'"),
    (["--impl", "a=m:f", "a=m:g"], "two implementations with one name"),
    (["--dtype", "fp16"], "invalid choice: 'fp16'"),
    (["--repeats", "3"], "--repeats applies to --interleave runs"),
    (["--columns", "fwd_ms"], "valid columns: impl, d, seq, dtype, fwd ms"),
])
def test_bad_input_exits_2_with_one_line(tmp_path, capsys, argv, message):
    with pytest.raises(SystemExit) as exc:
        ba.main(["--device", "cpu", *argv, "--results-dir", str(tmp_path)])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and message in err and len(err.strip().splitlines()) == 1


# ---- the 2025 leaderboard ----


def test_leaderboard_2025_times_the_snippet_beside_naive_and_sdpa_and_flags_a_dropped_mask(student, tmp_path,
                                                                                            capsys):
    code, records, _ = run_main(tmp_path, "--grid", "leaderboard-2025", "--seq-len", "32", "--rep-ms", "5",
                                "--warmup-ms", "1", "--impl", "flash=student_attention:FlashAttentionPytorch",
                                "bad=student_attention:no_mask")
    out = capsys.readouterr().out
    by_impl = {r["config"]["impl"]: r for r in records}
    assert list(by_impl) == ["naive", "sdpa", "flash", "bad"] and code == 0
    assert all(r["config"]["dtype"] == "bf16" and r["config"]["leaderboard"] for r in records)
    assert by_impl["flash"]["status"] == "ok" and by_impl["bad"]["status"].startswith("WRONG: non-causal")
    for r in records:  # the snippet, timed as do_bench would without triton: the sync timer, named
        assert r["leaderboard"]["method"] == "sync timer" and r["leaderboard"]["ms"] > 0
    assert "scaled-down shape on a CPU" in out and "scaled-down shape: not comparable" in out
    stands = out[out.index("## Where it stands"):]
    assert "bad (sync timer) WRONG" in stands and "| 2025 best" in stands and "5.364" in stands
    saved = next((tmp_path / "attention").glob("*.md")).read_text()  # the saved report has it too
    assert stands.split("\nwrote ")[0].strip() in saved
