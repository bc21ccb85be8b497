"""bench_attention.py: the implementations agree, the timers hold only what they time, the memory formula and
measurement, the fit guard, failures as rows, the sdpa backend, the command line."""
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import bench_attention as ba
import sweep
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
    events = CountingAttention.events = []
    timer = SyncTimer(sync=lambda: events.append("sync"))
    inputs = random_inputs()
    for _ in range(3):
        seconds = ba.timed_step(CountingAttention.apply, inputs, torch.ones(2, 16, 8, dtype=torch.float64), timer)
        assert set(seconds) == {"forward", "backward"} and all(s >= 0 for s in seconds.values())
    # the forward timer holds only the forward, the backward timer only the backward (of that forward's graph)
    assert spans(events) == [["forward"], ["backward"]] * 3
    assert events.count("forward") == events.count("backward") == 3


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
    # 2 x 2^20 x 2^20 fp32 scores and probabilities: 16 TiB; skipped before anything is allocated
    code, (record,) = run_main(tmp_path, "--seq-len", "1048576", "--impl", "naive", "--in-process")
    assert code == 0 and record["status"].startswith("skipped: needs 61440.")
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
    (["--dtype", "fp16"], "invalid choice: 'fp16'"),
    (["--device", "cuda"], "CUDA is not available"),
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
    assert exc.value.code == 2 and "valid columns: impl, d, seq, fwd ms" in capsys.readouterr().err
