"""mem_profile's report, from its JSONL records alone: the accounting from the config, what autograd saves for
backward, the measured peaks (CUDA) per configuration and per context length, and the snapshot sections.
report.render("mem_profile", ...) is the one caller (report.py's docstring has the layout); mem_profile --analyze
prints snapshot_report. torch-free; in a merge of several runs (results.RUN_KEY on each record) every table gets
a `run` column and each run's rows are kept apart.
"""
from __future__ import annotations

from typing import Any

from e2e_tables import config_section
from model_config import DEFAULT_HANDOUT, HANDOUTS, MODES, ModelConfig
from results import (GIB, MIB, RUN_COLUMN, environment_lines, is_merged, pick_columns, render_table, run_of,
                     with_run_column)
from user_code import OURS  # the model and optimizer of this project, as the records name them

CPU_NOTE = ("note: measured peaks and snapshots need a CUDA device, and this run is on {device}: only the "
            "accounting and the saved-for-backward tables are printed (those are exact on any device); the peak "
            "tables, per configuration and per context length, need a GPU run.")


FP32_BYTES = 4  # gradients are kept in the parameters' dtype: fp32 master weights, also under autocast


def model_name(config: dict[str, Any]) -> str:
    """"ours" or your --model's MODULE:CALLABLE."""
    return config.get("model_factory") or OURS


def yours(records: list[dict]) -> bool:
    """Whether any configuration ran your model (then the tables name the model of every row)."""
    return any(r["config"].get("model_factory") for r in records)


def run_cell(record: dict[str, Any], merged: bool) -> dict[str, Any]:
    """The run column's cell of a row, when the records are a merge."""
    return {RUN_COLUMN: run_of(record)} if merged else {}


def accounting_table(records: list[dict], fmt: str) -> str:
    rows, seen, merged = [], set(), is_merged(records)
    for rec in records:
        c = rec["config"]
        key = (run_of(rec), c["size"], c["model"]["context_length"], c["mode"], c["dtype"], model_name(c))
        if key in seen:
            continue
        seen.add(key)
        static = rec["weights_bytes"] + rec["grads_bytes"] + rec["adamw_state_bytes"]
        rows.append({**run_cell(rec, merged), "size": c["size"], "ctx": key[2], "mode": c["mode"], "dtype": c["dtype"],
                     **({"model": model_name(c)} if yours(records) else {}),
                     "weights MiB": rec["weights_bytes"] / MIB, "grads MiB": rec["grads_bytes"] / MIB,
                     "AdamW state MiB": rec["adamw_state_bytes"] / MIB, "static GiB": static / GIB,
                     "residual stream MiB": rec["residual_stream_bytes"] / MIB,
                     "= B x S x d_model x 4 B":
                         f"{rec['residual_stream_formula']} = {rec['residual_stream_bytes']:,} B",
                     "scores/layer MiB": rec["attention_scores_layer_bytes"] / MIB,
                     "= B x H x S x S x bytes": rec["attention_scores_formula"]})
    return render_table(rows, list(rows[0]), fmt)


def saved_tables(records: list[dict], fmt: str) -> str:
    summary, ops, seen, merged = [], [], set(), is_merged(records)
    for rec in records:
        c = rec["config"]
        key = (run_of(rec), c["size"], c["model"]["context_length"], c["dtype"], c["attn"], c["checkpoint_every"],
               model_name(c))
        if key in seen:
            continue
        seen.add(key)
        ident = {**run_cell(rec, merged), **dict(zip(["size", "ctx", "dtype", "attn", "ckpt", "model"], key[1:]))}
        if rec["saved_status"] != "ok":
            summary.append({**ident, "status": rec["saved_status"]})
            continue
        unsplit = not rec["saved_blocks_bytes"] and c.get("model_factory")  # your blocks are not named layers.N
        grads = ModelConfig(**c["model"]).block_params * FP32_BYTES if not c.get("model_factory") else None
        summary.append({**ident, "per block MiB": rec["saved_block_bytes_mean"] / MIB,
                        "grads per block MiB": grads / MIB if grads is not None else None,
                        "x layers": c["model"]["num_layers"], "blocks MiB": rec["saved_blocks_bytes"] / MIB,
                        "outside blocks MiB": rec["saved_outside_bytes"] / MIB,
                        "total MiB": rec["saved_total_bytes"] / MIB,
                        "status": "ok (no module named layers.N: all counted outside)" if unsplit else "ok"})
        for scope, rows in (("per block", rec["saved_block_top"]), ("outside blocks", rec["saved_outside_top"])):
            for row in rows:
                ops.append({**ident, "scope": scope, "module": row["module"], "op": row["op"],
                            "shape": row["shape"], "tensor dtype": row["dtype"], "MiB": row["bytes"] / MIB,
                            "share": f"{row['share']:.1%}"})
    columns = ["size", "ctx", "dtype", "attn", "ckpt"] + (["model"] if yours(records) else [])
    columns = with_run_column(columns + ["per block MiB", "grads per block MiB", "x layers", "blocks MiB",
                                         "outside blocks MiB", "total MiB", "status"], records)
    text = render_table(summary, columns, fmt)
    if ops:
        text += ("\n\nLargest saved tensors: the top 5 per block (MiB per block, share of the blocks' total) and "
                 "the top 3 outside the blocks (share of the total):\n\n" + render_table(ops, list(ops[0]), fmt))
    return text


PEAK_COLUMNS = ["size", "ctx", "mode", "dtype", "attn", "ckpt", "model", "optimizer", "peak alloc MiB",
                "peak alloc GiB", "peak reserved MiB", "peak reserved GiB", "step ms", "status"]


def peak_rows(records: list[dict]) -> list[dict[str, Any]]:
    """One row of the peak-memory table per configuration."""
    rows = []
    for rec in records:
        c = rec["config"]
        row = {RUN_COLUMN: run_of(rec), "size": c["size"], "ctx": c["model"]["context_length"], "mode": c["mode"],
               "dtype": c["dtype"], "attn": c["attn"], "ckpt": c["checkpoint_every"], "model": model_name(c),
               "optimizer": c.get("optimizer", OURS), "status": rec["status"]}
        if rec["status"] == "ok":
            row.update({"peak alloc MiB": rec["peak_mem_allocated_bytes"] / MIB,
                        "peak alloc GiB": rec["peak_mem_allocated_bytes"] / GIB,
                        "peak reserved MiB": rec["peak_mem_reserved_bytes"] / MIB,
                        "peak reserved GiB": rec["peak_mem_reserved_bytes"] / GIB,
                        "step ms": rec["step_ms_mean"]})
        rows.append(row)
    return rows


def peak_table(records: list[dict], fmt: str, columns: list[str] | None = None) -> str:
    """The peak-memory table; the model and optimizer columns only when the run had yours or several."""
    configs = [r["config"] for r in records]
    hidden = {name for name, key in (("model", model_name), ("optimizer", lambda c: c.get("optimizer", OURS)))
              if {key(c) for c in configs} == {OURS}}
    default = [c for c in PEAK_COLUMNS if c not in hidden]
    return render_table(peak_rows(records), pick_columns(with_run_column(default, records), columns, fmt), fmt)


def peak_by_context_table(records: list[dict], fmt: str) -> str | None:
    """The memory_profiling answer as the study asks for it: one row per size and context length, the peak of
    each mode side by side (forward, then a training step), for each dtype (fp32 beside bf16). attn, ckpt, model
    and optimizer get a column only when they vary. A failed configuration shows its status in its cell. None when no
    configuration was measured (a CPU run: there are no measured peaks to show). A merge has a row per run."""
    if all(rec["status"].startswith("skipped") for rec in records):
        return None
    configs = [rec["config"] for rec in records]
    fields = {"attn": lambda c: c["attn"], "ckpt": lambda c: c["checkpoint_every"], "model": model_name,
              "optimizer": lambda c: c.get("optimizer", OURS)}  # (older records have no optimizer)
    varying = [name for name, value in fields.items() if len({value(c) for c in configs}) > 1]
    dtypes = list(dict.fromkeys(c["dtype"] for c in configs))
    modes = [m for m in MODES if any(c["mode"] == m for c in configs)]
    keys = with_run_column(["size", "ctx"] + varying, records)
    columns = keys + [f"{dtype} {mode} GiB" for dtype in dtypes for mode in modes]
    rows: dict[tuple, dict[str, Any]] = {}
    for rec, c in zip(records, configs):
        key = ((run_of(rec),) if is_merged(records) else ()) + (c["size"], c["model"]["context_length"],
                                                                *(fields[k](c) for k in varying))
        row = rows.setdefault(key, dict(zip(keys, key)))
        ok = rec["status"] == "ok"
        row[f"{c['dtype']} {c['mode']} GiB"] = rec["peak_mem_allocated_bytes"] / GIB if ok else rec["status"]
    return render_table(list(rows.values()), columns, fmt, floatfmt=".3f")


CHECKPOINT_COLUMNS = ["size", "ctx", "mode", "dtype", "attn", "K", "kept MiB", "recomputed MiB", "transient MiB",
                      "state GiB", "predicted GiB", "at", "measured GiB", "measured / predicted"]


def checkpoint_table(records: list[dict], fmt: str) -> str | None:
    """Activation checkpointing, one row per configuration: the parts of its predicted peak (checkpoint_prediction:
    what the forward kept for backward, one recomputed segment, the largest transient, the model state), the
    predicted peak and the moment it falls in, beside the measured peak where there is one (CUDA); then the K that
    minimises the prediction. None when no configuration checkpoints or none was predicted."""
    predicted = [r for r in records if r.get("checkpoint_prediction")]
    if not any(r["config"]["checkpoint_every"] for r in predicted):
        return None
    rows, merged = [], is_merged(records)
    for rec in predicted:
        c, p = rec["config"], rec["checkpoint_prediction"]
        k = c["checkpoint_every"]
        row = {**run_cell(rec, merged), "size": c["size"], "ctx": c["model"]["context_length"], "mode": c["mode"],
               "dtype": c["dtype"],
               "attn": c["attn"], "K": k, "kept MiB": p["kept_bytes"] / MIB,
               "recomputed MiB": min(k, c["model"]["num_layers"]) * p["block_bytes"] / MIB if k else None,
               "transient MiB": p["transient_bytes"] / MIB, "state GiB": p["state_bytes"] / GIB,
               "predicted GiB": p["predicted_peak_bytes"] / GIB, "at": p["peak_moment"]}
        if rec["status"] == "ok" and rec.get("peak_mem_allocated_bytes"):
            row["measured GiB"] = rec["peak_mem_allocated_bytes"] / GIB
            row["measured / predicted"] = f"{rec['peak_mem_allocated_bytes'] / p['predicted_peak_bytes']:.2f}"
        rows.append(row)
    columns = with_run_column([c for c in CHECKPOINT_COLUMNS if c not in ("measured GiB", "measured / predicted")
                               or any(c in row for row in rows)], records)
    best = {(run_of(r), r["config"]["size"], r["config"]["model"]["context_length"], r["config"]["mode"],
             r["config"]["dtype"], r["config"]["attn"]): r["checkpoint_prediction"] for r in predicted}
    minima = "; ".join(f"{f'{run}: ' if merged else ''}{size} ctx {ctx} {mode} {dtype} {attn}: K = {p['best_k']} "
                       f"({p['best_predicted_peak_bytes'] / GIB:.3f} GiB)"
                       for (run, size, ctx, mode, dtype, attn), p in best.items())
    return (render_table(rows, columns, fmt, floatfmt=".3f") + "\n\nPredicted peak: the largest of the moments a "
            "step's peak can fall in (at): backward starts (model state without gradients + what the forward kept + "
            "what the rest of the model keeps + the largest transient), the first segment's backward with K > 0 (the "
            "state + the gradients already made + the ceil(N/K) segment inputs + its K blocks recomputed), backward "
            "ends (state + gradients), the optimizer step (+ one parameter-sized temporary). kept: what the blocks "
            "keep for backward (with K > 0, one residual-stream tensor per segment); recomputed: one segment's K "
            f"blocks. Smallest predicted peak over K = 0..N: {minima}.")


def snapshot_report(title: str, fields: dict[str, Any], fmt: str) -> str:
    """The peak check row, the largest allocations and what was live at the peak, for one snapshot."""
    check = fields["snapshot_peak_check"]

    def mib(key: str) -> float | None:
        return check[key] / MIB if check.get(key) is not None else None

    check_row = {"check": "peak rebuilt from the trace vs requested_bytes.all.peak",
                 "rebuilt MiB": mib("rebuilt_peak_bytes"), "requested peak MiB": mib("requested_peak_bytes"),
                 "diff MiB": mib("diff_bytes"), "status": check["status"],
                 "max_memory_allocated MiB (rounded blocks)": mib("max_memory_allocated_bytes")}
    largest = [{"size MiB": r["size_bytes"] / MIB, "count": r["count"], "total MiB": r["total_bytes"] / MIB,
                "first frame in this project's code": r["sites"], "phase": r["phases"]}
               for r in fields["snapshot_largest"]]
    live = [{"live at the peak, by site": r["site"], "count": r["count"], "MiB": r["bytes"] / MIB,
             "share of peak": f"{r['share']:.1%}"} for r in fields["snapshot_live_at_peak"]]
    parts = [f"#### Snapshot: {title}", "", render_table([check_row], list(check_row), fmt), "",
             "Largest allocations in the recorded step:", "",
             render_table(largest, list(largest[0]) if largest else ["size MiB"], fmt), "",
             render_table(live, list(live[0]), fmt)]
    if "snapshot_png" in fields:
        parts += ["", f"timeline: {fields['snapshot_png']}"]
    else:
        parts += ["", f"no timeline image: {fields['snapshot_png_note']}"]
    return "\n".join(parts)


def run_settings(records: list[dict]) -> dict[str, Any]:
    config0 = records[0]["config"]
    return {"sizes from": HANDOUTS[config0.get("handout", DEFAULT_HANDOUT)].title,
            "model": ", ".join(dict.fromkeys(model_name(r["config"]) for r in records)),
            "batch": config0["batch_size"], "warmup": config0["warmup"], "steps": config0["steps"]}


def render_report(records: list[dict], fmt: str, columns: list[str] | None = None) -> str:
    """The accounting, saved-for-backward, peak (with `columns`: results.pick_columns) and snapshot tables from the
    JSONL records alone."""
    merged = is_merged(records)
    parts = [*environment_lines(records, run_settings), "", config_section(records, fmt), "",
             "### Accounting from the config (MiB and GiB are 2^20 and 2^30 bytes; your --model's parameters as "
             "counted on it, AdamW's two moments per parameter whatever the optimizer)", "",
             accounting_table(records, fmt), "",
             "### Saved for backward (autograd's residuals for one forward pass and the loss; each storage once; "
             "grads per block: the parameter gradients one TransformerBlock holds after backward, fp32)",
             "", saved_tables(records, fmt), ""]
    checkpointing = checkpoint_table(records, fmt)
    if checkpointing:
        parts += ["### Activation checkpointing: the predicted peak for each K (any device)", "", checkpointing, ""]
    devices = {r["environment"].get("device", "") for r in records}
    if not any(d.startswith("cuda") for d in devices):
        parts.append(CPU_NOTE.format(device=", ".join(sorted(devices))))
        return "\n".join(parts)
    parts += ["### Peak memory (after warm-up, peak counter reset; allocated = tensors, reserved = allocator)",
              "", peak_table(records, fmt, columns)]
    by_context = peak_by_context_table(records, fmt)
    if by_context is not None:
        parts += ["", "### Peak allocated memory per context length (GiB = 2^30 bytes): forward-only beside a "
                      "training step", "", by_context]
    for rec in records:
        title = rec["label"] + (f" ({run_of(rec)})" if merged else "")
        if "snapshot_peak_check" in rec:
            parts += ["", snapshot_report(title, rec, fmt)]
        elif "snapshot_status" in rec:
            parts += ["", f"snapshot of {title}: {rec['snapshot_status']}"]
    return "\n".join(parts)
