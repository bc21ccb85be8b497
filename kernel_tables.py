"""Kernel-level profile tables, from an Nsight Systems report or a torch.profiler trace: anyone's, not only ours.

Answers the study's profiling questions: where does the time of a step go, kernel by kernel; which kernels
dominate the forward pass and how many times they run per step; how the share of matrix multiplication changes
from inference to a training step; how softmax compares with the attention matmuls for its FLOPs.

    bash nsys_run.sh medium 256                                   # profiles with nsys, then makes these tables
    python3 kernel_tables.py results/nsys/medium_ctx256_train.nsys-rep --e2e-jsonl results/nsys/medium_ctx256_train_e2e.jsonl
    python3 kernel_tables.py result.sqlite --csv-dir /tmp/x        # anyone's report or export: nsys stats runs here
    python3 kernel_tables.py result.nsys-rep --ranges forward="Model Forward" --stopwatch forward=66.5
    python3 bench_e2e.py --size tiny --profile                     # torch.profiler instead, tables printed
    python3 kernel_tables.py results/profile/tiny_ctx128_train_fp32-20250101-120000.json   # re-read a saved trace
    python3 kernel_tables.py --summary results/nsys/*_ctx*.nsys-rep   # one table across several nsys reports

A .nsys-rep or .sqlite is exported with the nsys at hand ($NSYS, else nsys on PATH): `nsys stats` writes its CSVs
beside the report (or in --csv-dir), a fresh export each time (without nsys, the CSVs exported earlier are read);
a report newer than that nsys is one line saying which version to install. The four tables (profile_tables.py):
phase times against a stopwatch, top kernels, category shares, inside attention. Phases come from the profile's own
range names in their usual spellings (Forward, fwd, optimizer step, train step, ...; warm-up ranges left out) or
from --ranges. With --summary
(nsys_run.sh runs it after several configurations), one row per size, context and variant across nsys_run.sh's
reports, forward-only and training runs side by side: the forward pass (Nsight range vs stopwatch, its top kernel
and calls per forward pass), the matmul share of the forward pass vs the training step, softmax vs the attention
matmuls in time and in FLOPs. Reads records and traces without torch.
"""
from __future__ import annotations

import argparse
import os
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import cli
import nsys_tool
import results
from profile_readers import (NSYS_REPORT_SUFFIXES, NSYS_TRACE_REPORTS, Profile, ProfileFormatError, load_nsys,
                             load_torch_trace, nsys_kernel_total_check, nsys_prefix, nsys_report_path)
from profile_tables import (PHASES, RANGE_KEYS, STEP, attention_shape, build_tables, render_tables, short_name,
                            softmax_matmul_ratios, stopwatch_ms)
from results import FINISHED

STOPWATCH_KEYS = (*PHASES, STEP)


# ---- an nsys report: its CSVs, exported here when the report is given ----


def is_trace(source: str | Path) -> bool:
    """A torch.profiler Chrome trace, as opposed to an nsys report."""
    return str(source).endswith((".json", ".json.gz"))


def csv_prefix(source: str | Path, csv_dir: str | Path | None = None) -> Path:
    """Where a report's CSVs are (or go): beside X.nsys-rep / X.sqlite as X_<report>.csv, or in csv_dir; a
    prefix given as such is itself."""
    prefix = nsys_prefix(source)
    if csv_dir is not None and Path(source).suffix in NSYS_REPORT_SUFFIXES:
        return Path(csv_dir) / prefix.name
    return prefix


def exported(prefix: str | Path) -> bool:
    return nsys_report_path(prefix, NSYS_TRACE_REPORTS[0]).exists()


def export_report(report: Path, prefix: Path) -> str | None:
    """`nsys stats` on a .nsys-rep / .sqlite into the CSVs at `prefix` (nsys_tool.export_csvs), its notes said
    on stderr. Returns a note for the tables when the report came from another nsys version than the one that
    read it. Without an nsys, CSVs exported earlier are read, and said so; NsysError when there are none."""
    found, why = nsys_tool.find_nsys()
    if found is None:
        if exported(prefix):
            results.progress(f"note: {why}: reading the CSVs exported earlier ({prefix}_*.csv)")
            return None
        raise nsys_tool.NsysError(f"{report} needs nsys stats to be read, and {why}: {nsys_tool.install_hint()}", 2)
    nsys = nsys_tool.Nsys.probe(found)
    nsys.check_reports()
    prefix.parent.mkdir(parents=True, exist_ok=True)
    for note in nsys_tool.export_csvs(nsys, report, prefix, f"{prefix}.stats.log"):
        results.progress(f"note: {note}")
    written_by = nsys_tool.report_version(report)
    if written_by and nsys.version and written_by[:3] != nsys.version[:3]:
        return (f"{report.name} comes from Nsight Systems {nsys_tool.version_text(written_by)}; its CSVs were "
                f"written by nsys stats {nsys_tool.version_text(nsys.version)}")
    return None


# ---- one table across several reports (nsys_run.sh with several configurations) ----

# How nsys_run.sh names a report (nsys_sweep.Sweep builds the names):
# <size>_ctx<context>_<mode>[_<dtype>][_pytorch][_cudamem][_h2025]
REPORT_NAME = re.compile(r"(?P<size>.+?)_ctx(?P<context>[0-9]+)_(?P<mode>forward-backward|forward|train)"
                         r"(?:_(?P<variant>.+))?")


@dataclass
class ReportSummary:
    """One configuration of the summary: what its report's name says, and its tables or why it has none."""

    prefix: Path
    size: str
    context: int
    mode: str
    variant: str  # the name's suffix after the mode: dtype, nsys pass-through flags, handout ("" for none)
    status: str
    tables: dict[str, Any] | None = None
    record: dict[str, Any] | None = None


def parse_report_name(prefix: str | Path) -> tuple[str, int, str, str]:
    """(size, context, mode, variant) from a report name nsys_run.sh wrote; ProfileFormatError otherwise."""
    match = REPORT_NAME.fullmatch(Path(prefix).name)
    if not match:
        raise ProfileFormatError(f"{prefix}: not a report name that nsys_run.sh writes "
                                 "(<size>_ctx<context>_<mode>[_<variant>])")
    return match["size"], int(match["context"]), match["mode"], match["variant"] or ""


def load_report_summary(prefix: str | Path, status: str | None = None) -> ReportSummary:
    """A report's tables (from its CSVs and its <report>_e2e.jsonl), or, when it has none, why: `status` as given
    (nsys_run.sh: skipped after an OOM, kept, failed), the profiled run's own status (OOM before or during the
    measured steps), or what is missing."""
    size, context, mode, variant = parse_report_name(prefix)
    entry = ReportSummary(Path(prefix), size, context, mode, variant, status or "")
    if status:
        return entry
    jsonl = Path(f"{prefix}_e2e.jsonl")
    try:
        record = last_e2e_record(jsonl) if jsonl.exists() else None
        if record is not None and record.get("status") not in FINISHED:
            entry.status = str(record.get("status"))
            return entry
        if not exported(prefix):
            if not Path(f"{prefix}.nsys-rep").exists():
                entry.status = "no report"
                return entry
            export_report(Path(f"{prefix}.nsys-rep"), Path(prefix))
        config = (record or {}).get("config") or {}
        entry.tables = build_tables(load_nsys(prefix), stopwatch_ms(record) if record else None,
                                    attention_shape(config), top=1, compiled=bool(config.get("compile")))
        entry.record = record
        entry.status = record["status"] if record else "ok (no _e2e.jsonl: no stopwatch)"
    except (ProfileFormatError, nsys_tool.NsysError) as exc:
        entry.status = f"error: {exc}"
    except (KeyError, TypeError, ValueError, AttributeError) as exc:  # a record or CSV of another shape
        entry.status = f"error: {prefix}: malformed: {type(exc).__name__}: {exc}"
    return entry


def _first_kernel(rows: list[dict[str, Any]] | None) -> dict[str, Any] | None:
    return rows[0] if rows and not rows[0]["name"].startswith("(") else None


def summary_rows(entries: list[ReportSummary]) -> tuple[list[dict[str, Any]], list[str]]:
    """One row per (size, context, variant), its modes side by side: the forward pass (Nsight range vs
    stopwatch, top kernel and its calls per forward pass, matmul share, softmax vs the attention matmuls) from
    the forward-only run, the matmul share of the whole step from the training run, the top kernel of forward +
    backward from the training (else forward-backward) run. Rows keep the order of the entries. Also the notes
    the table needs."""
    groups: dict[tuple[str, int, str], dict[str, ReportSummary]] = {}
    for entry in entries:
        groups.setdefault((entry.size, entry.context, entry.variant), {})[entry.mode] = entry
    rows, borrowed = [], False
    for (size, context, variant), runs in groups.items():
        done = {mode: entry for mode, entry in runs.items() if entry.tables is not None}
        row: dict[str, Any] = {"size": size, "context_length": context, "variant": variant,
                               "runs": {mode: entry.status for mode, entry in runs.items()},
                               "reports": {mode: str(entry.prefix) for mode, entry in runs.items()}}
        forward = next((done[m] for m in ("forward", "forward-backward", "train") if m in done), None)
        if forward is not None:
            tables = forward.tables
            borrowed |= forward.mode != "forward"
            row["forward_from"] = forward.mode
            phase = next((r for r in tables["phases"] if r["phase"] == "forward"), {})
            row["forward_nsight_ms"], row["forward_stopwatch_ms"] = phase.get("range_ms"), phase.get("stopwatch_ms")
            # a forward-only run whose forward range holds all the work has only the "all" table
            top = _first_kernel(tables["top"].get("forward") or tables["top"].get("all"))
            if top:
                row["top_forward_kernel"] = top["name"]
                row["top_forward_kernel_calls_per_forward"] = top["per_step"]
            share = next((c for c in tables["categories"] if c["scope"] == "forward"), None)
            row["matmul_pct_forward"] = share["matrix multiply"] if share else None
            ratios = softmax_matmul_ratios(tables["attention"])
            if ratios:
                row["softmax_matmul_time_ratio"], row["softmax_matmul_flop_ratio"] = ratios
        if "train" in done:
            share = next((c for c in done["train"].tables["categories"] if c["scope"] == "all"), None)
            row["matmul_pct_train_step"] = share["matrix multiply"] if share else None
        backward = done.get("train") or done.get("forward-backward")
        top = _first_kernel(backward.tables.get("top_forward_backward")) if backward else None
        if top:
            row["top_forward_backward_kernel"] = top["name"]
        rows.append(row)
    notes = []
    if borrowed:
        notes.append("rows without a forward-only report take the forward columns from the forward phase of "
                     "their training (or forward-backward) run: `forward_from` in the records")
    finished = [entry for entry in entries if entry.tables is not None]
    if finished and not any(entry.tables["top"] for entry in finished):
        notes.append("no CUDA kernel data in these reports (nsys recorded no GPU work, as on a machine without a "
                     "GPU): the kernel, matmul and softmax columns are empty")
    if any(entry.tables is not None and entry.tables["device"] == "gpu" and entry.tables["top"] for entry in entries):
        notes.append("kernel names are shortened; each report's <report>.md has them in full, the JSONL here too")
    return rows, notes


def render_summary(rows: list[dict[str, Any]], notes: list[str], fmt: str = "github") -> str:
    """The summary table: forward pass (nsys_profile (a)-(c), (e)) and matmul shares (d) side by side."""
    shown = [{**row, "top_forward_kernel": short_name(row.get("top_forward_kernel") or "", 48) or None,
              "top_forward_backward_kernel": short_name(row.get("top_forward_backward_kernel") or "", 48) or None,
              "runs": ", ".join(f"{mode} {status}" for mode, status in row["runs"].items())} for row in rows]
    spec = [("size", "size", ""), ("context_length", "ctx", "")]
    if any(row["variant"] for row in rows):
        spec.append(("variant", "variant", ""))
    spec += [("forward_nsight_ms", "fwd ms Nsight", ".2f"), ("forward_stopwatch_ms", "fwd ms stopwatch", ".2f"),
             ("top_forward_kernel", "top forward kernel", ""),
             ("top_forward_kernel_calls_per_forward", "calls/fwd", ".1f"),
             ("top_forward_backward_kernel", "top fwd+bwd kernel", ""),
             ("matmul_pct_forward", "matmul % fwd-only", ".1f"),
             ("matmul_pct_train_step", "matmul % train step", ".1f"),
             ("softmax_matmul_time_ratio", "softmax/matmul time", ".3g"),
             ("softmax_matmul_flop_ratio", "softmax/matmul FLOPs", ".3g"), ("runs", "runs", "")]
    table = results.render_table([{header: row.get(key) for key, header, _ in spec} for row in shown],
                                 [header for _, header, _ in spec], fmt, [f or "g" for _, _, f in spec])
    out = ["### nsys_run.sh summary: the forward pass, and the matmul share of inference vs a training step", "",
           table]
    if notes:
        out += [""] + [f"- {note}" for note in notes]
    return "\n".join(out)


def summary_main(args: argparse.Namespace) -> int:
    """--summary: the table across the given reports, printed and written to results/nsys/summary-<time>."""
    statuses = {}
    for given in args.status or []:
        source = next(s for s in args.source if given.startswith(s + "="))  # parse_args checked there is one
        statuses[source] = given[len(source) + 1:]
    write_summary(args.source, statuses, args.results_dir, args.out, args.fmt)
    return 0


def write_summary(prefixes: list[str], statuses: dict[str, str], results_dir: str, out: str | None = None,
                  fmt: str = "github") -> None:
    """The summary of nsys_run.sh's reports (their prefixes; `statuses`: why some have no report), printed and
    saved as <results_dir>/nsys/<out or summary-<time>>.{md,jsonl}. nsys_sweep.py calls it after its loop."""
    entries = [load_report_summary(nsys_prefix(prefix), statuses.get(prefix)) for prefix in prefixes]
    rows, notes = summary_rows(entries)
    env = next((e.record["environment"] for e in entries if e.record and e.record.get("environment")), None)
    header = results.environment_header(env, reports=len(entries)) if env else f"reports: {len(entries)}"
    files = results.ResultFiles(results_dir, "nsys", out, "summary")
    for row in rows:
        files.append_record(row)
    files.publish(lambda chosen: header + "\n\n" + render_summary(rows, notes, chosen), fmt)



# ---- command line ----


def last_e2e_record(path: str | Path) -> dict[str, Any]:
    """The record of the profiled configuration in a bench_e2e JSONL file (the last one)."""
    try:
        records = results.read_records(path)
    except (OSError, ValueError) as exc:  # a folder, unreadable, not UTF-8, not JSON lines
        raise ProfileFormatError(f"{path}: not a bench_e2e JSONL file: {exc}") from None
    if not records:
        raise ProfileFormatError(f"{path}: no records")
    if not isinstance(records[-1], dict):
        raise ProfileFormatError(f"{path}: its last line is not a JSON object")
    return records[-1]


def key_values(items: list[str], keys: tuple[str, ...], flag: str, what: str, split_commas: bool = False
               ) -> dict[str, str]:
    """--ranges forward=NAME ... / --stopwatch forward=MS,...: KEY=VALUE pairs, KEY one of `keys`, each once."""
    pairs: dict[str, str] = {}
    for item in (part for given in items for part in (given.split(",") if split_commas else [given])):
        key, sep, value = item.partition("=")
        if not sep or key not in keys or not value:
            raise argparse.ArgumentTypeError(f"{flag}: give KEY={what} with KEY one of {', '.join(keys)}, got "
                                             f"{item!r}")
        if key in pairs:
            raise argparse.ArgumentTypeError(f"{flag}: {key} given twice")
        pairs[key] = value
    return pairs


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = cli.ArgParser(description=__doc__.split("\n\n")[0])
    p.add_argument("source", nargs="+",
                   help="a torch.profiler trace (.json, .json.gz) or an nsys report: X.nsys-rep or X.sqlite (nsys "
                        "stats runs here, writing X_<report>.csv beside it), or the prefix X of CSVs exported "
                        "before; with --summary, several nsys_run.sh reports")
    p.add_argument("--summary", action="store_true",
                   help="one table across several nsys_run.sh reports (one row per size, context and variant, "
                        "forward-only and training runs side by side), written to <results-dir>/nsys/summary-<time>"
                        ".{md,jsonl}; each report's stopwatch comes from its own <report>_e2e.jsonl")
    p.add_argument("--status", action="append", metavar="REPORT=TEXT",
                   help="--summary: REPORT was not profiled, for this reason (nsys_run.sh: skipped after an OOM, "
                        "kept, failed); its row says so")
    p.add_argument("--out", default=None, type=results.result_stem,
                   help="--summary: result file stem (default: summary-<UTC timestamp>); never overwritten")
    p.add_argument("--results-dir", default="results", type=results.results_folder,
                   help="--summary: root folder for the result files (they go to its nsys/ folder)")
    p.add_argument("--e2e-jsonl", default=None,
                   help="bench_e2e's JSONL record of the profiled run: stopwatch times for table 1, model shape "
                        "for the FLOPs of table 4, environment for the header")
    p.add_argument("--stopwatch", nargs="+", default=None, metavar="PHASE=MS",
                   help="your own timings of the profiled run for table 1, in ms per step, e.g. forward=66.5 "
                        f"backward=80 or forward=66.5,backward=80 (PHASE: {', '.join(STOPWATCH_KEYS)}); instead of "
                        "--e2e-jsonl")
    p.add_argument("--ranges", nargs="+", default=None, metavar="KEY=NAME",
                   help="the names of your own ranges where they are not a usual spelling (forward, Forward, fwd, "
                        f"optimizer step, train step, ...), e.g. forward='Model Forward' (KEY: {', '.join(RANGE_KEYS)}"
                        "; measure: the range around your timed steps)")
    p.add_argument("--csv-dir", default=None,
                   help="where nsys stats writes the export and the CSVs of a .nsys-rep or .sqlite (default: "
                        "beside it; give one when that folder is not writable)")
    p.add_argument("--top", type=cli.positive_int, default=10, help="kernels per top-kernels table")
    p.add_argument("--fmt", default="github", choices=results.TABLE_FORMATS, metavar="FMT",
                   help="tabulate table format: github (markdown, default), latex_booktabs, plain, ...")
    p.add_argument("--md", default=None,
                   help="also write the tables to this file, replacing it (nsys_run.sh: beside the report)")
    args = p.parse_args(argv)
    if args.summary:
        return check_summary_args(p, args)
    if args.status or args.out is not None:
        p.error("--status and --out go with --summary")
    if len(args.source) != 1:
        p.error(f"one report or trace at a time ({len(args.source)} given); --summary tabulates several")
    args.source = args.source[0]
    try:
        args.stopwatch = {k: float(v) for k, v in key_values(args.stopwatch or [], STOPWATCH_KEYS, "--stopwatch",
                                                             "MS", split_commas=True).items()}
        args.ranges = key_values(args.ranges or [], RANGE_KEYS, "--ranges", "NAME")
    except argparse.ArgumentTypeError as exc:
        p.error(str(exc))
    except ValueError as exc:  # float() of a time that is no number
        p.error(f"--stopwatch: times are milliseconds: {exc}")
    if any(not 0 < ms < float("inf") for ms in args.stopwatch.values()):
        p.error("--stopwatch: times must be positive finite milliseconds")
    if args.stopwatch and args.e2e_jsonl:
        p.error("give --e2e-jsonl (bench_e2e's record) or --stopwatch (your own times), not both")
    check_source(p, args)
    if args.e2e_jsonl and not Path(args.e2e_jsonl).exists():
        p.error(f"no such file: {args.e2e_jsonl}")
    if args.md is not None:
        md = Path(args.md)
        if not args.md or md.is_dir() or args.md.endswith("/"):
            p.error(f"--md must name a file, and {args.md!r} is a folder")
        if not md.parent.is_dir():
            p.error(f"--md: no such folder: {md.parent}")
    return args


def check_source(p: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """A trace must exist; an nsys report must exist (to be exported here) or have CSVs exported before."""
    source = Path(args.source)
    if args.csv_dir is not None and Path(args.csv_dir).exists() and not Path(args.csv_dir).is_dir():
        p.error(f"--csv-dir: {args.csv_dir} is not a folder")
    if is_trace(source):
        if not source.is_file():
            p.error(f"no such trace: {source}")
        return
    prefix = csv_prefix(source, args.csv_dir)
    if source.suffix in NSYS_REPORT_SUFFIXES and source.is_file():
        folder = prefix.parent
        while not folder.exists():  # --csv-dir is created when missing: its first existing parent must be writable
            folder = folder.parent
        if not exported(prefix) and not os.access(folder, os.W_OK):
            p.error(f"cannot write the CSVs of {source} in {prefix.parent} (not writable): give --csv-dir DIR")
        return
    if not exported(prefix):
        p.error(f"no report or CSVs found for {source}: give an X.nsys-rep or X.sqlite (exported here with nsys "
                f"stats), the prefix X of CSVs that `nsys stats --format csv --output X` wrote (expected "
                f"{nsys_report_path(prefix, NSYS_TRACE_REPORTS[0])}), or a .json torch.profiler trace")


def check_summary_args(p: argparse.ArgumentParser, args: argparse.Namespace) -> argparse.Namespace:
    if args.e2e_jsonl or args.md or args.stopwatch or args.ranges or args.csv_dir:
        p.error("--summary reads each report's own CSVs and <report>_e2e.jsonl and writes <results-dir>/nsys/"
                "summary-<time>.md: no --e2e-jsonl, --md, --stopwatch, --ranges or --csv-dir")
    args.source = [str(nsys_prefix(source)) for source in args.source]
    for source in args.source:
        try:
            parse_report_name(source)
        except ProfileFormatError as exc:
            p.error(str(exc))
    for given in args.status or []:
        if not any(given.startswith(source + "=") for source in args.source):
            p.error(f"--status {given!r} names none of the reports (give REPORT=TEXT, REPORT as in the list)")
    return args


def load_source(args: argparse.Namespace) -> Profile:
    """The profile of the one source given: a torch.profiler trace, or an nsys report's CSVs (exported here
    first when the report itself is given)."""
    if is_trace(args.source):
        return load_torch_trace(args.source)
    source, prefix = Path(args.source), csv_prefix(args.source, args.csv_dir)
    version_note = None
    if source.suffix in NSYS_REPORT_SUFFIXES and source.is_file():
        version_note = export_report(source, prefix)
    profile = load_nsys(prefix)
    profile.notes += [note for note in (version_note, nsys_kernel_total_check(prefix, profile)) if note]
    return profile


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.summary:
        return summary_main(args)
    try:  # a malformed input is one line and exit 2, like any other bad input
        record = last_e2e_record(args.e2e_jsonl) if args.e2e_jsonl else {}
        stopwatch = stopwatch_ms(record) if record else args.stopwatch
        env = record.get("environment")
        header = results.environment_header(env, source=args.source) if env else f"source: {args.source}"
    except ProfileFormatError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except (KeyError, TypeError, ValueError, AttributeError) as exc:  # a JSON object of another shape
        print(f"error: {args.e2e_jsonl}: not a bench_e2e record: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 2
    if record and record.get("status") not in FINISHED:
        print(f"the profiled run did not finish: status {record.get('status')!r}", file=sys.stderr)
        return 1
    try:
        profile = load_source(args)
    except nsys_tool.NsysError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exc.status
    except ProfileFormatError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except (KeyError, TypeError, ValueError) as exc:  # events or rows lacking a field, or of the wrong type
        print(f"error: {args.source}: malformed profile: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 2
    config = record.get("config") or {}
    source = "bench_e2e's stopwatch" if record else "your stopwatch (--stopwatch)"
    tables = build_tables(profile, stopwatch, attention_shape(config), args.top, compiled=bool(config.get("compile")),
                          ranges=args.ranges, stopwatch_source=source)
    text = header + "\n\n" + render_tables(tables, args.fmt)
    if args.md:
        try:
            Path(args.md).write_text(text + "\n")
        except OSError as exc:
            print(f"error: cannot write {args.md}: {exc.strerror or exc}", file=sys.stderr)
            return 1
    if results.emit(text) and args.md:
        results.emit(f"\nwrote {args.md}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
