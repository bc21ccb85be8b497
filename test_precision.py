"""Tests for precision_demo.py and toy_autocast.py (CPU, in process)."""
from __future__ import annotations

from contextlib import redirect_stdout
from decimal import Decimal
from io import StringIO

import numpy as np
import pytest
import torch

import precision_demo
import report
import toy_autocast
from results import read_records

# The handout's mixed_precision_accumulation snippet, character for character.
HANDOUT_SNIPPET = """
s = torch.tensor(0,dtype=torch.float32)
for i in range(1000):
    s += torch.tensor(0.01,dtype=torch.float32)
print(s)
s = torch.tensor(0,dtype=torch.float16)
for i in range(1000):
    s += torch.tensor(0.01,dtype=torch.float16)
print(s)
s = torch.tensor(0,dtype=torch.float32)
for i in range(1000):
    s += torch.tensor(0.01,dtype=torch.float16)
print(s)
s = torch.tensor(0,dtype=torch.float32)
for i in range(1000):
    x = torch.tensor(0.01,dtype=torch.float16)
    s += x.type(torch.float32)
print(s)
"""


@pytest.fixture(scope="module")
def demo_run(tmp_path_factory):
    """One default run (0.01 x 1000): (stdout, results folder, records by case)."""
    out_dir = tmp_path_factory.mktemp("demo")
    buffer = StringIO()
    with redirect_stdout(buffer):
        assert precision_demo.main(["--results-dir", str(out_dir), "--out", "demo"]) == 0
    folder = out_dir / "precision"
    records = {r["case"]: r for r in read_records(folder / "demo.jsonl")}
    return buffer.getvalue(), folder, records


def test_sums_equal_the_handouts_snippet_run_literally(demo_run):
    stdout, _, records = demo_run
    printed = []
    exec(HANDOUT_SNIPPET, {"torch": torch, "print": printed.append})
    assert [s.item() for s in printed] == [records[case]["result"] for case in "1234"]
    assert [str(s.dtype).removeprefix("torch.") for s in printed] == [
        records[case]["accumulator_dtype"] for case in "1234"]
    for s in printed:
        assert repr(s.item()) in stdout  # every sum printed with all its digits


def test_fp32_accumulators_stay_close_and_low_precision_ones_do_not(demo_run):
    _, _, records = demo_run
    assert records["2"]["result"] == 9.953125  # float16 accumulator: steps of 2^-7 near 10
    assert records["2-bf16"]["result"] == 4.0  # bfloat16 accumulator stalls
    for case in ("1", "3", "4", "3-bf16"):
        assert abs(records[case]["result"] - 10) < 0.01, case
    # cases 3 and 4 are exactly 1000 x the float16 addend: the error is the addend's
    assert records["3"]["result"] == records["4"]["result"] == records["3"]["count_times_stored"]
    assert records["3"]["promoted_dtype"] == "float32"
    assert records["2"]["abs_error"] == pytest.approx(abs(records["2"]["result"] - 10))


def test_stored_addend_is_exact_and_explained(demo_run):
    stdout, _, records = demo_run
    # against numpy's float16 and float32 (torch is what the script uses)
    assert records["3"]["addend_stored_exact"] == str(Decimal(float(np.float16(0.01))))
    assert records["1"]["addend_stored_exact"] == str(Decimal(float(np.float32(0.01))))
    assert records["2-bf16"]["addend_stored_exact"] == "0.010009765625"  # 41 / 2^12
    assert records["2"]["result_spacing"] == 2 ** -7  # float16 near 10: 11 significant bits
    assert records["2-bf16"]["result_spacing"] == 2 ** -5  # bfloat16 near 4: 8 bits
    assert "0.01000213623046875 = 1311/2^17" in stdout
    assert "Cases 3 and 4 are equal" in stdout and "to float32 before adding" in stdout
    assert "(case 2-bf16) ends at 4.0" in stdout and "every add rounds away" in stdout
    assert "(case 2) ends at 9.953125" in stdout


def test_demo_saves_what_it_prints_and_never_overwrites(demo_run):
    stdout, folder, _ = demo_run
    assert (folder / "demo.md").read_text().strip() in stdout
    assert f"wrote {folder / 'demo.md'} and {folder / 'demo.jsonl'}" in stdout
    with redirect_stdout(StringIO()):
        precision_demo.main(["--results-dir", str(folder.parent), "--out", "demo", "--count", "10"])
    assert len(read_records(folder / "demo.jsonl")) == len(precision_demo.CASES)
    assert [r["count"] for r in read_records(folder / "demo-2.jsonl")] == [10] * 6


def test_another_sum(tmp_path):
    with redirect_stdout(StringIO()):
        precision_demo.main(["--results-dir", str(tmp_path), "--out", "x", "--value", "0.5",
                             "--count", "8"])
    records = read_records(tmp_path / "precision" / "x.jsonl")
    assert all(r["result"] == 4.0 and r["abs_error"] == 0 for r in records)  # 0.5 is exact
    assert records[0]["partial_sums"][0] == [1, 0.5] and records[0]["partial_sums"][-1] == [8, 4.0]


def test_an_overflowing_float16_sum_is_a_row(tmp_path, capsys):
    """17 x 3853 = 65501 passes the guard, but float16 rounds each add near 65504 up (by 32): case 2 is inf."""
    assert precision_demo.main(["--results-dir", str(tmp_path), "--out", "o", "--value", "17",
                                "--count", "3853"]) == 0
    out = capsys.readouterr().out
    case2 = next(line for line in out.splitlines() if line.startswith("| 2 "))
    assert case2.split("|")[6].strip() == "inf" and "(case 2) overflows" in out
    assert (tmp_path / "precision" / "o.md").read_text() in out


# ---- toy_autocast ----

def test_cpu_autocast_dtypes_as_observed(tmp_path, capsys):
    """CPU autocast on torch 2.13: matmul outputs (and what follows, LayerNorm included) in the
    autocast dtype; parameters, loss and gradients in float32."""
    assert toy_autocast.main(["--device", "cpu", "--results-dir", str(tmp_path), "--out", "t"]) == 0
    out = capsys.readouterr().out
    records = read_records(tmp_path / "precision" / "t.jsonl")
    assert [r["autocast_dtype"] for r in records] == ["float16", "bfloat16"]
    for record in records:
        low, seen = record["autocast_dtype"], record["dtypes"]
        assert record["status"] == "ok" and record["device"] == "cpu"
        for name in ("fc1.weight", "ln.weight", "ln.bias", "fc2.weight"):
            assert seen[f"parameter {name} (inside autocast)"] == "float32"
            assert seen[f"gradient {name}.grad"] == "float32"
        for label in ("fc1 output", "ReLU output", "LayerNorm output", "logits (fc2 output)"):
            assert seen[label] == low, label
        assert seen["loss (cross_entropy)"] == "float32"
    assert "torch.autocast on cpu" in out and "float16 autocast" in out
    assert report.TOY_CPU_NOTE in out
    assert report.TOY_CPU_NOTE in (tmp_path / "precision" / "t.md").read_text()


def test_toy_on_cuda_has_no_cpu_note_and_a_failure_is_a_row(tmp_path, capsys, monkeypatch):
    """The CUDA path with fakes (no GPU here): the CPU note is absent, and a dtype whose run fails
    shows its status in its column while the other column is kept."""
    def fake_observe(device, dtype, **_):
        if dtype == "bf16":
            raise RuntimeError("bfloat16 not supported on this GPU")
        return {"fc1 output": "float16", "LayerNorm output": "float32"}

    monkeypatch.setattr(toy_autocast, "device_or_exit", lambda parser, name: torch.device("cuda"))
    monkeypatch.setattr(toy_autocast, "environment", lambda device: {
        "device": "cuda", "device_name": "Fake GPU", "torch": torch.__version__, "cuda": "12.8",
        "tf32_matmul": False})
    monkeypatch.setattr(toy_autocast, "observe_dtypes", fake_observe)
    assert toy_autocast.main(["--results-dir", str(tmp_path), "--out", "c"]) == 0
    out = capsys.readouterr().out
    assert "torch.autocast on cuda (Fake GPU)" in out
    assert report.TOY_CPU_NOTE not in out
    records = read_records(tmp_path / "precision" / "c.jsonl")
    assert [r["status"] for r in records] == [
        "ok", "error: RuntimeError: bfloat16 not supported on this GPU"]
    assert out.count("error: RuntimeError: bfloat16 not supported") == 2  # one cell per row


@pytest.mark.parametrize("script,argv", [
    (precision_demo, ["--count", "0"]), (precision_demo, ["--count", "2000000"]),
    (precision_demo, ["--value", "nan"]), (precision_demo, ["--value", "0"]),
    (precision_demo, ["--value", "1", "--count", "70000"]), (precision_demo, ["--fmt", "nope"]),
    (precision_demo, ["--value", "6550", "--count", "10"]),  # float16 stores 6552: 65520 is inf
    (toy_autocast, ["--batch-size", "0"]), (toy_autocast, ["--dtype", "fp32"]),
    (toy_autocast, ["--device", "tpu"]),
    pytest.param(toy_autocast, ["--device", "cuda"], marks=pytest.mark.skipif(
        torch.cuda.is_available(), reason="CUDA is present: --device cuda is valid here")),
    (toy_autocast, ["--batch-size", str(2 ** 62), "--in-features", str(2 ** 62)])])
def test_bad_input_is_one_line_and_exit_2(script, argv, capsys):
    with pytest.raises(SystemExit) as exc:
        script.parse_args(argv)
    err = capsys.readouterr().err
    assert exc.value.code == 2 and len(err.strip().splitlines()) == 1 and "error:" in err
