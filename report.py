"""Saved runs, again: the report of any study script's JSONL records in any format, several runs merged into
one report (a `run` column in every table), and the study's figures as PNG, all without rerunning anything.

Answers the practical question of every writeup: the GPU time is spent, the numbers are in results/, and the
table is needed in LaTeX, with fewer columns, next to Tuesday's run, or as a picture.

    python3 report.py results/e2e/e2e-20250101-120000.jsonl                    # the report again (markdown)
    python3 report.py results/e2e/run.jsonl --fmt latex_booktabs               # a .tex file for the writeup
    python3 report.py results/e2e/run.jsonl --columns size ctx dtype "step ms" "step std"
    python3 report.py results/e2e/fp32.jsonl results/e2e/bf16.jsonl            # one report, a 'run' column
    python3 report.py results/e2e/warmup.jsonl --plot                           # the figures, as PNG
    python3 report.py results/attention/*.jsonl --plot --fmt plain

One rendering path. render() is the only code that turns records into a report: the live .md a sweep rewrites as
rows finish (LiveReport, sweep.run_sweep's Experiment.render), the files of a script's --fmt, the report the
script prints at the end (publish) and this command's re-renders and merges. A re-render of a saved run is
therefore the run's own file, byte for byte. (bench_noise.py, a benchmark of the toolkit itself, prints only a
summary of its runs' speed-ups; each of those runs is a bench_e2e run that this command re-renders.) The layout,
each floor importing only those below it:

    results.py            result files, records, render_table, column choice, the run column of merges
    e2e_tables.py         bench_e2e's report        attention_tables.py   bench_attention's report
    memory_tables.py      mem_profile's report      precision_tables.py   precision_demo's and toy_autocast's
    figures.py            the figures of every experiment (matplotlib imported where a figure is made)
    report.py             this file: which experiment a record is (RENDERERS), render, publish, the command line
    the scripts           measure, append records, call report.render / report.publish for their experiment

None of them imports torch, and nothing here imports a script: only the project's own experiments are known (a
record's "experiment" field selects an entry of RENDERERS, never a module). Reports are saved under
results/report/ (.md, and .tex for LaTeX formats, .html, ...), figures beside them; nothing already there is
overwritten. An interrupted run's truncated last line is skipped with a note; any other bad input is one line
naming the file, the line and what is wrong, and exit status 2 (in a merge, the other files still render).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import attention_tables
import cli
import e2e_tables
import figures
import memory_tables
import precision_tables
from results import (RUN_COLUMN, RUN_KEY, ResultFiles, emit, progress, to_json_line, unknown_column)


class ReportError(Exception):
    """Bad input, said in one line (exit status 2)."""


# ---- the experiments ----


@dataclass(frozen=True)
class Renderer:
    """How one experiment's records become its report."""

    render: Callable[[list[dict[str, Any]], str, list[str] | None], str]  # (records, fmt, --columns) -> report
    columns: Callable[[list[dict[str, Any]]], list[str]]  # what --columns may name in its main table


RENDERERS: dict[str, Renderer] = {
    "bench_e2e": Renderer(e2e_tables.render_report, lambda records: e2e_tables.COLUMNS),
    "bench_attention": Renderer(attention_tables.render_report, lambda records: attention_tables.TABLE_COLUMNS),
    "mem_profile": Renderer(memory_tables.render_report, lambda records: memory_tables.PEAK_COLUMNS),
    "precision_demo": Renderer(precision_tables.render_precision_report, lambda records: precision_tables.COLUMNS),
    "toy_autocast": Renderer(precision_tables.render_toy_report, precision_tables.toy_columns),
}
# results subfolder -> the experiment that writes it, for records older than the "experiment" field whose shape
# says nothing (precision/ holds two experiments: their records tell them apart by shape)
EXPERIMENT_BY_SUBDIR = {"e2e": "bench_e2e", "attention": "bench_attention", "memory": "mem_profile"}


def as_read_back(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Records exactly as a reader of the JSONL gets them (one strict-JSON line each, read again): a run renders
    what its file holds (no NaN, no tuple, no object that only lives in memory), so a re-render equals it."""
    return [json.loads(to_json_line(r)) for r in records]


def render(experiment: str, records: list[dict[str, Any]], fmt: str, columns: list[str] | None = None) -> str:
    """The report of an experiment's records (a merge when they carry results.RUN_KEY) in any tabulate format,
    with `columns` in its main table."""
    return RENDERERS[experiment].render(as_read_back(records), fmt, columns)


class LiveReport:
    """A sweep's report as rows finish: sweep.run_sweep calls it (Experiment.render) after every row to rewrite
    the .md and the --fmt file. It keeps the last text it made, so that the script prints what was saved without
    building the report again (publish: when the files hold it; a sweep interrupted while saving it is saved
    again)."""

    def __init__(self, experiment: str, columns: list[str] | None = None):
        self.experiment, self.columns = experiment, columns
        self._last: dict[str, tuple[int, str]] = {}  # fmt -> (how many records, the report)

    def __call__(self, records: list[dict[str, Any]], fmt: str) -> str:
        text = render(self.experiment, records, fmt, self.columns)
        self._last[fmt] = (len(records), text)
        return text

    def saved(self, records: list[dict[str, Any]], fmt: str) -> str | None:
        """The report in `fmt` made for all these records, or None if the sweep stopped before saving it."""
        count, text = self._last.get(fmt, (None, None))
        return text if count == len(records) else None


def publish(experiment: str, records: list[dict[str, Any]], files: ResultFiles, fmt: str,
            columns: list[str] | None = None, *, plot: bool = False, live: LiveReport | None = None,
            text: str | None = None, append: list[dict[str, Any]] = (), extra_paths: list[Any] = (),
            must_plot: bool = False) -> int:
    """The end of every run: append `append` (records that follow the measured ones: bench_e2e's search answers),
    save the report (unless the sweep's LiveReport saved it after its last row, or `text` is it in `fmt`
    already), print it, then draw --plot's figures, then say where everything is. Returns 0; 1 when a figure
    failed (the tables stand); 2 when `must_plot` (report.py --plot) and nothing could be drawn; 130 after Ctrl-C,
    said in one line that names the files holding the finished records."""
    try:
        for record in append:
            files.append_record(record)
        saved = live.saved(records, fmt) if live is not None else None
        if saved is None or not files.holds_report(lambda f: live.saved(records, f), fmt):
            saved = files.write_report(
                lambda f: text if text is not None and f == fmt else render(experiment, records, f, columns), fmt)
        shown = emit(saved)
        code, drawn = 0, figures.Drawn()
        if plot and (missing := figures.matplotlib_missing()):
            progress(f"note: no figures: {missing}")  # the run's results stand either way
        elif plot:
            drawn = figures.write_figures(experiment, records, files)
            if drawn.nothing:
                said = f"nothing to plot: {figures.FIGURE_NEEDS[experiment]}"
                progress(f"report.py: error: {said}" if must_plot else f"note: no figures: {said}")
                code = 2 if must_plot else 0
            code = 1 if drawn.failed else code
        if shown:
            files.say_written(fmt, [*extra_paths, *drawn.paths])
        return code
    except KeyboardInterrupt:
        if files.records_elsewhere:
            where = f"the records are unchanged in {files.records_elsewhere}"
        else:
            where = (f"the {files.records_written} finished record(s) are in {files.jsonl}; python3 report.py "
                     f"{files.jsonl} renders them again")
        progress(f"interrupted by Ctrl-C while the report was written: {where}")
        return 130


# ---- reading saved runs ----


def load_records(path: str | Path) -> tuple[list[tuple[int, dict[str, Any]]], int]:
    """The (line number, record) pairs of one JSONL file and how many truncated lines were skipped. Records are
    appended one line at a time, so an interrupted run can leave a partial last line: it is skipped (and
    counted). A bad line before the last, a missing file or a file without records is a ReportError."""
    path = Path(path)
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise ReportError(f"{path}: no such file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ReportError(f"{path}: cannot read: {getattr(exc, 'strerror', None) or exc}") from None
    lines = [(n, line) for n, line in enumerate(text.splitlines(), 1) if line.strip()]
    records, skipped = [], 0
    for i, (n, line) in enumerate(lines):
        try:
            record = json.loads(line)
        except (ValueError, RecursionError) as exc:  # not JSON; a number too long; nesting too deep
            if i == len(lines) - 1 and records:
                skipped += 1  # the run stopped while writing its last record
                continue
            reason = exc.msg if isinstance(exc, json.JSONDecodeError) else str(exc) or type(exc).__name__
            raise ReportError(f"{path}:{n}: not a JSON record ({reason}); is this a results .jsonl file?") from None
        if not isinstance(record, dict):
            raise ReportError(f"{path}:{n}: not a JSON object; is this a results .jsonl file?")
        records.append((n, record))
    if not records:
        raise ReportError(f"{path}: no records (an empty file, or a run that finished no configuration)")
    return records, skipped


def experiment_of(record: dict[str, Any], path: Path | None = None) -> str:
    """The experiment that wrote `record`: its "experiment" field (one of RENDERERS), else its shape, else the
    results subfolder it is in. Anything else is a ReportError (the caller adds the file and line)."""
    if "experiment" in record:
        name = record["experiment"]
        if not isinstance(name, str):
            raise ReportError(f"its 'experiment' is {json.dumps(name)[:60]}, not the name of an experiment")
        if name not in RENDERERS:
            raise ReportError(f"unknown experiment {name[:60]!r}: report.py renders {', '.join(RENDERERS)}")
        return name
    config = record.get("config")
    if "accumulator_dtype" in record:
        return "precision_demo"
    if "autocast_dtype" in record:
        return "toy_autocast"
    if "weights_bytes" in record:
        return "mem_profile"
    if isinstance(config, dict) and "impl" in config:
        return "bench_attention"
    if isinstance(config, dict) and "model" in config and "mode" in config:
        return "bench_e2e"
    if "snapshot_path" in record:
        raise ReportError("a memory-snapshot analysis: re-render it with python3 mem_profile.py --analyze <pickle>")
    if path is not None and path.parent.name in EXPERIMENT_BY_SUBDIR:
        return EXPERIMENT_BY_SUBDIR[path.parent.name]
    raise ReportError("cannot tell which experiment wrote it: no 'experiment' field, and not the shape of any "
                      "(is this a results .jsonl file?)")


@dataclass
class Run:
    """The records of one file, with where they came from."""

    path: Path
    records: list[dict[str, Any]]
    line_numbers: list[int]  # of each record in the file
    experiment: str
    skipped_lines: int = 0
    name: str = ""  # the run column's value in a merge: the stem, or the path when two inputs share a stem


def read_run(path: str) -> Run:
    """One file's records and their experiment, checked record by record (a ReportError names the line)."""
    numbered, skipped = load_records(path)
    path = Path(path)
    kinds = {}
    for n, record in numbered:
        try:
            kinds.setdefault(experiment_of(record, path), n)
        except ReportError as exc:
            raise ReportError(f"{path}:{n}: {exc}") from None
        if len(kinds) > 1:
            first, other = kinds
            raise ReportError(f"{path}:{n}: a {other} record in a file of {first} records (line {kinds[first]})")
    return Run(path, [r for _, r in numbered], [n for n, _ in numbered], next(iter(kinds)), skipped, path.stem)


def what_is_wrong(exc: Exception) -> str:
    if isinstance(exc, KeyError):
        return f"no field {exc.args[0]!r}" if exc.args else "a field is missing"
    return f"{type(exc).__name__}: {exc}"[:200]


def render_run(run: Run, fmt: str, columns: list[str] | None) -> str:
    """The report of one file's records; records it cannot render are a ReportError naming the first line that
    fails on its own (a field missing or of the wrong type), else the file."""
    try:
        return render(run.experiment, run.records, fmt, columns)
    except Exception as exc:  # noqa: BLE001 - data of any shape: find the record that breaks the report
        for n, record in zip(run.line_numbers, run.records):
            try:
                render(run.experiment, [record], fmt, columns)
            except Exception as alone:  # noqa: BLE001
                raise ReportError(f"{run.path}:{n}: not a {run.experiment} record as its script writes it: "
                                  f"{what_is_wrong(alone)}") from None
        raise ReportError(f"{run.path}: records that do not make one {run.experiment} report: "
                          f"{what_is_wrong(exc)}") from None


def merged_records(runs: list[Run]) -> list[dict[str, Any]]:
    """The records of one run as they are; of several, each marked with its run (results.RUN_KEY)."""
    if len(runs) == 1:
        return runs[0].records
    return [{**record, RUN_KEY: run.name} for run in runs for record in run.records]


def name_runs(runs: list[Run]) -> None:
    """Each run's name in the run column: its stem, or its path as given when two inputs share a stem."""
    stems = [run.path.stem for run in runs]
    for run in runs:
        run.name = run.path.stem if stems.count(run.path.stem) == 1 else str(run.path)


# ---- arguments the scripts share ----


def add_columns_arg(parser: argparse.ArgumentParser) -> None:
    """--columns, the same in report.py and the experiment scripts."""
    parser.add_argument("--columns", nargs="+", default=None, metavar="NAME",
                        help="columns of the main table, in this order, named as in the printed table (default: "
                             "the script's; LaTeX formats leave out the model shape, which the config table shows)")


def add_columns_and_plot_args(parser: argparse.ArgumentParser, experiment: str) -> None:
    """--columns and --plot, the same on every experiment script that sweeps."""
    add_columns_arg(parser)
    parser.add_argument("--plot", action="store_true",
                        help="after the run, draw the study's figures as PNG beside the results (needs matplotlib; "
                             f"the same as report.py --plot): {figures.FIGURE_NEEDS[experiment]}")


def columns_or_exit(parser: argparse.ArgumentParser, requested: list[str] | None, valid: list[str]) -> None:
    """An experiment script's --columns, checked before anything runs: an unknown name is a one-line exit 2."""
    if requested and (message := unknown_column(requested, valid)):
        parser.error(f"--columns: {message}")


# ---- command line ----


def build_parser() -> argparse.ArgumentParser:
    p = cli.ArgParser(description=__doc__.split("\n\n")[0])
    p.add_argument("jsonl", nargs="+", metavar="JSONL",
                   help="results file(s) of one experiment script; several are merged into one report")
    add_columns_arg(p)
    p.add_argument("--plot", action="store_true", help="also draw the study's figures as PNG (needs matplotlib)")
    cli.add_output_args(p, default_stem="<first input's stem>")
    return p


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.plot and (message := figures.matplotlib_missing()):
        parser.error(message)
    return args


def error(message: str) -> None:
    progress(f"report.py: error: {message}")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        return report_runs(args)
    except KeyboardInterrupt:  # before publish (which says what it saved): nothing was written, the inputs stand
        progress("interrupted by Ctrl-C: nothing written; the records are unchanged in " + ", ".join(args.jsonl))
        return 130


def report_runs(args: argparse.Namespace) -> int:
    """report.py's work: read, check, merge, render, save, print, plot."""
    runs, refused = [], 0
    first_name: dict[str, str] = {}  # a file named twice, by any path, is one run, read once
    for path in args.jsonl:
        first_name.setdefault(os.path.realpath(path), path)
    given = list(first_name.values())
    if len(given) < len(args.jsonl):
        progress("note: a file given more than once is read once")
    for path in given:
        try:
            runs.append(read_run(path))
        except ReportError as exc:
            error(str(exc))
            refused += 1
    if not runs:
        return 2
    kinds = {run.experiment: run.path.stem for run in runs}
    if len(kinds) > 1:
        error("cannot merge records of different experiments: "
              + ", ".join(f"{stem} is {kind}" for kind, stem in kinds.items()))
        return 2
    experiment = runs[0].experiment
    name_runs(runs)
    if args.columns:
        valid = ([RUN_COLUMN] if len(runs) > 1 else []) + RENDERERS[experiment].columns(
            [r for run in runs for r in run.records])
        if message := unknown_column(args.columns, list(dict.fromkeys(valid))):
            error(message)
            return 2
    rendered = []  # each file on its own first: one that cannot be rendered is named, the others go on
    for run in runs:
        try:
            rendered.append((run, render_run(run, args.fmt, args.columns)))
        except ReportError as exc:
            error(str(exc))
            refused += 1
    if not rendered:
        return 2
    runs = [run for run, _ in rendered]
    for run in runs:
        if run.skipped_lines:
            progress(f"note: {run.path}: skipped {run.skipped_lines} truncated line(s) at the end (an interrupted "
                     f"run); using its {len(run.records)} complete record(s)")
    records = merged_records(runs)
    if len(runs) == 1:
        text = rendered[0][1]
    else:
        try:
            text = render(experiment, records, args.fmt, args.columns)
        except Exception as exc:  # noqa: BLE001 - each file renders alone, together they do not
            error(f"cannot merge {', '.join(str(run.path) for run in runs)}: {what_is_wrong(exc)}")
            return 2
    stem = runs[0].path.stem if len(runs) == 1 else f"{runs[0].path.stem}-merged-{len(runs)}"
    files = ResultFiles(args.results_dir, "report", args.out or stem, "report", reserve=".md")
    files.records_elsewhere = ", ".join(str(run.path) for run in runs)
    code = publish(experiment, records, files, args.fmt, args.columns, plot=args.plot, text=text, must_plot=True)
    return code or (2 if refused else 0)


if __name__ == "__main__":
    sys.exit(main())
