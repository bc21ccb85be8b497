"""Result files, records and tables: where a run's `.md`/`.jsonl` go (never overwriting another run's), how a
record is written (one strict-JSON line, whole or not at all), how tables are rendered in any tabulate format
(and which columns they show, a merge's `run` column included), and the statuses every record carries.
torch-free: report.py and kernel_tables.py read results without torch.

The lowest floor of the rendering path: the experiments' table modules (e2e_tables.py, attention_tables.py,
memory_tables.py, precision_tables.py) build on it, report.py on them, the scripts on report.py.
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime
import itertools
import json
import math
import os
import signal
import sys
import threading
from pathlib import Path
from typing import Any, Callable, Iterator, NoReturn

from tabulate import tabulate, tabulate_formats

# ---- statuses ----
# Every record has a "status": "ok", "noisy" (measured, but a phase varied by more than the script's threshold),
# "OOM" (or "OOM on rank N" under torchrun), "error: ...", "timeout after N s", "skipped: ...".
FINISHED = ("ok", "noisy")  # the statuses of a configuration that measured every step


def finished(record: dict[str, Any]) -> bool:
    """Whether a record measured every step (its figures can be quoted, with "noisy" flagged)."""
    return record.get("status") in FINISHED


def is_oom_status(status: str) -> bool:
    return status == "OOM" or status.startswith("OOM on rank")


class SkipAfterOOM:
    """The sweeps' rule, one for runner's sweep and nsys_run.sh's: once a configuration runs out of memory, the
    larger sizes (contexts) of its group (the same model and settings) are skipped: they need more memory still.
    `enabled=False` (--no-skip) runs them anyway."""

    def __init__(self, enabled: bool = True):
        self.enabled = enabled
        self.oom_at: dict[Any, int] = {}  # group -> the smallest size that ran out of memory

    def reason(self, group: Any, size_name: str, size: int) -> str | None:
        """The status of a configuration to skip ("skipped: OOM at ctx=256"), or None to run it."""
        if self.enabled and group in self.oom_at and size > self.oom_at[group]:
            return f"skipped: OOM at {size_name}={self.oom_at[group]}"
        return None

    def record(self, group: Any, size: int, status: str) -> None:
        """Note a configuration's outcome."""
        if is_oom_status(status):
            self.oom_at[group] = min(self.oom_at.get(group, size), size)


# ---- units ----

MIB, GIB = 2**20, 2**30  # MiB and GiB are powers of two


def format_bytes(n: int | float | None) -> str | None:
    """Bytes in the largest power-of-two unit that keeps the number >= 1 (KiB, MiB, GiB)."""
    if n is None:
        return None
    for unit, size in (("GiB", GIB), ("MiB", MIB), ("KiB", 2**10)):
        if n >= size:
            return f"{n / size:.2f} {unit}"
    return f"{n:.0f} B"


# ---- tables ----

TABLE_FORMATS = sorted(tabulate_formats)
LATEX_FORMATS = ("latex", "latex_raw", "latex_booktabs", "latex_longtable")
# file suffix for a report in each table format: only markdown goes into a .md file
REPORT_SUFFIXES = {"github": ".md", "pipe": ".md", "html": ".html", "unsafehtml": ".html", "rst": ".rst",
                   "tsv": ".tsv", **{fmt: ".tex" for fmt in LATEX_FORMATS}}


def report_suffix(fmt: str) -> str:
    """'.md' for markdown formats, '.tex' for LaTeX ones, '.html', '.rst', '.tsv'; '.txt' for the rest."""
    return REPORT_SUFFIXES.get(fmt, ".txt")


def as_report_file(text: str, fmt: str) -> str:
    """A report in `fmt` as its file holds it. LaTeX: a file to \\input, the tables as they are and every other
    line a comment; any other format: the text itself."""
    if fmt not in LATEX_FORMATS:
        return text if text.endswith("\n") else text + "\n"
    out, in_table = [], False
    for line in text.splitlines():
        if line.startswith(("\\begin{tabular}", "\\begin{longtable}")):
            in_table = True
        out.append(line if in_table or not line.strip() else "% " + line)
        if line.startswith(("\\end{tabular}", "\\end{longtable}")):
            in_table = False
    # (the same header whoever writes the file: a run's .tex and report.py's re-render of it are equal, byte for byte)
    header = "% latex_booktabs needs \\usepackage{booktabs}; latex_longtable needs \\usepackage{longtable}.\n"
    return header + "\n".join(out) + "\n"


def render_table(rows: list[dict[str, Any]], columns: list[str], fmt: str = "github",
                 floatfmt: str = ".2f") -> str:
    """Rows (dicts) as a table with `columns` as headers, in any tabulate format; missing values print empty."""
    body = [[row.get(c) for c in columns] for row in rows]
    return tabulate(body, headers=columns, tablefmt=fmt, floatfmt=floatfmt, missingval="")


# the model's shape, which the config table above the results already shows: left out of LaTeX tables by default
MODEL_SHAPE_COLUMNS = ("d_model", "d_ff", "layers", "heads")


def pick_columns(default: list[str], requested: list[str] | None, fmt: str) -> list[str]:
    """--columns as given, else `default` without the model-shape columns for LaTeX formats (a table that fits a
    page: the config table above it already shows the shape). A merge's run column stays first either way: without
    it, rows of two runs cannot be told apart."""
    if requested:
        return ([RUN_COLUMN] if RUN_COLUMN in default and RUN_COLUMN not in requested else []) + requested
    return [c for c in default if not (fmt in LATEX_FORMATS and c in MODEL_SHAPE_COLUMNS)]


def unknown_column(requested: list[str], valid: list[str]) -> str | None:
    """The message for the first requested column that is not one of `valid` (listing them); None if all are."""
    unknown = [c for c in requested if c not in valid]
    return f"unknown column {unknown[0]!r}; valid columns: " + ", ".join(valid) if unknown else None


# ---- merged runs: the `run` column ----
# report.py merges several files into one report: each record then carries the file it came from under RUN_KEY
# (a key no script writes), and every table of the report gets a RUN_COLUMN naming it. A record without it is
# from a single run, whose report has no run column.

RUN_KEY = "_run"
RUN_COLUMN = "run"


def run_of(record: dict[str, Any]) -> str | None:
    return record.get(RUN_KEY)


def run_names(records: list[dict[str, Any]]) -> list[str | None]:
    """The runs of these records, in the order they come."""
    return list(dict.fromkeys(run_of(r) for r in records))


def is_merged(records: list[dict[str, Any]]) -> bool:
    return len(run_names(records)) > 1


def by_run(records: list[dict[str, Any]]) -> dict[str | None, list[dict[str, Any]]]:
    groups: dict[str | None, list[dict[str, Any]]] = {}
    for r in records:
        groups.setdefault(run_of(r), []).append(r)
    return groups


def runs_cell(records: list[dict[str, Any]]) -> str:
    """The run column's cell of a row built from several records: their runs, in order ("monday, tuesday")."""
    return ", ".join(str(run) for run in run_names(records))


def with_run_column(columns: list[str], records: list[dict[str, Any]]) -> list[str]:
    """`columns` with the run column first when the records are a merge."""
    return [RUN_COLUMN] + columns if is_merged(records) else columns


def comparison_groups(records: list[dict[str, Any]], identity: Callable[[dict[str, Any]], Any]
                      ) -> list[list[dict[str, Any]]]:
    """The records that a comparison table may set side by side. Normally all of them: a merge of an fp32 run
    and a bf16 run is compared across the two. But when a configuration (`identity(record)`) appears in more
    than one run, putting them in one table would keep only one of its measurements: each run is then compared
    within itself, and no run's pair is dropped."""
    if is_merged(records):
        runs_of: dict[str, set] = {}
        for r in records:
            runs_of.setdefault(json.dumps(identity(r), sort_keys=True, default=str), set()).add(run_of(r))
        if any(len(runs) > 1 for runs in runs_of.values()):
            return list(by_run(records).values())
    return [records]


def environment_lines(records: list[dict[str, Any]], settings: Callable[[list[dict[str, Any]]], dict[str, Any]]
                      ) -> list[str]:
    """The line above a report's tables: the environment of the records (environment_header) with
    `settings(records)`; for a merge, one such line per run, named."""
    lines = []
    for run, group in by_run(records).items():
        env = next((r["environment"] for r in group if "device_name" in (r.get("environment") or {})), None)
        line = environment_header(env, **settings(group)) if env else f"settings: {settings(group)}"
        lines.append(f"{run}: {line}" if is_merged(records) else line)
    return lines


# A result stem names files inside the results folder, nothing else: no path separators (a stem cannot reach
# another folder, so the no-overwrite rule holds), no leading '.' (hidden files, '.', '..') or '-' (read as a
# flag by the next command), and short enough that the longest file name made from it ("<stem>-<n>_timeline.png")
# stays under the 255-byte name limit of common file systems.
MAX_STEM_BYTES = 200


def result_stem(text: str) -> str:
    """--out: a plain file-name stem, checked at parse time."""
    if not text:
        raise argparse.ArgumentTypeError("must be a non-empty file-name stem")
    if "/" in text or "\\" in text or (os.sep in text) or (os.altsep and os.altsep in text):
        raise argparse.ArgumentTypeError(f"must be a file-name stem without a folder, got {text!r} "
                                         "(use --results-dir to choose the folder)")
    if text[0] in ".-":
        raise argparse.ArgumentTypeError(f"must not start with '.' or '-', got {text!r}")
    if not text.isprintable():
        raise argparse.ArgumentTypeError(f"must be printable characters only, got {text!r}")
    if len(text.encode("utf-8", "surrogateescape")) > MAX_STEM_BYTES:
        raise argparse.ArgumentTypeError(f"must be at most {MAX_STEM_BYTES} bytes long")
    return text


def results_folder(text: str) -> str:
    """--results-dir: a folder, created with its parents when missing; what cannot be created or written is
    refused when the result files are opened, before any work."""
    if not text:
        raise argparse.ArgumentTypeError("must be a folder name, got ''")
    if os.path.exists(text) and not os.path.isdir(text):
        raise argparse.ArgumentTypeError(f"{text!r} exists and is not a folder")
    return text


def json_default(obj: Any) -> Any:
    # torch.dtype and torch.device print as their names; checked by module so that this file needs no torch
    if isinstance(obj, Path) or type(obj).__module__.split(".")[0] == "torch":
        return str(obj)
    raise TypeError(f"not JSON serialisable: {type(obj).__name__}")


def strict_json_value(obj: Any) -> Any:
    """`obj` with every NaN or infinity (in nested dicts, lists and dataclasses too) replaced by None, since
    NaN and Infinity are not JSON and strict readers (jq, JavaScript, most JSON libraries) refuse them."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: strict_json_value(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [strict_json_value(v) for v in obj]
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return strict_json_value(dataclasses.asdict(obj))
    return obj


def to_json_line(record: dict[str, Any]) -> str:
    """One record as one line of strict JSON (no NaN/Infinity tokens)."""
    return json.dumps(strict_json_value(record), default=json_default, allow_nan=False)


def exit_usage_error(message: str) -> NoReturn:
    """A user mistake found after parsing (e.g. a results folder that cannot be written): one line, exit 2."""
    print(f"{Path(sys.argv[0]).name}: error: {message}", file=sys.stderr)
    raise SystemExit(2)


class ResultFiles:
    """`<results_dir>/<subdir>/<stem>.{jsonl,md}` for one run, the stem reserved for this run alone.

    A stem is taken when any file of that stem exists (<stem>.jsonl, <stem>.md, <stem>_timeline.png, ...); then
    <stem>-2, <stem>-3, ... are tried. The stem is reserved by creating <stem>.jsonl with O_EXCL, so two runs
    started together (same --out, or the same second for the default stem) never share one, and no run
    overwrites another's files (a run that writes no JSONL reserves the file it does write: `reserve`). Records
    are appended one by one, each whole or not at all, so an interrupted run keeps what it finished; reports are
    replaced atomically, so a failed write leaves the previous version.

    A folder that cannot be created or written is a one-line exit 2; a write that fails later (a full disk) is a
    one-line exit 1 that keeps the records already written and names only files that hold them."""

    def __init__(self, results_dir: str | os.PathLike, subdir: str, stem: str | None, default_stem: str,
                 reserve: str = ".jsonl"):
        self.folder = Path(results_dir) / subdir
        self.records_written = 0
        chosen = stem is not None
        if stem is None:
            stem = f"{default_stem}-{datetime.datetime.now(datetime.timezone.utc):%Y%m%d-%H%M%S}"
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
            self.stem = self._reserve_stem(stem, reserve)
        except OSError as exc:
            exit_usage_error(f"cannot write results in {self.folder}: {exc.strerror or exc}")
        self.reserved = self.path(reserve)  # created empty: this run's, until something is written into it
        self.records_elsewhere: str | None = None  # report.py: the input files that hold the records it renders
        if self.stem != stem and chosen:  # (a default stem taken in the same second needs no note)
            print(f"note: results for {stem!r} already exist; writing {self.stem!r} instead", file=sys.stderr)

    def _reserve_stem(self, stem: str, reserve: str) -> str:
        for n in itertools.count(1):
            candidate = stem if n == 1 else f"{stem}-{n}"
            # a stem is taken if any file of an earlier run uses it: <stem>.jsonl, <stem>.md, <stem>_timeline.png
            if any(p.name.startswith((candidate + ".", candidate + "_")) for p in self.folder.iterdir()):
                continue
            try:  # atomic: of two runs that both saw the stem free, exactly one creates the file
                os.close(os.open(self.folder / f"{candidate}{reserve}", os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o666))
            except FileExistsError:
                continue
            return candidate
        raise AssertionError("unreachable")

    def release(self) -> None:
        """Give the stem back when the run failed before writing anything: remove the empty reserved file."""
        with contextlib.suppress(OSError):
            if self.reserved.is_file() and self.reserved.stat().st_size == 0 and self.records_written == 0:
                self.reserved.unlink()

    def path(self, suffix: str) -> Path:
        """Path for a file of this run, e.g. path('.md') or path('_timeline.png')."""
        return self.folder / f"{self.stem}{suffix}"

    @property
    def jsonl(self) -> Path:
        return self.path(".jsonl")

    @property
    def markdown(self) -> Path:
        return self.path(".md")

    def kept(self) -> str:
        """Where this run's finished records are, for a message: only a file that exists and holds them."""
        if self.records_elsewhere:
            return f"the records are unchanged in {self.records_elsewhere}"
        if self.records_written:
            return f"the {self.records_written} record(s) written before it are kept in {self.jsonl}"
        return "no record of this run was written"

    def _write_failed(self, path: Path, exc: OSError) -> NoReturn:
        self.release()  # no empty file is left behind for a report that was never written
        print(f"error: cannot write {path}: {exc.strerror or exc}; {self.kept()}", file=sys.stderr)
        raise SystemExit(1)

    def append_record(self, record: dict[str, Any]) -> None:
        """Append one record as a line of strict JSON, whole or not at all: the line is built first and written
        with os.write on an O_APPEND descriptor (a buffered file would write a failed remainder again when it is
        closed, after the cut below). A failed write (a full disk, a file-size limit) or an interrupt cuts the
        file back to its last whole line; a failed write then prints the record on stdout, so the measurement is
        not lost, and ends the run (exit 1) with one line."""
        line = (to_json_line(record) + "\n").encode()
        try:
            fd = os.open(self.jsonl, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o666)
        except OSError as exc:
            self._record_lost(line, exc)
        try:
            end = os.fstat(fd).st_size
            try:
                view = memoryview(line)
                while view:  # os.write may write less than asked (a disk filling up): write the rest
                    view = view[os.write(fd, view):]
            except BaseException as exc:
                with contextlib.suppress(OSError):
                    os.ftruncate(fd, end)
                if isinstance(exc, OSError):
                    self._record_lost(line, exc)
                raise
        finally:
            os.close(fd)
        self.records_written += 1

    def _record_lost(self, line: bytes, exc: OSError) -> NoReturn:
        self.release()
        emit(line.decode().rstrip("\n"))  # the measured configuration, as the JSON line it would have been
        print(f"error: cannot write {self.jsonl}: {exc.strerror or exc}; {self.kept()}; the record that could not "
              "be written is printed on stdout", file=sys.stderr)
        raise SystemExit(1)

    def _replace(self, path: Path, text: str) -> None:
        """Replace a report file (called again as rows finish): written beside it, then renamed over it."""
        partial = path.with_name(path.name + ".partial")
        try:
            partial.write_text(text if text.endswith("\n") else text + "\n")
            os.replace(partial, path)
        except BaseException as exc:  # a full disk, or Ctrl-C half-way: no partial file is left
            with contextlib.suppress(OSError):
                partial.unlink()
            if isinstance(exc, OSError):
                self._write_failed(path, exc)
            raise

    def write_markdown(self, text: str) -> None:
        """Replace this run's markdown with `text`."""
        self._replace(self.markdown, text)

    def report_paths(self, fmt: str) -> list[Path]:
        """The report files of a run printed in `fmt`: the .md, and <stem>.tex (.html, .rst, ...) beside it."""
        suffix = report_suffix(fmt)
        return [self.markdown] + ([self.path(suffix)] if suffix != ".md" else [])

    def _report_files(self, render: Callable[[str], str | None], fmt: str) -> dict[Path, str | None]:
        """The files write_report writes for `fmt` and their text (None where `render` has none)."""
        if report_suffix(fmt) == ".md":
            return {self.markdown: render(fmt)}
        text = render(fmt)
        return {self.markdown: render("github"),
                self.path(report_suffix(fmt)): None if text is None else as_report_file(text, fmt)}

    def holds_report(self, render: Callable[[str], str | None], fmt: str) -> bool:
        """Whether the report files already hold what write_report(render, fmt) would write (a sweep saved them
        after its last row, and no interrupt cut that short): then there is nothing to write again."""
        for path, text in self._report_files(render, fmt).items():
            try:
                if text is None or path.read_text() != (text if text.endswith("\n") else text + "\n"):
                    return False
            except (OSError, UnicodeDecodeError):
                return False
        return True

    def write_report(self, render: Callable[[str], str], fmt: str) -> str:
        """Save the report that `render(fmt)` makes: the .md always in markdown, and when `fmt` is not markdown
        (LaTeX, plain, html, ...) also in `fmt` beside it (report_paths). Returns the text in `fmt`."""
        text = render(fmt)
        if report_suffix(fmt) == ".md":
            self.write_markdown(text)
        else:
            self.write_markdown(render("github"))
            self._replace(self.path(report_suffix(fmt)), as_report_file(text, fmt))
        return text

    def publish(self, render: Callable[[str], str], fmt: str, extra_paths: list[str] = ()) -> None:
        """Save the report (write_report), print it, and say where it and the other files are. The files are
        written first, so a closed stdout (`... | head -1`) loses nothing."""
        text = self.write_report(render, fmt)
        if emit(text):
            self.say_written(fmt, extra_paths)

    def say_written(self, fmt: str, extra_paths: list[str] = ()) -> None:
        records = [self.jsonl] if self.jsonl.is_file() else []  # report.py writes none of its own
        emit("\nwrote " + " and ".join(map(str, [*self.report_paths(fmt), *records, *extra_paths])))


def read_records(path: str | os.PathLike) -> list[dict[str, Any]]:
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]



def environment_header(env: dict[str, Any], **extra: Any) -> str:
    """One line to print above a table, naming what the numbers were measured on."""
    parts = [f"device: {env['device_name']} ({env['device']})", f"torch {env['torch']}"]
    if env.get("cuda"):
        parts.append(f"CUDA {env['cuda']}")
    if env["device"].startswith("cuda"):
        parts.append(f"TF32 matmul {'on' if env['tf32_matmul'] else 'off'}")
    else:
        parts.append(f"{env['threads']} threads")
    parts += [f"{k}: {v}" for k, v in extra.items()]
    return " | ".join(parts)


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised where the run is so that it stops like Ctrl-C does (the sweep: child stopped, rows kept)."""


@contextlib.contextmanager
def sigterm_as_interrupt() -> Iterator[None]:
    """SIGTERM (a scheduler's time limit, `timeout`, plain `kill`) raises Terminated while the block runs (the
    sweep, bench_noise); the previous handler is back afterwards."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum: int, frame: Any) -> None:
        raise Terminated()

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def progress(message: str) -> None:
    """Progress lines go to stderr so stdout stays a clean table."""
    print(message, file=sys.stderr, flush=True)


def emit(text: str) -> bool:
    """Print to stdout; False once stdout is closed (`... | head -1`): later output then goes to /dev/null, so
    neither a BrokenPipeError nor Python's exit-time flush interrupts the work or its result files."""
    try:
        print(text, flush=True)
        return True
    except BrokenPipeError:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
        progress("stdout was closed: the rest of the report is only in the result files")
        return False
