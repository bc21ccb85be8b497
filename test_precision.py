"""Tests for precision_demo.py and toy_autocast.py (CPU, a few seconds)."""
from __future__ import annotations

import re
import subprocess
import sys
from contextlib import redirect_stdout
from decimal import Decimal
from io import StringIO
from pathlib import Path

import numpy as np
import pytest
import torch

import precision_demo
import precision_tables
import toy_autocast
from results import read_records

HERE = Path(__file__).resolve().parent


def only_file(folder: Path, pattern: str) -> Path:
    (path,) = sorted(folder.glob(pattern))
    return path


# ---- precision_demo ----


@pytest.fixture(scope="module")
def demo_run(tmp_path_factory):
    """One default run (the study's 0.01 x 1000): (stdout, results folder, records by case)."""
    out_dir = tmp_path_factory.mktemp("demo")
    buffer = StringIO()
    with redirect_stdout(buffer):
        assert precision_demo.main(["--results-dir", str(out_dir), "--out", "demo"]) == 0
    folder = out_dir / "precision"
    records = {r["case"]: r for r in read_records(folder / "demo.jsonl")}
    return buffer.getvalue(), folder, records


def test_sums_are_computed_and_fp32_accumulators_stay_close(demo_run):
    _, _, records = demo_run
    assert set(records) == {c.name for c in precision_demo.CASES}
    assert records["2"]["result"] < 9.96  # float16 accumulator: far below 10 (9.953125)
    assert records["2-bf16"]["result"] < 5  # bfloat16 accumulator stalls (at 4.0)
    for case in ("1", "3", "4", "3-bf16"):  # float32 accumulators
        assert abs(records[case]["result"] - 10) < 0.01, case
        assert records[case]["result_dtype"] == "float32"
    assert records["3"]["result"] == records["4"]["result"]
    assert records["1"]["result"] != records["3"]["result"]
    # cases 3 and 4 are exactly 1000 x the float16 addend: the error is the addend's, not the accumulator's
    assert records["3"]["result"] == records["3"]["count_times_stored"]
    assert records["2"]["abs_error"] == pytest.approx(abs(records["2"]["result"] - 10))


def test_stored_value_column_is_exact(demo_run):
    stdout, _, records = demo_run
    # cross-checked against numpy's float16 and float32 (torch is what the script uses)
    assert records["3"]["addend_stored_exact"] == str(Decimal(float(np.float16(0.01)))) == "0.01000213623046875"
    assert records["1"]["addend_stored_exact"] == str(Decimal(float(np.float32(0.01))))
    assert records["1"]["addend_stored_exact"] == "0.00999999977648258209228515625"
    assert records["2-bf16"]["addend_stored_exact"] == "0.010009765625"
    assert "0.01000213623046875 = 1311/2^17" in stdout
    assert "10.00213623046875" in stdout  # the result printed with all its digits, not rounded to 10.00


def test_demo_notes_explain_cases_3_and_4(demo_run):
    stdout, _, _ = demo_run
    assert "Cases 3 and 4 are equal" in stdout
    assert "promotes the float16 addend to float32" in stdout
    assert "bfloat16 accumulator (case 2-bf16) stops at 4.0" in stdout


def test_demo_writes_files_and_never_overwrites(demo_run, capsys):
    stdout, folder, _ = demo_run
    assert (folder / "demo.md").read_text().strip() in stdout
    assert f"wrote {folder / 'demo.md'} and {folder / 'demo.jsonl'}" in stdout
    precision_demo.main(["--results-dir", str(folder.parent), "--out", "demo", "--count", "10"])
    assert len(read_records(folder / "demo.jsonl")) == len(precision_demo.CASES)
    assert len(read_records(folder / "demo-2.jsonl")) == len(precision_demo.CASES)


def test_demo_latex_booktabs(tmp_path, capsys):
    precision_demo.main(["--results-dir", str(tmp_path), "--count", "10", "--fmt", "latex_booktabs"])
    out = capsys.readouterr().out
    assert "\\toprule" in out and "\\bottomrule" in out and "float16 -\\ensuremath{>} float32" in out


# ---- toy_autocast ----


@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
def test_cpu_autocast_dtypes_as_observed(tmp_path, capsys, dtype):
    """What CPU autocast gives on torch 2.13: matmul outputs (and everything after them, LayerNorm included) in
    the autocast dtype; parameters, loss and gradients in float32."""
    assert toy_autocast.main(["--device", "cpu", "--dtype", dtype, "--results-dir", str(tmp_path)]) == 0
    (record,) = read_records(only_file(tmp_path / "precision", "toy_autocast-*.jsonl"))
    low = {"fp16": "float16", "bf16": "bfloat16"}[dtype]
    assert record["status"] == "ok" and record["autocast_dtype"] == low and record["device"] == "cpu"
    seen = record["dtypes"]
    for name in ("fc1.weight", "ln.weight", "ln.bias", "fc2.weight"):
        assert seen[f"parameter {name} (inside autocast)"] == "float32"
        assert seen[f"gradient {name}.grad"] == "float32"
    for label in ("fc1 output", "ReLU output", "LayerNorm output", "logits (fc2 output)"):
        assert seen[label] == low, label
    assert seen["loss (cross_entropy)"] == "float32"


def test_toy_table_has_both_columns_and_the_cpu_note(tmp_path, capsys):
    toy_autocast.main(["--device", "cpu", "--results-dir", str(tmp_path), "--fmt", "latex_booktabs"])
    out = capsys.readouterr().out
    assert "torch.autocast on cpu" in out
    assert precision_tables.TOY_CPU_NOTE in out
    assert "float16 autocast" in out and "bfloat16 autocast" in out and "\\toprule" in out
    md = only_file(tmp_path / "precision", "toy_autocast-*.md").read_text()
    assert precision_tables.TOY_CPU_NOTE in md
    assert len(read_records(only_file(tmp_path / "precision", "toy_autocast-*.jsonl"))) == 2


def test_toy_on_cuda_has_no_cpu_note_and_keeps_failures_as_data(tmp_path, capsys, monkeypatch):
    """CUDA path with fakes (no GPU here): the title names cuda, the CPU note is absent, and a dtype whose run
    fails shows its status instead of dtypes while the other column is kept."""
    def fake_observe(device, dtype, **_):
        if dtype == "bf16":
            raise RuntimeError("bfloat16 not supported on this GPU")
        return {"fc1 output": "float16", "LayerNorm output": "float32"}

    monkeypatch.setattr(toy_autocast.common, "device_or_exit", lambda parser, name: torch.device("cuda"))
    monkeypatch.setattr(toy_autocast, "environment",
                        lambda device: {"device": "cuda", "device_name": "Fake GPU", "torch": torch.__version__,
                                        "cuda": "12.8", "tf32_matmul": False})
    monkeypatch.setattr(toy_autocast, "observe_dtypes", fake_observe)
    toy_autocast.main(["--results-dir", str(tmp_path)])
    out = capsys.readouterr().out
    assert "torch.autocast on cuda (Fake GPU)" in out
    assert precision_tables.TOY_CPU_NOTE not in out
    assert re.search(r"\|\s*LayerNorm output\s*\|\s*float32\s*\|", out)
    records = read_records(only_file(tmp_path / "precision", "toy_autocast-*.jsonl"))
    assert records[0]["status"] == "ok"
    assert records[1]["status"].startswith("error: RuntimeError: bfloat16 not supported")
    assert out.count("error: RuntimeError: bfloat16 not supported") == 2  # one cell per row


@pytest.mark.parametrize("script,argv", [
    (precision_demo, ["--count", "0"]), (precision_demo, ["--count", "2000000"]), (precision_demo, ["--value", "nan"]),
    (precision_demo, ["--value", "0"]), (precision_demo, ["--fmt", "nope"]), (toy_autocast, ["--batch-size", "0"]),
    (toy_autocast, ["--dtype", "fp32"]), (toy_autocast, ["--device", "tpu"])])
def test_bad_input_is_a_usage_error(script, argv):
    with pytest.raises(SystemExit) as exc:
        script.parse_args(argv)
    assert exc.value.code == 2


@pytest.mark.parametrize("script,argv", [("toy_autocast.py", ["--device", "cuda"]),
                                         ("precision_demo.py", ["--count", "-5"])])
def test_exit_status_2_without_traceback(script, argv):
    if script == "toy_autocast.py" and torch.cuda.is_available():
        pytest.skip("CUDA is present: --device cuda is valid here")
    proc = subprocess.run([sys.executable, str(HERE / script), *argv], capture_output=True, text=True, cwd=HERE,
                          timeout=60)
    assert proc.returncode == 2
    assert "error:" in proc.stderr and "Traceback" not in proc.stderr
