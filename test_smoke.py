"""Smoke tests across the whole toolkit: every script answers --help, also from a folder of impostors named as our
modules, importing does no work, and the model, loss and AdamW together actually learn."""
import importlib
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from model import TransformerLM, cross_entropy
from results import ModelConfig
from optim import AdamW

HERE = Path(__file__).resolve().parent
SCRIPTS = ["bench_e2e.py", "bench_attention.py", "mem_profile.py", "precision_demo.py", "toy_autocast.py",
           "kernel_tables.py"]


@pytest.fixture(scope="module")
def impostors(tmp_path_factory):
    """A student's folder holding a file named as each of our modules (and torch's): importing one leaves a mark."""
    folder = tmp_path_factory.mktemp("impostors")
    for name in [p.stem for p in HERE.glob("*.py")] + ["torch", "numpy", "tabulate"]:
        (folder / f"{name}.py").write_text(f"open('marks', 'a').write('{name} ')\nraise SystemExit('impostor')\n")
    return folder


@pytest.mark.parametrize("script", SCRIPTS)
def test_every_script_answers_help_from_a_folder_of_impostors(script, impostors):
    result = subprocess.run([sys.executable, str(HERE / script), "--help"], cwd=impostors, capture_output=True,
                            text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert "usage:" in result.stdout
    assert "--fmt" in result.stdout  # every script takes any tabulate format
    assert not (impostors / "marks").exists(), (impostors / "marks").read_text()


def test_nsys_run_answers_help():
    env = {**os.environ, "PYTHON": sys.executable}  # this interpreter, whatever python3 is on PATH
    result = subprocess.run(["bash", str(HERE / "nsys_run.sh"), "--help"], capture_output=True, text=True, timeout=30,
                            env=env)
    assert result.returncode == 0 and "nsys_run.sh" in result.stdout


@pytest.mark.parametrize("module", [s.removesuffix(".py") for s in SCRIPTS] + ["common", "model", "optim",
                                                                                "runner"])
def test_import_does_no_work(module, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # a script that wrote results at import would create ./results here
    importlib.import_module(module)
    assert not (tmp_path / "results").exists()


def test_model_loss_and_adamw_learn_a_fixed_batch():
    torch.manual_seed(0)
    cfg = ModelConfig(d_model=64, d_ff=128, num_layers=2, num_heads=4, vocab_size=50, context_length=16)
    model = TransformerLM(cfg)
    opt = AdamW(model.parameters(), lr=3e-3)
    tokens = torch.randint(0, cfg.vocab_size, (4, 16))
    targets = torch.roll(tokens, -1, dims=1)
    losses = []
    for _ in range(60):
        loss = cross_entropy(model(tokens), targets)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.item())
    assert losses[0] > 3.0  # about log(50) at random init
    assert losses[-1] < 0.5 * losses[0]  # it memorises the batch
