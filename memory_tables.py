"""mem_profile's report from its JSONL records alone (torch-free; report.py re-renders saved runs with it): the
accounting, what autograd saves for backward, the compiled block, checkpointing, the measured peaks and the
snapshot tables. In a merge of several runs every table gets a `run` column."""
from __future__ import annotations

from typing import Any

from e2e_tables import config_section
from results import DEFAULT_HANDOUT, HANDOUTS, MODES
from results import GIB, MIB, RUN_COLUMN, environment_lines, is_merged, pick_columns, render_table, run_of
from results import with_run_column
from common import OURS

MEMORY_PEAK_COLUMNS = ["size", "ctx", "mode", "dtype", "attn", "ckpt", "model", "optimizer", "peak alloc MiB",
                       "peak alloc GiB", "peak reserved MiB", "peak reserved GiB", "step ms", "status"]


def _model(c: dict[str, Any]) -> str:
    return c.get("model_factory") or OURS


def _ident(rec: dict[str, Any], records: list[dict], keys: list[str]) -> dict[str, Any]:
    """The row's identifying cells: the run (a merge), then `keys` of the config; model only when yours ran."""
    c, cells = rec["config"], {RUN_COLUMN: run_of(rec)} if is_merged(records) else {}
    values = {"size": c["size"], "ctx": c["model"]["context_length"], "mode": c["mode"], "dtype": c["dtype"],
              "attn": c["attn"], "ckpt": c["checkpoint_every"], "heads": c["model"]["num_heads"], "model": _model(c)}
    yours = any(r["config"].get("model_factory") for r in records)
    return {**cells, **{k: values[k] for k in keys if k != "model" or yours}}


def _unique_rows(records: list[dict], keys: list[str]) -> list[tuple[dict, dict]]:
    """(record, identifying cells) once per distinct identity (rows that differ in no printed key are one)."""
    seen: dict[tuple, tuple[dict, dict]] = {}
    for rec in records:
        ident = _ident(rec, records, keys)
        seen.setdefault(tuple(ident.values()), (rec, ident))
    return list(seen.values())


def accounting_table(records: list[dict], fmt: str) -> str:
    rows = []
    for rec, ident in _unique_rows(records, ["size", "ctx", "mode", "dtype", "model"]):
        if "weights_bytes" not in rec:  # your model failed before its parameters were counted
            rows.append({**ident, "status": f"not counted: {rec['saved_status']}"})
            continue
        static = rec["weights_bytes"] + rec["grads_bytes"] + rec["adamw_state_bytes"]
        rows.append({**ident, "weights MiB": rec["weights_bytes"] / MIB, "grads MiB": rec["grads_bytes"] / MIB,
                     "AdamW state MiB": rec["adamw_state_bytes"] / MIB, "static GiB": static / GIB,
                     "residual stream MiB": rec["residual_stream_bytes"] / MIB,
                     "= B x S x d_model x 4 B":
                         f"{rec['residual_stream_formula']} = {rec['residual_stream_bytes']:,} B",
                     "scores/layer MiB": rec["attention_scores_layer_bytes"] / MIB,
                     "= B x H x S x S x bytes": rec["attention_scores_formula"]})
    return render_table(rows, list(dict.fromkeys(k for row in rows for k in row)), fmt)


def saved_tables(records: list[dict], fmt: str) -> str:
    summary, largest = [], []
    for rec, ident in _unique_rows(records, ["size", "ctx", "dtype", "attn", "ckpt", "model"]):
        if rec["saved_status"] != "ok":
            summary.append({**ident, "status": rec["saved_status"]})
            continue
        grads = rec.get("block_grad_bytes")
        summary.append({**ident, "per block MiB": rec["saved_block_bytes_mean"] / MIB,
                        "grads per block MiB": grads / MIB if grads is not None else None,
                        "x blocks": rec["num_blocks"], "blocks MiB": rec["saved_blocks_bytes"] / MIB,
                        "outside blocks MiB": rec["saved_outside_bytes"] / MIB,
                        "total MiB": rec["saved_total_bytes"] / MIB,
                        "status": "ok" if rec["num_blocks"] else "ok (no nn.ModuleList of repeated blocks: all "
                                                                  "counted outside)"})
        for scope, rows in (("per block", rec["saved_block_top"]), ("outside blocks", rec["saved_outside_top"])):
            largest += [{**ident, "scope": scope, "module": r["module"], "op": r["op"], "shape": r["shape"],
                         "tensor dtype": r["dtype"], "tensors": f"{r['tensors']:g}", "MiB": r["bytes"] / MIB,
                         "share": f"{r['share']:.1%}"} for r in rows]
    columns = list(dict.fromkeys(k for row in summary for k in row if k != "status")) + ["status"]
    text = render_table(summary, columns, fmt)
    if largest:
        text += ("\n\nLargest saved tensors, grouped by module, op, shape and dtype (tensors: how many the row "
                 "adds up, per block): the top 5 per block (share of the blocks' total) and the top 3 outside "
                 "(share of the total):\n\n" + render_table(largest, list(largest[0]), fmt))
    return text


def compiled_block_table(records: list[dict], fmt: str) -> str | None:
    """--compile: one block's saved tensors counted as the handout's §3.2 counts them, eager beside compiled."""
    rows = []
    for rec, ident in _unique_rows([r for r in records if "compiled_status" in r],
                                   ["size", "ctx", "dtype", "heads", "model"]):
        row = {**ident, "batch": rec["config"]["batch_size"], "status": rec["compiled_status"]}
        if rec["compiled_status"] == "ok":
            row.update({"eager MiB": rec["block_eager_saved_bytes"] / MIB,
                        "eager tensors": rec["block_eager_saved_tensors"],
                        "compiled MiB": rec["block_compiled_saved_bytes"] / MIB,
                        "compiled tensors": rec["block_compiled_saved_tensors"],
                        "compile + forward s": rec["block_compile_s"]})
        rows.append(row)
    if not rows:
        return None
    columns = list(dict.fromkeys(k for row in rows for k in row if k != "status")) + ["status"]
    return render_table(rows, columns, fmt)


MEMORY_CHECKPOINT_COLUMNS = ["size", "ctx", "mode", "dtype", "attn", "K", "kept MiB", "recomputed MiB", "transient MiB",
                             "state GiB", "predicted GiB", "at", "measured GiB", "measured / predicted"]


def checkpoint_table(records: list[dict], fmt: str) -> str | None:
    """One row per K: the parts of its predicted peak and the moment it falls in, the measured peak (CUDA) beside
    it; then per setting the best K and the nested strategy. None when no configuration checkpoints."""
    predicted = [r for r in records if r.get("checkpoint_prediction")]
    if not any(r["config"]["checkpoint_every"] for r in predicted):
        return None
    rows, notes = [], {}
    for rec in predicted:
        c, p, k = rec["config"], rec["checkpoint_prediction"], rec["config"]["checkpoint_every"]
        ident = _ident(rec, records, ["size", "ctx", "mode", "dtype", "attn"])
        row = {**ident, "K": k, "kept MiB": p["kept_bytes"] / MIB,
               "recomputed MiB": min(k, c["model"]["num_layers"]) * p["block_bytes"] / MIB if k else None,
               "transient MiB": p["transient_bytes"] / MIB, "state GiB": p["state_bytes"] / GIB,
               "predicted GiB": p["predicted_peak_bytes"] / GIB, "at": p["peak_moment"]}
        if rec["status"] == "ok":
            row["measured GiB"] = rec["peak_mem_allocated_bytes"] / GIB
            row["measured / predicted"] = f"{rec['peak_mem_allocated_bytes'] / p['predicted_peak_bytes']:.2f}"
        rows.append(row)
        n, sqrt_k = c["model"]["num_layers"], p["sqrt_k"]
        notes[tuple(ident.values())] = (
            f"{' '.join(map(str, ident.values()))}: N = {n}, a = {p['block_bytes'] / MIB:.2f} MiB per block, "
            f"b = {p['boundary_bytes'] / MIB:.2f} MiB per boundary; single level: K* = sqrt(N b / a) = "
            f"{sqrt_k or 0:.2f}, smallest predicted peak at K = {p['best_k']} "
            f"({p['best_predicted_peak_bytes'] / GIB:.3f} GiB); nested (recursive halving, ceil(log2 N) + 1 = "
            f"{p['nested_kept_bytes'] // p['boundary_bytes']} "
            f"boundaries kept, one block recomputed): {p['nested_predicted_peak_bytes'] / GIB:.3f} GiB")
    columns = with_run_column([c for c in MEMORY_CHECKPOINT_COLUMNS if any(c in row for row in rows)], records)
    return (render_table(rows, columns, fmt, floatfmt=".3f") + "\n\nPredicted peak: the largest of the moments "
            "(at) a step's peak can fall in; kept: what the forward leaves for backward (with K > 0, ceil(N/K) "
            "segment inputs); recomputed: one segment's K blocks. Activations: N a without checkpointing, "
            "ceil(N/K) b + K a single level, (ceil(log2 N) + 1) b + a nested (predicted, not run).\n\n"
            + "\n".join(f"- {note}" for note in notes.values()))


def peak_table(records: list[dict], fmt: str, columns: list[str] | None = None) -> str:
    """The measured peaks; the model and optimizer columns only when yours or several ran."""
    rows = []
    for rec in records:
        c = rec["config"]
        row = {RUN_COLUMN: run_of(rec), "size": c["size"], "ctx": c["model"]["context_length"], "mode": c["mode"],
               "dtype": c["dtype"], "attn": c["attn"], "ckpt": c["checkpoint_every"], "model": _model(c),
               "optimizer": c["optimizer"], "status": rec["status"]}
        if rec["status"] == "ok":
            row.update({"peak alloc MiB": rec["peak_mem_allocated_bytes"] / MIB,
                        "peak alloc GiB": rec["peak_mem_allocated_bytes"] / GIB,
                        "peak reserved MiB": rec["peak_mem_reserved_bytes"] / MIB,
                        "peak reserved GiB": rec["peak_mem_reserved_bytes"] / GIB, "step ms": rec["step_ms_mean"]})
        rows.append(row)
    hidden = {k for k in ("model", "optimizer") if {row[k] for row in rows} == {OURS}}
    default = with_run_column([c for c in MEMORY_PEAK_COLUMNS if c not in hidden], records)
    return render_table(rows, pick_columns(default, columns, fmt), fmt)


def peak_by_context_table(records: list[dict], fmt: str) -> str | None:
    """The memory_profiling answer: one row per size and context, forward beside train, fp32 beside bf16; attn,
    ckpt, model and optimizer get a column only when they vary. None when nothing was measured."""
    if all(rec["status"].startswith("skipped") for rec in records):
        return None
    fields = {"attn": lambda c: c["attn"], "ckpt": lambda c: c["checkpoint_every"], "model": _model,
              "optimizer": lambda c: c["optimizer"]}
    varying = [k for k, value in fields.items() if len({value(r["config"]) for r in records}) > 1]
    dtypes = list(dict.fromkeys(r["config"]["dtype"] for r in records))
    modes = [m for m in MODES if any(r["config"]["mode"] == m for r in records)]
    keys = with_run_column(["size", "ctx"] + varying, records)
    rows: dict[tuple, dict[str, Any]] = {}
    for rec in records:
        c = rec["config"]
        key = ((run_of(rec),) if is_merged(records) else ()) + (c["size"], c["model"]["context_length"],
                                                                *(fields[k](c) for k in varying))
        cell = rec["peak_mem_allocated_bytes"] / GIB if rec["status"] == "ok" else rec["status"]
        rows.setdefault(key, dict(zip(keys, key)))[f"{c['dtype']} {c['mode']} GiB"] = cell
    return render_table(list(rows.values()), keys + [f"{d} {m} GiB" for d in dtypes for m in modes], fmt,
                        floatfmt=".3f")


def snapshot_report(title: str, fields: dict[str, Any], fmt: str) -> str:
    """The peak check, the largest allocations and what was live at the peak, for one snapshot."""
    check = fields["snapshot_peak_check"]
    mib = {k: check[k] / MIB if check.get(k) is not None else None for k in
           ("rebuilt_peak_bytes", "requested_peak_bytes", "diff_bytes", "max_memory_allocated_bytes")}
    check_row = {"check": "peak rebuilt from the trace vs requested_bytes.all.peak",
                 "rebuilt MiB": mib["rebuilt_peak_bytes"], "requested peak MiB": mib["requested_peak_bytes"],
                 "diff MiB": mib["diff_bytes"], "status": check["status"],
                 "max_memory_allocated MiB (rounded blocks)": mib["max_memory_allocated_bytes"]}
    largest = [{"size MiB": r["size_bytes"] / MIB, "count": r["count"], "total MiB": r["total_bytes"] / MIB,
                "first frame in the code studied": r["sites"], "phase": r["phases"]}
               for r in fields["snapshot_largest"]]
    live = [{"live at the peak, by site": r["site"], "count": r["count"], "MiB": r["bytes"] / MIB,
             "share of peak": f"{r['share']:.1%}"} for r in fields["snapshot_live_at_peak"]]
    parts = [f"#### Snapshot: {title}", "", render_table([check_row], list(check_row), fmt), "",
             "Largest allocations in the recorded step:", "",
             render_table(largest, list(largest[0]) if largest else ["size MiB"], fmt), "",
             render_table(live, list(live[0]), fmt)]
    parts += [f"\ntimeline: {fields[k]}" for k in ("snapshot_png", "snapshot_html") if k in fields]
    parts += [f"\n{fields['snapshot_png_note']}"] if "snapshot_png_note" in fields else []
    return "\n".join(parts)


def memory_settings(records: list[dict]) -> dict[str, Any]:
    c = records[0]["config"]
    return {"sizes from": HANDOUTS[c.get("handout", DEFAULT_HANDOUT)].title,
            "model": ", ".join(dict.fromkeys(_model(r["config"]) for r in records)),
            "batch": c["batch_size"], "warmup": c["warmup"], "steps": c["steps"]}


def memory_report(records: list[dict], fmt: str, columns: list[str] | None = None) -> str:
    """Every table of a mem_profile run, from its records alone."""
    parts = [*environment_lines(records, memory_settings), "", config_section(records, fmt), "",
             "### Accounting from the config (MiB and GiB are 2^20 and 2^30 bytes; your --model's own parameters; "
             "AdamW's two moments per parameter whatever the optimizer)", "", accounting_table(records, fmt), "",
             "### Saved for backward (one forward pass and the loss; each storage once; blocks: the repeated "
             "modules of the model's nn.ModuleList; grads per block: one block's parameter gradients)", "",
             saved_tables(records, fmt), ""]
    if compiled := compiled_block_table(records, fmt):
        parts += ["### One block compiled, as the handout's §3.2 counts it (torch.compile(block, fullgraph=True); "
                  "every saved tensor's numel x element size, parameters left out)", "", compiled, ""]
    if checkpointing := checkpoint_table(records, fmt):
        parts += ["### Activation checkpointing: the predicted peak for each K (any device)", "", checkpointing, ""]
    devices = sorted({r["environment"].get("device", "") for r in records})
    if not any(d.startswith("cuda") for d in devices):
        parts.append(f"note: measured peaks and snapshots need a CUDA device, and this run is on {', '.join(devices)}: "
                     "the tables above are the ones that need no GPU.")
        return "\n".join(parts)
    parts += ["### Peak memory (after warm-up, peak counter reset; allocated = tensors, reserved = allocator)",
              "", peak_table(records, fmt, columns)]
    if by_context := peak_by_context_table(records, fmt):
        parts += ["", "### Peak allocated memory per context length (GiB): forward-only beside a training step",
                  "", by_context]
    for rec in records:
        title = rec["label"] + (f" ({run_of(rec)})" if is_merged(records) else "")
        if "snapshot_peak_check" in rec:
            parts += ["", snapshot_report(title, rec, fmt)]
        elif "snapshot_status" in rec:
            parts += ["", f"snapshot of {title}: {rec['snapshot_status']}"]
    return "\n".join(parts)


render_report, PEAK_COLUMNS = memory_report, MEMORY_PEAK_COLUMNS  # report.py's names until integration
