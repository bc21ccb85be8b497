"""benchmarking_mixed_precision (a), (b): the dtypes in the handout's ToyModel under autocast.

The dtypes of the parameters, each layer's output, the logits, the loss and the gradients, read from the
tensors themselves. The answer depends on the device: CUDA autocast runs layer_norm in float32, CPU does not.

    python3 toy_autocast.py                          # CUDA if present, else CPU (with a note)
    python3 toy_autocast.py --device cuda            # the CUDA answer (exit 2 without CUDA)
    python3 toy_autocast.py --dtype bf16             # one autocast dtype only
    python3 toy_autocast.py --fmt latex_booktabs     # the table for a LaTeX writeup

Printed, and saved with one JSON record per autocast dtype under results/precision/.
"""
from __future__ import annotations

import argparse

import torch
import torch.nn as nn

import report
import results
from common import DTYPES, device_or_exit, dtype_name, environment, failure_status
from results import ResultFiles, progress


class ToyModel(nn.Module):
    def __init__(self, in_features: int, out_features: int):
        super().__init__()
        self.fc1 = nn.Linear(in_features, 10, bias=False)
        self.ln = nn.LayerNorm(10)
        self.fc2 = nn.Linear(10, out_features, bias=False)
        self.relu = nn.ReLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.relu(self.fc1(x))
        x = self.ln(x)
        x = self.fc2(x)
        return x


OUTPUT_LABELS = {"fc1": "fc1 output", "relu": "ReLU output", "ln": "LayerNorm output",
                 "fc2": "logits (fc2 output)"}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = results.ArgParser(description=__doc__.split("\n\n")[0])
    results.add_device_args(p)
    p.add_argument("--dtype", nargs="+", choices=("fp16", "bf16"), default=["fp16", "bf16"],
                   help="autocast dtype(s), one table column each")
    p.add_argument("--in-features", type=results.positive_int, default=20,
                   help="ToyModel input features")
    p.add_argument("--out-features", type=results.positive_int, default=5,
                   help="ToyModel output features (classes)")
    p.add_argument("--batch-size", type=results.positive_int, default=8, help="rows of random input")
    p.add_argument("--seed", type=results.seed_int, default=0, help="random seed for weights and data")
    results.add_output_args(p, default_stem="toy_autocast-<UTC time>")
    args = p.parse_args(argv)
    args.device = device_or_exit(p, args.device)
    args.dtype = list(dict.fromkeys(args.dtype))  # a dtype given twice is one column
    results.check_tensor_sizes(p, {"input": (args.batch_size, args.in_features),
                               "fc1 weight": (10, args.in_features),
                               "logits": (args.batch_size, args.out_features)})
    return args


def observe_dtypes(device: str, dtype: str, in_features: int, out_features: int,
                   batch_size: int, seed: int) -> dict[str, str]:
    """{row label: dtype name}: parameters and outputs inside autocast (hooks), the loss, the gradients."""

    device = torch.device(device)
    torch.manual_seed(seed)
    model = ToyModel(in_features, out_features).to(device)
    x = torch.randn(batch_size, in_features, device=device)
    targets = torch.randint(0, out_features, (batch_size,), device=device)
    outputs = {}
    for name, module in model.named_children():
        module.register_forward_hook(
            lambda module, args, out, name=name: outputs.update({OUTPUT_LABELS[name]: out.dtype}))
    with torch.autocast(device_type=device.type, dtype=DTYPES[dtype]):
        params = {f"parameter {n} (inside autocast)": p.dtype for n, p in model.named_parameters()}
        logits = model(x)
        loss = nn.functional.cross_entropy(logits, targets)
    loss.backward()
    grads = {f"gradient {n}.grad": p.grad.dtype for n, p in model.named_parameters()}
    seen = {**params, **outputs, "loss (cross_entropy)": loss.dtype, **grads}
    return {label: dtype_name(d) for label, d in seen.items()}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    files = ResultFiles(args.results_dir, "precision", args.out, "toy_autocast")
    env = environment(args.device)
    records = []
    for dtype in args.dtype:
        config = {"device": str(args.device), "dtype": dtype, "in_features": args.in_features,
                  "out_features": args.out_features, "batch_size": args.batch_size,
                  "seed": args.seed}
        try:
            dtypes, status = observe_dtypes(**config), "ok"
        except Exception as exc:  # noqa: BLE001 - a failure is a row: the other dtype still runs
            dtypes, status = None, failure_status(exc)
        records.append({"experiment": "toy_autocast", "autocast_dtype": dtype_name(DTYPES[dtype]),
                        "device": str(args.device), "status": status, "dtypes": dtypes,
                        "config": config, "environment": env})
        files.append_record(records[-1])
        progress(f"{dtype_name(DTYPES[dtype])} autocast on {args.device}: {status}")
    return report.publish("toy_autocast", records, files, args.fmt)


if __name__ == "__main__":
    raise SystemExit(main())
