"""What torch.autocast does to each tensor of the study's ToyModel, with float16 and with bfloat16.

Answers the study's mixed-precision question: under autocast, what are the dtypes of the parameters, of each
layer's output (fc1, ReLU, LayerNorm), of the logits, of the loss and of the gradients? Every dtype is captured
from the tensors themselves (forward pre-hooks for the parameters, forward hooks for the outputs, .grad after
backward), never assumed.

The answer depends on the device: CUDA autocast runs layer_norm (and softmax, log_softmax, cross_entropy) in
float32, CPU autocast does not. Run it on the device your answer is about.

    python3 toy_autocast.py                          # CUDA if present, else CPU (with a note saying so)
    python3 toy_autocast.py --device cuda            # the CUDA answer (exit 2 where there is no CUDA)
    python3 toy_autocast.py --dtype bf16             # one autocast dtype only
    python3 toy_autocast.py --fmt latex_booktabs     # the table for a LaTeX writeup

The table (precision_tables.py, the code report.py re-renders saved runs with) is printed on stdout and saved,
with one JSON record per autocast dtype, under results/precision/.
"""
from __future__ import annotations

import argparse
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

import cli
import common
import report
from common import DTYPES, dtype_name, environment
from isolation import run_isolated
from results import ResultFiles, progress

AUTOCAST_DTYPES = ("fp16", "bf16")


class ToyModel(nn.Module):
    """The study's ToyModel: fc2(ln(relu(fc1(x)))), no biases on the linears."""

    def __init__(self, in_features: int, out_features: int):
        super().__init__()
        self.fc1 = nn.Linear(in_features, 10, bias=False)
        self.relu = nn.ReLU()
        self.ln = nn.LayerNorm(10)
        self.fc2 = nn.Linear(10, out_features, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.ln(self.relu(self.fc1(x))))


# Row labels for each module's output, in forward order.
OUTPUT_LABELS = {"fc1": "fc1 output", "relu": "ReLU output", "ln": "LayerNorm output", "fc2": "logits (fc2 output)"}


def observe_dtypes(device: str, dtype: str, in_features: int, out_features: int, batch_size: int,
                   seed: int) -> dict[str, str]:
    """Forward (under autocast), cross-entropy loss and backward on the ToyModel; returns {row label: dtype name}
    for the parameters as seen inside the autocast region, each module's output, the loss and each gradient."""
    dev = torch.device(device)
    torch.manual_seed(seed)
    model = ToyModel(in_features, out_features).to(dev)
    x = torch.randn(batch_size, in_features, device=dev)
    targets = torch.randint(0, out_features, (batch_size,), device=dev)
    seen: dict[str, str] = {}

    def record_params(name: str):
        def hook(module: nn.Module, inputs: tuple) -> None:  # runs inside the autocast region
            for pname, p in module.named_parameters(recurse=False):
                seen[f"parameter {name}.{pname} (inside autocast)"] = dtype_name(p.dtype)
        return hook

    def record_output(name: str):
        def hook(module: nn.Module, inputs: tuple, output: torch.Tensor) -> None:
            seen[OUTPUT_LABELS[name]] = dtype_name(output.dtype)
        return hook

    handles = []
    for name, module in model.named_children():
        handles.append(module.register_forward_pre_hook(record_params(name)))
        handles.append(module.register_forward_hook(record_output(name)))
    try:
        with common.precision_context(dev, dtype):
            logits = model(x)
            loss = F.cross_entropy(logits, targets)
        seen["loss (cross_entropy)"] = dtype_name(loss.dtype)
        loss.backward()
    finally:
        for handle in handles:
            handle.remove()
    for pname, p in model.named_parameters():
        seen[f"gradient {pname}.grad"] = dtype_name(p.grad.dtype)
    return seen


# ---- command line ----


def build_parser() -> argparse.ArgumentParser:
    p = cli.ArgParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="auto", help="auto (CUDA if present), cpu, cuda, cuda:N")
    p.add_argument("--dtype", nargs="+", choices=AUTOCAST_DTYPES, default=list(AUTOCAST_DTYPES),
                   help="autocast dtype(s), one table column each")
    p.add_argument("--in-features", type=cli.positive_int, default=20, help="ToyModel input features")
    p.add_argument("--out-features", type=cli.positive_int, default=5, help="ToyModel output features (classes)")
    p.add_argument("--batch-size", type=cli.positive_int, default=8, help="rows of random input")
    p.add_argument("--seed", type=cli.seed_int, default=0, help="random seed for weights and data")
    cli.add_output_args(p, default_stem="toy_autocast")
    return p


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = build_parser()
    args = parser.parse_args(argv)
    args.device = common.device_or_exit(parser, args.device)
    args.dtype = list(dict.fromkeys(args.dtype))  # a dtype given twice is one column
    cli.check_tensor_sizes(parser, {"input": (args.batch_size, args.in_features),
                                       "fc1 weight": (10, args.in_features),
                                       "logits": (args.batch_size, args.out_features)})
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    files = ResultFiles(args.results_dir, "precision", args.out, "toy_autocast")
    env = environment(args.device)
    records = []
    for dtype in args.dtype:
        kwargs = {"device": str(args.device), "dtype": dtype, "in_features": args.in_features,
                  "out_features": args.out_features, "batch_size": args.batch_size, "seed": args.seed}
        # in-process: a few tiny tensors, nothing to isolate; the runner still turns a failure into a status
        result = run_isolated(observe_dtypes, kwargs, in_process=True)
        status = "ok" if result["ok"] else result["status"]
        records.append({"experiment": "toy_autocast", "autocast_dtype": dtype_name(DTYPES[dtype]),
                        "device": str(args.device), "status": status, "dtypes": result.get("value"),
                        "traceback": result.get("traceback"), "config": kwargs, "environment": env})
        files.append_record(records[-1])
        progress(f"{dtype_name(DTYPES[dtype])} autocast on {args.device}: {status}")
    return report.publish("toy_autocast", records, files, args.fmt)

if __name__ == "__main__":
    sys.exit(main())
