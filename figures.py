"""The study's figures, drawn from an experiment's JSONL records alone: step time by phase, the speed-ups of a
comparison and the warm-up study (bench_e2e), attention time and memory against sequence length
(bench_attention), memory against context length and checkpointing (mem_profile), the running sums of
precision_demo. report.publish draws them for the scripts' --plot and report.py --plot alike.

torch-free; matplotlib is imported where a figure is made (without pyplot: no global state, no display), and a
missing matplotlib is one clear line. A figure that has nothing to draw for some records says so in one line and
draws the rest; a figure that fails (a matplotlib error, a full disk) is one line, and the tables and records of
the run are already written by then. In a merge of several runs, every label names its run.
"""
from __future__ import annotations

import contextlib
import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import e2e_tables
from results import MIB, ResultFiles, finished, is_merged, progress, run_of

Notes = list[str]  # what a figure could not draw, one line each ("2 configurations without a std: ...")


def matplotlib_missing() -> str | None:
    """A one-line message when matplotlib cannot be imported (checked before any work is done)."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return "--plot needs matplotlib, which is not installed: pip install matplotlib"
    return None


def new_figure(ncols: int = 1, nrows: int = 1, width: float = 6.4, height: float = 4.4) -> Any:
    """A matplotlib Figure with its axes, made without pyplot (no global state, no display needed)."""
    try:
        from matplotlib.figure import Figure
    except ImportError:
        raise ImportError("figures need matplotlib: pip install matplotlib") from None
    fig = Figure(figsize=(width * ncols, height * nrows), layout="constrained")
    axes = fig.subplots(nrows, ncols, squeeze=False)
    return fig, list(axes.flat)


def handout_of(record: dict[str, Any]) -> str | None:
    """The handout whose preset table the size names came from, where the record says (older records do not)."""
    for source in (record, record.get("config") or {}, record.get("environment") or {}):
        if isinstance(source, dict) and source.get("handout"):
            return str(source["handout"])
    return None


def figure_title(fig: Any, what: str, records: list[dict[str, Any]]) -> None:
    """`what`, then the device, torch version and handout (when the records say) of the run."""
    env = next((r["environment"] for r in records if isinstance(r.get("environment"), dict)), {})
    parts = ([f"{env.get('device_name', '?')} ({env.get('device', '?')})", f"torch {env.get('torch', '?')}"] if env
             else ["device and torch version not recorded"])
    handout = next((h for h in map(handout_of, records) if h), None)
    if handout:
        parts.append(f"handout {handout}")
    fig.suptitle(what + ("\n" + " | ".join(parts) if parts else ""), fontsize=11)


def number(value: Any) -> bool:
    """A value a figure can draw: a finite int or float (not None, a status string or a bool)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def varying(configs: list[dict[str, Any]], keys: list[str]) -> list[str]:
    """The keys whose value differs between configs: what a label must show to tell them apart."""
    return [k for k in keys if len({json.dumps(c.get(k), default=str) for c in configs}) > 1]


def run_suffix(record: dict[str, Any], records: list[dict[str, Any]]) -> str:
    """" (monday)": a label's run, in a merge."""
    return f" ({run_of(record)})" if is_merged(records) else ""


# ---- bench_e2e ----


def e2e_label(record: dict[str, Any], keys: list[str], axes: list[str]) -> str:
    """A bar's label: the size, then the settings in `keys` (context, warm-up, mode, run) and the varied variant
    axes in e2e_tables' own words (the comparison table's names), so that no two bars read alike."""
    c = {**record["config"], "ctx": record["config"]["model"]["context_length"], "run": run_of(record)}
    parts = [f"{key.replace('warmup', 'warm-up')} {c[key]}" if key in ("ctx", "warmup") else str(c[key])
             for key in keys]
    parts += [e2e_tables.variant_label(record["config"], axes)] if axes else []
    return "\n".join([str(c["size"]), " ".join(parts)]) if parts else str(c["size"])


E2E_LABEL_KEYS = ["ctx", "warmup", "mode", "run"]  # beside e2e_tables.VARIANT_AXES, which label themselves


def plot_e2e_phases(records: list[dict[str, Any]], notes: Notes) -> Any | None:
    """Step time per configuration, stacked by phase (forward, backward, optimizer), std of the step as error
    (a configuration timed over one step has none: its bar has no error bar)."""
    done = [r for r in e2e_tables.measured(records) if finished(r) and number(r.get("step_ms_mean"))]
    if not done:
        return None
    keys = varying([{**r["config"], "ctx": r["config"]["model"]["context_length"], "run": run_of(r)}
                    for r in done], E2E_LABEL_KEYS)
    axes = e2e_tables.varied_axes([r["config"] for r in done])
    fig, (ax,) = new_figure(width=max(6.4, 0.9 * len(done) + 2))
    x = range(len(done))
    bottom = [0.0] * len(done)
    for phase, color in (("forward", "tab:blue"), ("backward", "tab:orange"), ("optimizer", "tab:green")):
        heights = [r.get(f"{phase}_ms_mean") if number(r.get(f"{phase}_ms_mean")) else 0.0 for r in done]
        if any(heights):
            ax.bar(x, heights, bottom=bottom, label=phase, color=color)
            bottom = [b + h for b, h in zip(bottom, heights)]
    with_std = [(i, r["step_ms_mean"], r["step_ms_std"]) for i, r in enumerate(done) if number(r.get("step_ms_std"))]
    if with_std:
        xs, means, stds = zip(*with_std)
        ax.errorbar(xs, means, yerr=[[min(s, m) for m, s in zip(means, stds)], list(stds)], fmt="none",  # no time < 0
                    ecolor="black", capsize=3, label="step mean ± std")
    if len(with_std) < len(done):
        notes.append(f"{len(done) - len(with_std)} of {len(done)} configurations have no step std (one timed step): "
                     "their bars have no error bar")
    ax.set_xticks(list(x), [e2e_label(r, keys, axes) for r in done], fontsize=8)
    ax.set_xlabel("configuration")
    ax.set_ylabel("time per step (ms)")
    ax.legend()
    figure_title(fig, "Step time by phase", done)
    return fig


def speedup(cell: Any) -> float:
    """A comparison cell ("1.93x") as a bar height; a status ("OOM", "not run") has no bar."""
    return float(cell[:-1]) if isinstance(cell, str) and cell.endswith("x") else math.nan


def plot_e2e_speedups(records: list[dict[str, Any]], notes: Notes) -> Any | None:
    """bench_e2e's comparison as bars: each variant's speed-up over the first (forward, forward+backward, step) for
    each (size, context) row (and run, in a merge); a variant that failed has no bar, its status is written
    instead."""
    found_runs = e2e_tables.run_comparisons(e2e_tables.measured(records))
    if not found_runs:
        return None
    bars = [(row, name, run) for found, runs in found_runs for row, run in zip(found.rows, runs)
            for name in found.variants[1:]]
    ratios = list(dict.fromkeys(label for found, _ in found_runs for label in found.ratios))
    baselines = list(dict.fromkeys(found.variants[0] for found, _ in found_runs))
    fig, (ax,) = new_figure(width=max(6.4, 1.2 * len(bars) + 2))
    width = 0.8 / len(ratios)
    for i, label in enumerate(ratios):
        xs = [j + (i - (len(ratios) - 1) / 2) * width for j in range(len(bars))]
        cells = [row.get(f"{label} speed-up: {name}") for row, name, _ in bars]
        ax.bar(xs, [speedup(c) for c in cells], width, label=label)
        for x, cell in zip(xs, cells):
            if isinstance(cell, str) and not cell.endswith("x"):  # OOM, error, not run: said where the bar would be
                ax.annotate(cell, (x, 1.0), rotation=90, ha="center", va="bottom", fontsize=7)
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_xticks(range(len(bars)), [f"{row['size']} ctx {row['ctx']}" + (f" warm-up {row['warmup']}" if "warmup" in row
                                     else "") + f"\n{name}" + (f"\n{run}" if run else "") for row, name, run in bars],
                  fontsize=8)
    ax.set_xlabel("configuration and variant")
    baseline = baselines[0] if len(baselines) == 1 else "each comparison's first variant"
    ax.set_ylabel(f"speed-up over {baseline} (x)")
    ax.legend(title="phases")
    variant_sets = list(dict.fromkeys(tuple(found.variants) for found, _ in found_runs))
    if len(variant_sets) == 1:  # one comparison (of one run, or of several runs alike)
        names = variant_sets[0]
        figure_title(fig, f"Speed-up over {names[0]}: {' vs '.join(names)}", records)
    else:
        figure_title(fig, f"Speed-ups over {baseline}", records)
    return fig


def plot_e2e_warmup(records: list[dict[str, Any]], notes: Notes) -> Any | None:
    """The warm-up study: time of each timed step against its index, one line per warm-up count, one panel per
    configuration (of one run) that was run with several warm-up counts."""
    groups: dict[str, list[dict]] = {}
    for r in e2e_tables.measured(records):
        if (finished(r) and isinstance(r.get("step_ms"), list) and all(map(number, r["step_ms"]))
                and number(r["config"]["warmup"])):
            key = json.dumps([run_of(r), {k: v for k, v in r["config"].items() if k != "warmup"}], sort_keys=True,
                             default=str)
            groups.setdefault(key, []).append(r)
    groups = {k: g for k, g in groups.items() if len({r["config"]["warmup"] for r in g}) > 1}
    if not groups:
        return None
    fig, axes = new_figure(ncols=len(groups))
    varied = e2e_tables.varied_axes([g[0]["config"] for g in groups.values()])  # what tells the panels apart
    for ax, group in zip(axes, groups.values()):
        for r in sorted(group, key=lambda r: r["config"]["warmup"]):
            samples = r["step_ms"]
            ax.plot(range(1, len(samples) + 1), samples, marker="o", label=f"warm-up {r['config']['warmup']}")
        c = group[0]["config"]
        variant = e2e_tables.variant_label(c, varied)
        ax.set_title(f"{c['size']} ctx {c['model']['context_length']} {variant}".strip()
                     + run_suffix(group[0], records), fontsize=9)
        ax.set_yscale("log")
        ax.xaxis.get_major_locator().set_params(integer=True)
        ax.set_xlabel("timed step index")
        ax.set_ylabel("step time (ms, log)")
        ax.legend()
    figure_title(fig, "Warm-up: time of each timed step", records)
    return fig


# ---- bench_attention ----

FAILURE_MARKERS = {"OOM": ("X", "red"), "skipped": ("s", "grey"), "error": ("P", "purple")}


def failure_kind(status: str) -> str:
    return "OOM" if status == "OOM" else "skipped" if str(status).startswith("skipped") else "error"


def plot_attention(records: list[dict[str, Any]], notes: Notes) -> Any | None:
    """Forward time, backward time and memory against sequence length (log-log), one line per d and
    implementation (and dtype and batch size where they vary, and run, in a merge); configurations that ran out
    of memory, were skipped or failed are marked along the top."""
    if not any(finished(r) for r in records):
        return None
    cuda = any("mem_before_backward_bytes" in r for r in records)
    mem_key, mem_label = (("mem_before_backward_bytes", "allocated before backward (MiB)") if cuda
                          else ("saved_tensor_bytes", "saved for backward (MiB)"))
    panels = [("forward_ms_mean", "forward (ms)", 1), ("backward_ms_mean", "backward (ms)", 1),
              (mem_key, mem_label, 1 / MIB)]
    fig, axes = new_figure(ncols=3, width=5.2)

    shown = varying([r["config"] for r in records], ["dtype", "batch_size"])  # fp32 and bf16 lines kept apart

    def line_name(r: dict[str, Any]) -> str:
        c = r["config"]
        extra = "".join(f" {c.get('dtype')}" if key == "dtype" else f" batch {c.get('batch_size')}" for key in shown)
        return f"{c['impl']} d={c['d']}{extra}{run_suffix(r, records)}"

    lines = list(dict.fromkeys(line_name(r) for r in records))
    impls = list(dict.fromkeys(r["config"]["impl"] for r in records))
    ds = sorted({r["config"]["d"] for r in records})
    colors = {d: f"C{i}" for i, d in enumerate(ds)}
    styles = dict(zip(impls, ["-", "--", ":", "-."]))
    for ax, (key, label, scale) in zip(axes, panels):
        missing = [r for r in records if finished(r) and not number(r.get(key))]
        if missing:
            notes.append(f"{label.split(' (')[0]}: {len(missing)} finished configuration(s) have no {key}: not drawn")
        for name in lines:
            rs = [r for r in records if line_name(r) == name and finished(r) and number(r.get(key))]
            points = sorted((r["config"]["seq_len"], r[key] * scale) for r in rs)
            if points:
                c = rs[0]["config"]
                ax.plot(*zip(*points), styles.get(c["impl"], "-"), marker="o", color=colors[c["d"]], label=name)
        failed: dict[str, list[dict]] = {}
        for r in records:
            if not finished(r):
                failed.setdefault(failure_kind(r["status"]), []).append(r)
        for kind, rs in failed.items():  # no value to draw: a marker along the top, named
            marker, color = FAILURE_MARKERS[kind]
            top = ax.get_xaxis_transform()  # x in data, y in axes fraction
            ax.scatter([r["config"]["seq_len"] for r in rs], [0.96] * len(rs), marker=marker, color=color,
                       transform=top, label=kind, zorder=3, clip_on=False)
            for r in rs:
                ax.annotate(line_name(r), (r["config"]["seq_len"], 0.96), xycoords=top, xytext=(0, -10),
                            textcoords="offset points", ha="center", fontsize=6)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("sequence length")
        ax.set_ylabel(label)
        ax.set_title(label.split(" (")[0], fontsize=10)
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="outside right center", fontsize=8)
    figure_title(fig, "Attention: time and memory against sequence length", records)
    return fig


# ---- mem_profile ----


MEMORY_LABEL_KEYS = ["size", "attn", "model_factory", "optimizer", "batch_size"]  # each that varies names its lines


def memory_lines(records: list[dict[str, Any]], x_of: Callable[[dict], Any], label_keys: list[str]) -> list[tuple]:
    """(label, xs, ys MiB, style) lines: the measured peak (CUDA) per mode and dtype, solid; the bytes saved for
    backward (measured on fake tensors, any device; the same for every mode) per dtype, dashed."""
    lines = []
    peaks: dict[str, list] = {}
    saved: dict[str, dict] = {}
    for r in records:
        c = r["config"]
        ident = " ".join(f"ctx {c['model']['context_length']}" if k == "ctx" else f"batch {c[k]}" if k == "batch_size"
                         else str(c[k] or "our model") for k in label_keys)
        ident += run_suffix(r, records)
        if r.get("status") == "ok" and number(r.get("peak_mem_allocated_bytes")):
            peaks.setdefault(f"peak, {c['mode']} {ident}", []).append((x_of(r), r["peak_mem_allocated_bytes"] / MIB))
        if r.get("saved_status") == "ok" and number(r.get("saved_total_bytes")):
            saved.setdefault(f"saved for backward, {ident}", {})[x_of(r)] = r["saved_total_bytes"] / MIB
    for label, points in peaks.items():
        lines.append((label, *zip(*sorted(points)), "-"))
    for label, points in saved.items():
        lines.append((label, *zip(*sorted(points.items())), "--"))
    return lines


def plot_memory_context(records: list[dict[str, Any]], notes: Notes) -> Any | None:
    """Peak memory against context length, forward vs training step and fp32 vs bf16 (CUDA runs), with the
    bytes saved for backward (every run), at the smallest checkpoint setting."""
    ckpt = min(r["config"]["checkpoint_every"] for r in records)
    chosen = [r for r in records if r["config"]["checkpoint_every"] == ckpt]
    if len({r["config"]["model"]["context_length"] for r in chosen}) < 2:
        return None
    keys = ["dtype"] + varying([r["config"] for r in chosen], MEMORY_LABEL_KEYS)
    lines = memory_lines(chosen, lambda r: r["config"]["model"]["context_length"], keys)
    if not lines:
        return None
    fig, (ax,) = new_figure()
    for label, xs, ys, style in lines:
        ax.plot(xs, ys, style, marker="o", label=label)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("context length")
    ax.set_ylabel("memory (MiB)")
    ax.legend(fontsize=8)
    measured = any(style == "-" for *_, style in lines)
    figure_title(fig, "Memory against context length" + ("" if measured else " (no CUDA: saved for backward only)"),
                 chosen)
    return fig


def plot_memory_checkpoint(records: list[dict[str, Any]], notes: Notes) -> Any | None:
    """Peak (CUDA runs), the predicted peak (any device; a star on the smallest over every K when it is among
    those run) and bytes saved for backward against the checkpoint block size K (0 = no checkpointing)."""
    ks = sorted({r["config"]["checkpoint_every"] for r in records})
    if len(ks) < 2:
        return None
    keys = ["dtype"] + varying([r["config"] for r in records], MEMORY_LABEL_KEYS)
    keys += ["ctx"] if len({r["config"]["model"]["context_length"] for r in records}) > 1 else []
    position = {k: i for i, k in enumerate(ks)}  # evenly spaced: K = 0 has no place on a log axis
    lines = memory_lines(records, lambda r: position[r["config"]["checkpoint_every"]], keys)
    if not lines:
        return None
    fig, (ax,) = new_figure()
    for label, xs, ys, style in lines:
        ax.plot(xs, ys, style, marker="o", label=label)
    # the predicted peak (lm_memory.checkpoint_prediction, any device), dotted, its minimum over every K marked
    predicted: dict[str, dict] = {}
    for r in records:
        if r.get("checkpoint_prediction"):
            c = r["config"]
            ident = " ".join(f"ctx {c['model']['context_length']}" if k == "ctx" else str(c[k]) for k in keys)
            predicted.setdefault(f"predicted peak, {c['mode']} {ident}{run_suffix(r, records)}", {})[
                position[c["checkpoint_every"]]] = r["checkpoint_prediction"]
    for label, points in predicted.items():
        best = next(iter(points.values()))
        xs = sorted(points)
        line, = ax.plot(xs, [points[x]["predicted_peak_bytes"] / MIB for x in xs], ":", marker="s",
                        label=f"{label} (smallest at K = {best['best_k']})")
        if best["best_k"] in position:
            ax.plot(position[best["best_k"]], best["best_predicted_peak_bytes"] / MIB, "*", markersize=14,
                    color=line.get_color())
    ax.set_xticks(range(len(ks)), [str(k) if k else "0 (off)" for k in ks])
    ax.set_xlabel("checkpoint every K blocks")
    ax.set_ylabel("memory (MiB)")
    ax.legend(fontsize=8)
    figure_title(fig, "Memory against activation-checkpoint block size", records)
    return fig


# ---- precision_demo ----


def plot_precision(records: list[dict[str, Any]], notes: Notes) -> Any | None:
    """The running sum against the number of additions for each accumulator (log-log), beside n x value, and
    the relative error."""
    cases = [r for r in records if r.get("partial_sums")]
    if not cases:
        return None
    fig, (ax_sum, ax_err) = new_figure(ncols=2, width=5.6)
    values = list(dict.fromkeys(r["value"] for r in cases))
    ns = sorted({n for r in cases for n, _ in r["partial_sums"]})
    for value in values:
        ax_sum.plot(ns, [n * value for n in ns], color="black", linewidth=3, alpha=0.25, label=f"exact: n x {value}")
    for i, r in enumerate(cases):
        value = r["value"]
        addend = r["addend_dtype"] + (" -> float32" if r["addend_converted_to_float32"] else "")
        label = f"case {r['case']}: {r['accumulator_dtype']} += {addend}{run_suffix(r, records)}"
        style = ["-", "--", "-.", ":"][i % 4]  # cases 3 and 4 coincide: the dashes keep both visible
        n, sums = zip(*r["partial_sums"])
        ax_sum.plot(n, sums, style, marker=".", label=label)
        # an exact partial sum (zero error) has no place on a log axis: a gap in the line (nan), not a made-up value
        errors = [abs(s - k * value) / abs(k * value) or math.nan for k, s in zip(n, sums)]
        ax_err.plot(n, errors, style, marker=".", label=label)
    for ax in (ax_sum, ax_err):
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("number of additions")
    ax_sum.set_ylabel("accumulated sum")
    ax_err.set_ylabel("relative error of the sum (gap: exact)")
    ax_sum.legend(fontsize=8)
    figure_title(fig, f"Accumulating {' and '.join(map(str, values))} in low precision", cases)
    return fig


# ---- which figures, drawing and saving them ----

Plot = Callable[[list[dict[str, Any]], Notes], Any]
FIGURES: dict[str, dict[str, Plot]] = {
    "bench_e2e": {"phases": plot_e2e_phases, "speedup": plot_e2e_speedups, "warmup": plot_e2e_warmup},
    "bench_attention": {"attention": plot_attention},
    "mem_profile": {"memory_context": plot_memory_context, "memory_checkpoint": plot_memory_checkpoint},
    "precision_demo": {"sums": plot_precision},
    "toy_autocast": {},  # a table of dtypes: nothing to draw
}
FIGURE_NEEDS = {  # what each experiment's figures need, for --help and for a run with nothing to plot
    "bench_e2e": "the bench_e2e figures need finished configurations (several --warmup values for the warm-up "
                 "figure, several variants for the speed-ups: --dtype fp32 bf16, --compile off on, --attn naive "
                 "sdpa, or such runs merged)",
    "bench_attention": "the bench_attention figure needs at least one finished configuration",
    "mem_profile": "the mem_profile figures need two or more context lengths, or two or more --checkpoint values",
    "precision_demo": "the precision_demo figure needs records with partial sums (precision_demo.py from this "
                      "version on)",
    "toy_autocast": "toy_autocast has no figure: its answer is a table of dtypes",
}


def figures(experiment: str, records: list[dict[str, Any]], notes: Notes | None = None) -> dict[str, Any]:
    """Every figure the records allow, by name (empty when none): matplotlib Figures, not yet saved. What a
    figure leaves out goes to `notes` ("<figure>: <what>")."""
    made = {}
    for name, plot in FIGURES[experiment].items():
        said: Notes = []
        made[name] = plot(records, said)
        if notes is not None:
            notes += [f"{name}: {line}" for line in said]
    return {name: fig for name, fig in made.items() if fig is not None}


def save_png(fig: Any, path: Path) -> None:
    """The figure as a PNG at `path`, written beside it and renamed over it: a failed write (a full disk) or an
    interrupt leaves no partial image."""
    partial = path.with_name(path.name + ".partial")
    try:
        fig.savefig(partial, dpi=120, format="png")
        os.replace(partial, path)
    except BaseException:
        with contextlib.suppress(OSError):
            partial.unlink()
        raise


def plot_what_it_can(plot: Plot, records: list[dict[str, Any]], notes: Notes) -> Any:
    """plot(records); when records it cannot use make it fail (a field of another type, a value missing), the
    figure of the others, with a note saying how many were left out and why. Raises when none can be drawn."""
    try:
        return plot(records, notes)
    except Exception as exc:  # noqa: BLE001 - find the records that break it: each one tried alone
        usable = []
        for record in records:
            try:
                plot([record], [])
            except Exception:  # noqa: BLE001
                continue
            usable.append(record)
        if not usable or len(usable) == len(records):
            raise
        notes.append(f"{len(records) - len(usable)} record(s) it cannot use ({type(exc).__name__}: {exc}): left out")
        return plot(usable, notes)


@dataclass
class Drawn:
    """What write_figures did: the PNGs written, and whether any figure failed or none had anything to draw."""

    paths: list[Path] = field(default_factory=list)
    failed: bool = False
    nothing: bool = False


def write_figures(experiment: str, records: list[dict[str, Any]], files: ResultFiles) -> Drawn:
    """Every figure the records allow, saved as `<stem>_<name>.png` beside the run's files. Each figure on its own:
    what it leaves out is a note, a figure that fails to draw or to save is an error, one line each on stderr,
    and the others are drawn all the same."""
    drawn = Drawn()
    for name, plot in FIGURES[experiment].items():
        notes: Notes = []
        try:
            fig = plot_what_it_can(plot, records, notes)
        except Exception as exc:  # noqa: BLE001 - records a figure cannot use: one line, the other figures go on
            progress(f"error: figure {name} not drawn: {type(exc).__name__}: {exc}")
            drawn.failed = True
            continue
        finally:
            for line in notes:
                progress(f"note: figure {name}: {line}")
        if fig is None:
            continue
        path = files.path(f"_{name}.png")
        try:
            save_png(fig, path)
        except Exception as exc:  # noqa: BLE001 - a full disk, a backend error: the tables are already written
            reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else f"{type(exc).__name__}: {exc}"
            progress(f"error: cannot write {path}: {reason}; the tables and records already written are kept")
            drawn.failed = True
            continue
        drawn.paths.append(path)
    drawn.nothing = not drawn.paths and not drawn.failed
    return drawn
