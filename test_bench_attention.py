"""bench_attention.py: the implementations agree, the timers hold only what they time, the memory formula and
measurement, the fit guard, failures as rows, the sdpa backend, the command line; your own kernel as
MODULE:CALLABLE (test-local stand-ins below), checked against the float64 reference before it is timed; the
flash_benchmarking grid; the timing method each device gets."""
import functools
import subprocess
import sys
import types
from pathlib import Path

import pytest
import torch

import attention_check
import bench_attention as ba
import kernel_timing
import sweep
import user_code
from common import SyncTimer
from results import read_records
from sweep import FAULT_ENV

HERE = Path(__file__).resolve().parent
# on the CPU on any machine: the tests expect the CPU's sdpa backend and memory figures
TINY = ["--device", "cpu", "--batch-size", "2", "--d", "8", "--iters", "3", "--warmup", "1"]


def run_main(tmp_path, *argv):
    code = ba.main([*TINY, *argv, "--results-dir", str(tmp_path)])
    (jsonl,) = (tmp_path / "attention").glob("*.jsonl")
    return code, read_records(jsonl)


def random_inputs(shape=(2, 16, 8), dtype=torch.float64):
    torch.manual_seed(0)
    return tuple(torch.randn(shape, dtype=dtype, requires_grad=True) for _ in range(3))


def outputs_and_grads(attention, inputs):
    out = attention(*inputs)
    grads = torch.autograd.grad(out, inputs, torch.ones_like(out))
    return out, grads


def assert_agree(a, b, atol):
    (out_a, grads_a), (out_b, grads_b) = a, b
    torch.testing.assert_close(out_a, out_b, atol=atol, rtol=atol)
    for ga, gb in zip(grads_a, grads_b):
        torch.testing.assert_close(ga, gb, atol=atol, rtol=atol)


# ---- numerics ----


def test_naive_and_sdpa_agree_forward_and_gradients():
    inputs = random_inputs()
    assert_agree(outputs_and_grads(ba.naive_attention, inputs), outputs_and_grads(ba.sdpa_one_head, inputs), 1e-8)
    # causal: the first query only sees the first key, so its output is the first value
    out = ba.sdpa_one_head(*inputs)
    torch.testing.assert_close(out[:, 0], inputs[2][:, 0])


def test_compiled_agrees_and_runs_through_main(tmp_path, capsys):
    """The one torch.compile test: numerics of the compiled function, then the compiled path of the benchmark."""
    inputs = random_inputs(dtype=torch.float32)
    compiled = ba.IMPLEMENTATIONS["compiled"]()
    assert_agree(outputs_and_grads(ba.naive_attention, inputs), outputs_and_grads(compiled, inputs), 1e-5)
    code, records = run_main(tmp_path, "--seq-len", "16", "--impl", "naive", "compiled", "--in-process")
    assert code == 0
    naive, comp = records
    assert comp["config"]["impl"] == "compiled" and comp["status"] == "ok"
    assert comp["compile_s"] > 0 and comp["forward_ms_max"] < comp["compile_s"] * 1e3  # compiled before timing
    assert "compile_s" not in naive
    out = capsys.readouterr().out
    assert "compile s" in out and "compiled fwd speed-up" in out


# ---- timing structure ----


class CountingAttention(torch.autograd.Function):
    """An attention stand-in whose forward and backward log themselves."""
    events: list = []

    @staticmethod
    def forward(ctx, q, k, v):
        CountingAttention.events.append("forward")
        return q + k + v

    @staticmethod
    def backward(ctx, grad):
        CountingAttention.events.append("backward")
        return grad, grad, grad


def spans(events):
    """What ran inside each timer span (sync ... sync)."""
    inside, current = [], None
    for event in events:
        if event == "sync":
            if current is None:
                current = []
            else:
                inside.append(current)
                current = None
        elif current is not None:
            current.append(event)
    return inside


def test_each_timer_holds_only_its_phase():
    """Forward timed alone, then the backward alone through one retained graph built outside the timers, then a
    forward with its backward; warm-up calls never inside a timer."""
    events = CountingAttention.events = []
    timer = SyncTimer(sync=lambda: events.append("sync"))
    method = kernel_timing.TimingMethod("sync timer", {}, functools.partial(
        kernel_timing.sync_timer_samples, timer=timer, warmup=1, iters=2))
    samples = ba.time_phases(CountingAttention.apply, random_inputs(), torch.ones(2, 16, 8, dtype=torch.float64),
                             method)
    assert {phase: len(s) for phase, s in samples.items()} == {phase: 2 for phase in ba.PHASES}
    assert all(ms >= 0 for s in samples.values() for ms in s)
    assert spans(events) == [["forward"]] * 2 + [["backward"]] * 2 + [["forward", "backward"]] * 2
    # outside the timers: 1 warm-up forward, the retained graph's forward, 1 warm-up backward, 1 warm-up fwd+bwd
    assert events.count("forward") == 2 + 1 + 1 + 2 + 1 and events.count("backward") == 2 + 1 + 2 + 1


def test_quantiles_are_torchs():
    samples = [3.0, 1.0, 4.0, 1.5, 9.0, 2.6]
    for q in kernel_timing.QUANTILES:
        assert kernel_timing.quantile(samples, q) == pytest.approx(torch.quantile(torch.tensor(samples), q).item())


# ---- the timing method each device gets ----


def fake_triton(monkeypatch, do_bench):
    """A `triton` package whose testing.do_bench is `do_bench`, for the branch this machine (no triton) never takes."""
    triton = types.ModuleType("triton")
    triton.__version__ = "9.9.fake"
    triton.testing = types.ModuleType("triton.testing")
    triton.testing.do_bench = do_bench
    monkeypatch.setitem(sys.modules, "triton", triton)
    monkeypatch.setitem(sys.modules, "triton.testing", triton.testing)


def test_timing_method_is_the_sync_timer_on_a_cpu_and_cuda_events_without_triton(monkeypatch):
    cpu = kernel_timing.choose_timing(torch.device("cpu"), warmup=1, iters=3)
    assert cpu.name == "sync timer" and cpu.describe()["timed_calls"] == 3
    assert len(cpu.samples(lambda: torch.ones(4).sum())) == 3  # it runs here
    monkeypatch.setitem(sys.modules, "triton", None)  # import triton fails, installed or not
    events = kernel_timing.choose_timing(torch.device("cuda"), warmup=1, iters=3)
    assert events.name == "cuda events" and "triton is not importable" in events.describe()["why"]


def test_timing_method_is_do_bench_on_cuda_when_triton_imports(monkeypatch):
    calls = []

    def do_bench(fn, warmup, rep, return_mode="mean", **kwargs):
        calls.append({"warmup": warmup, "rep": rep, "return_mode": return_mode})
        return [0.5, 0.25, 0.75]

    fake_triton(monkeypatch, do_bench)
    method = kernel_timing.choose_timing(torch.device("cuda"), warmup=1, iters=3, warmup_ms=5, rep_ms=20)
    assert method.name == "triton.testing.do_bench"
    assert method.describe() == {"method": "triton.testing.do_bench", "warmup_ms": 5, "rep_ms": 20,
                                 "return_mode": "all", "quantiles": [0.2, 0.5, 0.8],
                                 "l2_flush": "before every timed call", "triton": "9.9.fake"}
    assert method.samples(lambda: None, label="forward") == [0.5, 0.25, 0.75]
    assert calls[-1] == {"warmup": 5, "rep": 20, "return_mode": "all"}  # after one probe of return_mode="all"


def test_a_do_bench_without_return_mode_all_falls_back_to_cuda_events(monkeypatch):
    def old_do_bench(fn, warmup=25, rep=100, grad_to_none=None, quantiles=None, return_mode="mean"):
        assert return_mode in ["min", "max", "mean", "median"]  # triton 2.x, before it runs anything

    fake_triton(monkeypatch, old_do_bench)
    method = kernel_timing.choose_timing(torch.device("cuda"), warmup=1, iters=3)
    assert method.name == "cuda events" and "cannot return its samples" in method.describe()["why"]


# ---- memory ----


def test_naive_saved_bytes_formula_on_known_shapes():
    # the study's largest: 8 x 16384^2 fp32 = 8 GiB per seq x seq tensor; Q, K, V, out 64 MiB each
    assert ba.naive_saved_bytes(8, 16384, 128, 4) == 2 * 8 * 2**30 + 4 * 64 * 2**20
    assert ba.naive_saved_bytes(1, 2, 3, 2) == 2 * 4 * 2 + 4 * 6 * 2
    linear = 4 * 8 * 4096 * 64 * 2  # bf16 Q, K, V, output at seq 4096
    assert ba.naive_saved_bytes(8, 8192, 64, 2) - 2 * linear == 4 * (ba.naive_saved_bytes(8, 4096, 64, 2) - linear)
    linear32 = 8 * 8 * 1024 * 64 * 4  # Q, K, V, output, output grad, 3 input grads at seq 1024, fp32
    assert ba.predicted_need_bytes("naive", 8, 1024, 64, 4) == 7.5 * 8 * 1024 * 1024 * 4 + linear32
    assert ba.predicted_need_bytes("compiled", 8, 1024, 64, 4) == 4.5 * 8 * 1024 * 1024 * 4 + linear32
    assert ba.predicted_need_bytes("sdpa", 8, 1024, 64, 4) == 4 * 8 * 1024 * 64 * 4 + 8 * 1024 * 4 + linear32
    # the guard's peak is above the study's saved-bytes formula: it must not let a thrashing run start
    assert ba.predicted_need_bytes("naive", 8, 16384, 64, 4) > 3 * ba.naive_saved_bytes(8, 16384, 64, 4)


def test_measured_saved_bytes_show_the_quadratic_term_and_what_sdpa_saves():
    batch, seq, d = 2, 64, 8
    inputs = random_inputs((batch, seq, d), torch.float32)
    square = batch * seq * seq * 4  # bytes of one fp32 seq x seq tensor
    naive = ba.saved_tensor_bytes(ba.naive_attention, inputs)
    fused = ba.saved_tensor_bytes(ba.sdpa_one_head, inputs)
    assert naive >= ba.naive_saved_bytes(batch, seq, d, 4) - batch * seq * d * 4  # all but the output, at least
    assert naive >= 3 * square  # masked scores, exp and probabilities
    assert fused < square  # nothing seq x seq kept


def test_mem_available_reads_meminfo(tmp_path):
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:       24000000 kB\nMemFree:  100 kB\nMemAvailable:   2048 kB\n")
    assert ba.mem_available_bytes(str(meminfo)) == 2048 * 1024
    assert ba.mem_available_bytes(str(tmp_path / "missing")) is None


def test_free_memory_asks_cuda_for_a_cuda_device(monkeypatch):
    monkeypatch.setattr(ba.torch.cuda, "mem_get_info", lambda device=None: (5 * 2**30, 80 * 2**30))
    assert ba.free_memory_bytes(torch.device("cuda:0")) == 5 * 2**30
    assert ba.free_memory_bytes(torch.device("cpu")) == ba.mem_available_bytes()


def test_fit_status():
    assert ba.fit_status(3 * 2**30, 2**30, force=False) == "skipped: needs 3.00 GiB, 1.00 GiB free"
    assert ba.fit_status(3 * 2**30, 2**30, force=True) is None
    assert ba.fit_status(2**30, 3 * 2**30, force=False) is None
    assert ba.fit_status(2**30, None, force=False) is None  # unknown free memory: run it


def test_fit_guard_skips_an_impossible_configuration_and_force_runs_it(tmp_path, monkeypatch, capsys):
    # 2 x 2^20 x 2^20 fp32 scores and probabilities: 16 TiB; skipped before anything is allocated. The need adds
    # the check's float64 tensors (8 x 2 x 2^20 x 8 x 8 B = 1 GiB) and one block of its scores (256 MiB).
    code, (record,) = run_main(tmp_path, "--seq-len", "1048576", "--impl", "naive", "--in-process")
    assert ba.run_need_bytes(ba.AttentionRun("naive", 8, 2**20, batch_size=2)) == (
        ba.predicted_need_bytes("naive", 2, 2**20, 8, 4) + 2**30 + 2**28)
    assert code == 0 and record["status"].startswith("skipped: needs 61441.")
    assert "forward_ms" not in record
    assert "skipped: needs" in capsys.readouterr().out
    monkeypatch.setattr(ba, "free_memory_bytes", lambda device: 1)  # nothing fits...
    code, (skipped,) = run_main(tmp_path / "b", "--seq-len", "16", "--impl", "sdpa", "--in-process")
    assert skipped["status"].startswith("skipped")
    code, (forced,) = run_main(tmp_path / "c", "--seq-len", "16", "--impl", "sdpa", "--in-process", "--force")
    assert forced["status"] == "ok"  # ...but --force runs it anyway


# ---- failures as rows, output ----


def test_injected_oom_gives_its_row_and_the_sweep_continues_in_child_processes(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv(FAULT_ENV, "oom:impl=naive,seq_len=32")
    code, records = run_main(tmp_path, "--seq-len", "16", "32", "--impl", "naive")
    assert code == 0
    assert [(r["config"]["seq_len"], r["status"]) for r in records] == [(16, "ok"), (32, "OOM")]
    assert records[1]["predicted_naive_saved_bytes"] == ba.naive_saved_bytes(2, 32, 8, 4)
    captured = capsys.readouterr()
    assert "| OOM" in captured.out
    assert "[2/2] naive d=8 seq=32 fp32: OOM" in captured.err  # progress goes to stderr
    markdown = next((tmp_path / "attention").glob("*.md")).read_text()
    assert "OOM" in markdown and "### comparison" in markdown


def test_output_tables_records_and_sdpa_backend(tmp_path, capsys):
    code, records = run_main(tmp_path, "--seq-len", "16", "32", "--impl", "naive", "sdpa", "--in-process")
    assert code == 0 and len(records) == 4
    for record in records:
        assert len(record["forward_ms"]) == len(record["backward_ms"]) == 3  # raw samples
        assert record["environment"]["torch"] == torch.__version__
        assert record["forward_ms_mean"] > 0 and record["saved_tensor_bytes"] > 0
    assert {r["sdpa_backend"] for r in records if r["config"]["impl"] == "sdpa"} == {"flash"}  # 4-D input: fused
    out = capsys.readouterr().out
    assert out.index("### naive") < out.index("### sdpa") < out.index("### comparison")
    assert "sdpa fwd speed-up" in out and "wrote " in out


def test_classify_sdpa_backend_from_op_names():
    assert ba.classify_sdpa_backend(["aten::scaled_dot_product_attention",
                                     "aten::_scaled_dot_product_flash_attention"]) == "flash"
    assert ba.classify_sdpa_backend(["aten::_scaled_dot_product_flash_attention_for_cpu"]) == "flash"
    assert ba.classify_sdpa_backend(["aten::_scaled_dot_product_efficient_attention"]) == "efficient"
    assert ba.classify_sdpa_backend(["aten::_scaled_dot_product_cudnn_attention"]) == "cudnn"
    assert ba.classify_sdpa_backend(["aten::_scaled_dot_product_attention_math", "aten::bmm"]) == "math"
    assert ba.classify_sdpa_backend(["aten::bmm"]) == "unknown"
    # a 3-D input really does fall back to the math kernel: why sdpa_one_head adds a head axis
    assert ba.sdpa_backend(ba.sdpa_attention, random_inputs(dtype=torch.float32)) == "math"


@pytest.mark.parametrize("argv,message", [
    (["--seq-len", "0"], "must be a positive integer"),
    (["--d", "16", "-4"], "must be a positive integer"),
    (["--impl", "flash"], "invalid choice: 'flash'"),
    (["--impl", "naive", "--impl", "flash:attention:x"], "invalid choice: 'flash:attention:x'"),
    (["--grid", "flashy"], "invalid choice: 'flashy'"),
    (["--dtype", "fp16"], "invalid choice: 'fp16'"),
    (["--device", "cuda"], "CUDA is not available"),
    (["--device", "cpu", "--repeats", "3"], "--repeats applies to --interleave runs"),
])
def test_bad_input_exits_2_with_one_line(argv, message):
    if torch.cuda.is_available() and "cuda" in argv:
        pytest.skip("CUDA present")
    result = subprocess.run([sys.executable, str(HERE / "bench_attention.py"), *argv], cwd=HERE,
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 2
    assert message in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and "Traceback" not in result.stderr


def test_dry_run_lists_the_plan_and_runs_nothing(tmp_path, capsys, monkeypatch):
    def forbidden(*args, **kwargs):
        raise AssertionError("--dry-run started a configuration")

    monkeypatch.setattr(sweep, "run_isolated", forbidden)
    monkeypatch.setattr(sweep, "run_sweep", forbidden)
    monkeypatch.setattr(ba, "run_config", forbidden)
    assert ba.main(["--impl", "naive", "sdpa", "--d", "16", "--seq-len", "256", "1024", "--device", "cpu",
                    "--dry-run", "--results-dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert not (tmp_path / "attention").exists()
    assert "dry run: 4 configurations would run" in out
    assert "  1. naive d=16 seq=256 fp32 (predicted need" in out and "  4. sdpa d=16 seq=1024 fp32" in out


def test_columns_and_plot_after_the_run(tmp_path, capsys):
    code, records = run_main(tmp_path, "--seq-len", "16", "32", "--impl", "naive", "sdpa", "--in-process",
                             "--columns", "impl", "seq", "fwd ms", "--plot")
    out = capsys.readouterr().out
    assert code == 0 and len(records) == 4
    headers = [line for line in out.splitlines() if line.startswith("| impl")]
    assert len(headers) == 2 and all([c.strip() for c in h.strip("|").split("|")] == ["impl", "seq", "fwd ms"]
                                     for h in headers)
    (png,) = (tmp_path / "attention").glob("*_attention.png")
    assert png.stat().st_size > 10_000 and str(png) in out


def test_unknown_column_is_a_usage_error(tmp_path, capsys):
    with pytest.raises(SystemExit) as exc:
        ba.main([*TINY, "--columns", "fwd_ms", "--results-dir", str(tmp_path)])
    assert exc.value.code == 2 and "valid columns: impl, d, seq, dtype, fwd ms" in capsys.readouterr().err


# ---- your own kernel: MODULE:CALLABLE, checked before it is timed ----

# Test-local stand-ins for a student's attention code, written to a temporary directory that becomes the current
# one (as a student runs the script from their own repository).
STUDENT_ATTENTION = '''
import math

import torch


def correct(q, k, v, is_causal):
    """Plain PyTorch, right."""
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    if is_causal:
        n = q.shape[-2]
        future = torch.ones(n, n, dtype=torch.bool, device=q.device).triu(1)
        scores = scores.masked_fill(future, float("-inf"))
    return torch.softmax(scores, dim=-1) @ v


def no_mask(q, k, v, is_causal):
    """Wrong: ignores is_causal (every query sees the future)."""
    return correct(q, k, v, False)


def raises(q, k, v, is_causal):
    raise RuntimeError("kernel exploded\\nsecond line that must not reach the table")


def two_arguments(q, k):
    return q


def wrong_shape(q, k, v, is_causal):
    return correct(q, k, v, is_causal)[..., :1]


def wrong_dtype(q, k, v, is_causal):
    return correct(q, k, v, is_causal).double()


def with_lse(q, k, v, is_causal):
    return correct(q, k, v, is_causal), None


class FlashAttentionPytorch(torch.autograd.Function):
    """FlashAttention-2's equations in PyTorch (the handout's flash_forward (a)): saves the log-sum-exp, and the
    backward recomputes P from it."""

    @staticmethod
    def forward(ctx, q, k, v, is_causal):
        scale = 1 / math.sqrt(q.shape[-1])
        scores = q @ k.transpose(-2, -1) * scale
        if is_causal:
            n = q.shape[-2]
            scores = scores.masked_fill(torch.ones(n, n, dtype=torch.bool, device=q.device).triu(1), float("-inf"))
        lse = torch.logsumexp(scores.float(), dim=-1)
        out = (torch.exp(scores.float() - lse[..., None]).to(v.dtype)) @ v
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
        ds = probs * (dp - (grad_out.float() * out.float()).sum(-1, keepdim=True))
        dq = (ds.to(q.dtype) @ k) * scale
        dk = (ds.to(q.dtype).transpose(-2, -1) @ q) * scale
        return dq, dk, dv, None


class NotAFunction:
    pass


NOT_CALLABLE = 3
'''


@pytest.fixture
def student(tmp_path, monkeypatch):
    """A directory holding student_attention.py, made the current directory; the module is imported fresh."""
    folder = tmp_path / "student"
    folder.mkdir()
    (folder / "student_attention.py").write_text(STUDENT_ATTENTION)
    monkeypatch.chdir(folder)
    monkeypatch.delitem(sys.modules, "student_attention", raising=False)
    monkeypatch.setattr(sys, "path", list(sys.path))  # user_code.load adds the current directory: undone after
    yield folder
    sys.modules.pop("student_attention", None)


def test_reference_in_blocks_equals_autograd_of_the_whole(monkeypatch):
    torch.manual_seed(0)
    q, k, v, grad_out = (torch.randn(2, 37, 8, dtype=torch.float64) for _ in range(4))
    monkeypatch.setattr(attention_check, "REFERENCE_BLOCK_BYTES", 2 * 37 * 8 * 6 * 5)  # blocks of 5 rows, then 2
    blocks = attention_check.reference_attention(q, k, v, grad_out)
    inputs = tuple(t.clone().requires_grad_() for t in (q, k, v))
    whole = outputs_and_grads(ba.naive_attention, inputs)
    whole = (whole[0], *torch.autograd.grad(ba.naive_attention(*inputs), inputs, grad_out))
    for a, b in zip(blocks, whole):
        torch.testing.assert_close(a, b, atol=1e-12, rtol=1e-12)


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_check_passes_pytorch_and_fails_a_kernel_without_the_mask(student, dtype):
    torch.manual_seed(0)
    inputs = tuple(torch.randn(2, 64, 16, dtype=ba.DTYPES[dtype], requires_grad=True) for _ in range(3))
    grad_out = torch.randn(2, 64, 16, dtype=ba.DTYPES[dtype])
    for impl in ("naive", "sdpa", "student_attention:correct", "student_attention:FlashAttentionPytorch"):
        check = attention_check.check_implementation(ba.attention_function(impl), inputs, grad_out, dtype, impl)
        assert check["ok"] and check["tolerance"] == attention_check.TOLERANCE[dtype], (impl, check)
        assert set(check["errors"]) == {"out", "dq", "dk", "dv"} and check["max_error"] == max(check["errors"].values())
        if dtype == "fp32":
            assert check["max_error"] < 1e-5  # fp32 all along: rounding only
    wrong = attention_check.check_implementation(ba.attention_function("student_attention:no_mask"), inputs,
                                                 grad_out, dtype, "no_mask")
    assert not wrong["ok"] and wrong["max_error"] > 0.2  # an error of order 1, far above either tolerance


@pytest.mark.parametrize("spec, message", [
    ("student_attention:raises", "student_attention:raises raised RuntimeError in forward: kernel exploded"),
    ("student_attention:wrong_shape", "returned (2, 16, 1) float32 on cpu in forward; expected (2, 16, 8) float32"),
    ("student_attention:wrong_dtype", "returned (2, 16, 8) float64 on cpu in forward; expected (2, 16, 8) float32"),
    ("student_attention:with_lse", "returned tuple in forward"),
])
def test_a_kernel_that_fails_is_one_line_naming_it(student, spec, message):
    inputs = random_inputs(dtype=torch.float32)
    with pytest.raises(attention_check.ImplementationError) as exc:
        attention_check.check_implementation(ba.attention_function(spec), inputs, torch.ones(2, 16, 8), "fp32", spec)
    assert message in str(exc.value) and "\n" not in str(exc.value)


def test_a_kernel_without_backward_is_named():
    inputs = random_inputs(dtype=torch.float32)
    with pytest.raises(attention_check.ImplementationError, match="mine's output has no autograd graph"):
        attention_check.run_implementation(lambda q, k, v: q.detach(), inputs, torch.ones(2, 16, 8), "mine")


@pytest.mark.parametrize("spec, message", [
    ("student_attention:two_arguments", "cannot be called as f(q, k, v, is_causal): too many positional"),
    ("student_attention:NotAFunction", "is a class (NotAFunction), not a function"),
    ("student_attention:NOT_CALLABLE", "is a int, not callable"),
    ("student_attention:missing", "has no 'missing'"),
    ("no_such_student_module:attention", "no module named 'no_such_student_module' in the current directory"),
])
def test_what_cannot_be_loaded_is_a_load_error(student, spec, message):
    with pytest.raises(user_code.LoadError) as exc:
        ba.attention_function(spec)
    assert message in str(exc.value) and "\n" not in str(exc.value)


def test_your_kernels_beside_ours_checked_then_timed_and_failures_are_rows(student, tmp_path, capsys):
    """The sweep goes on past a kernel that raises and one that cannot be loaded; a wrong one is timed and flagged."""
    impls = ["correct", "no_mask", "raises", "FlashAttentionPytorch", "two_arguments"]
    code, records = run_main(tmp_path, "--seq-len", "16", "--impl", "naive", "sdpa", "--in-process",
                             "--impl", *(f"student_attention:{name}" for name in impls))
    assert code == 0
    by_impl = {r["config"]["impl"].removeprefix("student_attention:"): r for r in records}
    assert list(by_impl) == ["naive", "sdpa", *impls]
    for name in ("naive", "sdpa", "correct", "FlashAttentionPytorch"):
        assert by_impl[name]["status"] == "ok" and by_impl[name]["check"]["ok"], name
        assert by_impl[name]["timing"]["method"] == "sync timer"
        assert all(len(by_impl[name][f"{phase}_ms"]) == 3 for phase in ba.PHASES)
    wrong = by_impl["no_mask"]
    assert wrong["status"] == "ok" and not wrong["check"]["ok"] and wrong["forward_ms_mean"] > 0
    assert by_impl["raises"]["status"] == ("error: ImplementationError: student_attention:raises raised "
                                           "RuntimeError in forward: kernel exploded")
    assert by_impl["two_arguments"]["status"].startswith("error: LoadError: student_attention:two_arguments cannot")
    out = capsys.readouterr().out
    assert "| WRONG" in out and "x (wrong)" in out  # its own table and its speed-ups in the comparison
    assert f"WRONG: student_attention:no_mask ({wrong['check']['worst']} error" in out
    assert "second line" not in out


def test_your_kernel_is_imported_in_the_child_process_from_the_current_directory(student, tmp_path, capsys):
    code, records = run_main(tmp_path, "--seq-len", "16", "--impl", "student_attention:raises",
                             "student_attention:correct")
    assert code == 0
    assert [r["status"].split(":")[0] for r in records] == ["error", "ok"]
    assert records[1]["check"]["ok"] and records[1]["pid"] != records[0].get("pid", -1)


def test_flash_grid_is_the_handouts_and_puts_naive_first(tmp_path, capsys):
    assert ba.main(["--grid", "flash", "--impl", "mine:attention", "--device", "cpu", "--dry-run",
                    "--results-dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "settings: grid flash, batch 1, bf16 fp32, causal" in out
    assert "dry run: 160 configurations would run" in out  # 2 dtypes x 4 d x 10 seq x (naive, yours)
    assert "  1. naive d=16 seq=128 bf16 (predicted need" in out and "  2. mine:attention d=16 seq=128 bf16" in out
    assert "160. mine:attention d=128 seq=65536 fp32" in out
    args, runs = ba.parse_args(["--grid", "flash", "--device", "cpu"])
    assert {(r.impl, r.batch_size) for r in runs} == {("naive", 1), ("sdpa", 1)}
    assert sorted({r.seq_len for r in runs}) == [2**i for i in range(7, 17)] and sorted({r.d for r in runs}) == [
        16, 32, 64, 128]


def test_flash_grid_table_has_a_row_per_seq_d_dtype_with_three_phases(student, tmp_path, capsys):
    code, records = run_main(tmp_path, "--grid", "flash", "--impl", "student_attention:FlashAttentionPytorch",
                             "--seq-len", "16", "32", "--in-process")
    assert code == 0 and len(records) == 2 * 2 * 2  # dtype x seq x (naive, yours); TINY gives d 8, batch 2
    assert all(r["status"] == "ok" and r["check"]["ok"] for r in records)
    assert {r["config"]["dtype"] for r in records} == {"bf16", "fp32"}
    out = capsys.readouterr().out
    comparison = out[out.index("### comparison"):]
    header = next(line for line in comparison.splitlines() if line.startswith("|"))
    yours = "student_attention:FlashAttentionPytorch"
    for column in ("dtype", "naive fwd+bwd ms", f"{yours} bwd ms", f"{yours} fwd+bwd speed-up", "check"):
        assert column in header
    rows = [line for line in comparison.splitlines() if line.startswith("|") and ("bf16" in line or "fp32" in line)]
    assert len(rows) == 4 and all(line.rstrip("| ").endswith("ok") for line in rows)
    assert "timing: sync timer (10 warm-up" not in out and "timing: sync timer (1 warm-up and 3 timed calls" in out
