"""Running Nsight Systems' own command line: finding `nsys` and its version, the `nsys stats` reports it knows
(the names changed in 2023; the older ones are used where the newer are missing), exporting a report's traces to
the CSVs that profile_readers.py reads, and saying in one line why nsys could not (a report written by a newer
nsys, a file that is no report); and, for a profile on a CPU, the NVTX library built from the headers that ship
with nsys. Used by kernel_tables.py (a .nsys-rep or .sqlite given) and nsys_sweep.py. torch-free.
"""
from __future__ import annotations

import hashlib
import os
import re
import shutil
import sqlite3
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from profile_readers import NSYS_TRACE_REPORTS, nsys_report_path

NSYS_ENV = "NSYS"  # names the nsys binary; else `nsys` on PATH
# Names an NVTX library for runs on a CPU, where torch has no NVTX: the variable common.nvtx_functions reads
# (common.NVTX_LIBRARY_ENV; spelled again here so that nsys_sweep.py needs no torch).
NVTX_LIBRARY_ENV = "BENCH_NVTX_LIBRARY"
# The traces feed the tables; cuda_gpu_kern_sum is their cross-check; nvtx_kern_sum is for people to read.
REPORTS = (*NSYS_TRACE_REPORTS, "cuda_gpu_kern_sum", "nvtx_kern_sum")
# What nsys before 2023.1 called the same reports (nsys 2022.4's `stats --help-reports`). Their CSVs are written
# under the new names, so the rest of the code knows only those.
OLD_REPORT_NAMES = {"cuda_gpu_trace": "gputrace", "cuda_api_trace": "cudaapitrace",
                    "nvtx_pushpop_trace": "nvtxpptrace", "cuda_gpu_kern_sum": "gpukernsum",
                    "nvtx_kern_sum": "nvtxkernsum"}
TESTED_VERSION = "2023.4.4"
DOWNLOAD = "https://developer.nvidia.com/nsight-systems"


class NsysError(Exception):
    """nsys could not do what was asked; `status` is the exit status to end with (2: the input or the installed
    nsys needs the user's action, 1: nsys failed)."""

    def __init__(self, message: str, status: int = 1):
        super().__init__(message)
        self.status = status


def find_nsys() -> tuple[str | None, str]:
    """(the nsys binary, '') or (None, why there is none): $NSYS when set, else `nsys` on PATH."""
    given = os.environ.get(NSYS_ENV)
    if given:
        found = shutil.which(given)
        return (found, "") if found else (None, f"{NSYS_ENV}={given} is not an executable nsys binary")
    found = shutil.which("nsys")
    return (found, "") if found else (None, "nsys (Nsight Systems) is not on PATH")


def install_hint() -> str:
    return (f"install Nsight Systems ({DOWNLOAD}; it also ships with the CUDA toolkit, e.g. /usr/local/cuda/bin/nsys, "
            f"and with NVIDIA's apt repository: apt-get install nsight-systems-<version>), then put it on PATH or "
            f"set {NSYS_ENV}=/path/to/nsys")


def parse_version(text: str) -> tuple[int, ...] | None:
    """(2023, 4, 4) from "NVIDIA Nsight Systems version 2023.4.4.54-234433681190v0", "2025.1.3.140" (an export's
    EXPORT_PRODUCT_VERSION) or "2026@1@1@12-..." (a .nsys-rep's header); None when there is no such number."""
    match = re.search(r"(20\d\d)[.@](\d+)[.@](\d+)", text)
    return tuple(int(part) for part in match.groups()) if match else None


def version_text(version: tuple[int, ...] | None) -> str:
    return ".".join(map(str, version)) if version else "an unknown version"


@dataclass
class Nsys:
    """One nsys binary: its version and the stats reports it knows, under the names to ask it for."""

    path: str
    version_line: str  # what `nsys --version` printed, "" when it printed nothing
    version: tuple[int, ...] | None
    known: dict[str, str]  # report name here -> the name this nsys knows it by

    @classmethod
    def probe(cls, path: str) -> "Nsys":
        """Ask the binary its version and its report names (`nsys stats --help-reports`)."""
        try:
            version = run([path, "--version"]).stdout.strip().splitlines()
            listing = run([path, "stats", "--help-reports"])
        except (OSError, subprocess.SubprocessError) as exc:
            raise NsysError(f"{path} does not run: {exc}", 2) from None
        line = version[0] if version else ""
        names = set(re.findall(r"^\s*([a-z_]+)\b", listing.stdout + listing.stderr, re.MULTILINE))
        known = {}
        for report in REPORTS:
            if report in names:
                known[report] = report
            elif OLD_REPORT_NAMES[report] in names:
                known[report] = OLD_REPORT_NAMES[report]
        return cls(path, line, parse_version(line), known)

    @property
    def described(self) -> str:
        """'NVIDIA Nsight Systems version 2023.4.4... (/path/nsys)'."""
        return f"{self.version_line or 'nsys of unknown version'} ({self.path})"

    def check_reports(self) -> None:
        """NsysError (status 2, one line) when this nsys knows a trace report by neither name."""
        missing = [report for report in NSYS_TRACE_REPORTS if report not in self.known]
        if missing:
            names = ", ".join(f"{report} (or {OLD_REPORT_NAMES[report]})" for report in missing)
            raise NsysError(f"{self.described} has no stats report {names}: install Nsight Systems "
                            f"{TESTED_VERSION} or newer ({DOWNLOAD})", 2)

    def profile_options(self) -> str:
        """What `nsys profile --help` prints: the flags this nsys knows."""
        result = run([self.path, "profile", "--help"])
        return result.stdout + result.stderr


def run(argv: list[str], **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run(argv, capture_output=True, text=True, timeout=120, errors="replace", **kwargs)


# ---- which nsys wrote a report ----


def report_version(source: str | Path) -> tuple[int, ...] | None:
    """The Nsight Systems version that wrote a .nsys-rep (its first line: "NVIDIA Tegra Profiler Report
    2023@4@4@54-..."; nsys compares it to its own and refuses newer ones) or exported a .sqlite (META_DATA_EXPORT's
    EXPORT_PRODUCT_VERSION); None when the file says nothing readable about it."""
    path = Path(source)
    try:
        if path.suffix == ".sqlite":
            with sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True) as db:
                row = db.execute("SELECT value FROM META_DATA_EXPORT WHERE name = 'EXPORT_PRODUCT_VERSION'").fetchone()
            return parse_version(str(row[0])) if row else None
        with open(path, "rb") as f:
            head = f.read(256).decode("latin-1")
        return parse_version(head) if "Report" in head else None
    except (OSError, sqlite3.Error):
        return None


def newer_report_message(source: Path, written_by: tuple[int, ...], nsys: Nsys) -> str:
    """One line: the report's version, this nsys's, and what to do."""
    line = (f"{source} was written by Nsight Systems {version_text(written_by)}, newer than this nsys "
            f"({version_text(nsys.version)}, {nsys.path}), which cannot read it: install Nsight Systems "
            f"{version_text(written_by[:2])} or newer ({DOWNLOAD}) and run again with {NSYS_ENV}=/path/to/it")
    if source.suffix != ".sqlite":
        line += (f", or export it where it was made (nsys export --type sqlite {source.name}) and give the "
                 ".sqlite, which older versions often read")
    return line


# ---- nsys stats: a report's traces as CSV files ----


def stats_command(nsys: Nsys, source: Path, prefix: Path) -> list[str]:
    """`nsys stats` writing every report in REPORTS as PREFIX_<name>.csv. From a .nsys-rep, a fresh SQLite
    export (--force-export: nsys would otherwise reuse a stale one with only a notice) at PREFIX.sqlite; a .sqlite
    is read as it is (nsys refuses --force-export and --sqlite for one)."""
    argv = [nsys.path, "stats"]
    if source.suffix != ".sqlite":
        argv += ["--force-export=true", "--sqlite", f"{prefix}.sqlite"]
    argv += ["--force-overwrite=true", "--format", "csv", "--output", str(prefix)]
    for report in REPORTS:
        if report in nsys.known:
            argv += ["--report", nsys.known[report]]
    return argv + [str(source)]


def what_nsys_said(log: str, name: str) -> str:
    """The log's lines about one report, without the "Processing [...] with [...] to [...]... " preamble."""
    lines = [re.sub(r"^Processing .*\.\.\. *", "", line) for line in log.splitlines() if name in line]
    return " ".join(line for line in lines if line.strip())


def export_csvs(nsys: Nsys, source: str | Path, prefix: str | Path, log_path: str | Path) -> list[str]:
    """Run `nsys stats` on a .nsys-rep or .sqlite, writing PREFIX_<report>.csv and its console output to
    `log_path`. Returns notes (an empty report: what nsys said about it). NsysError, one line, when nsys failed,
    could not read the report (naming the versions when a newer nsys wrote it), or wrote no trace CSV.

    nsys stats exits 0 even when the export failed (it says "Exportation error" and writes empty CSVs) and when
    it skips a report: it writes an empty CSV for a report without data (every CUDA report of a run without GPU
    work) and none for a report it does not know. So each CSV is checked, and the export itself."""
    source, prefix = Path(source), Path(prefix)
    for report in REPORTS:  # a report this run fails to write must not be read from an earlier run
        for name in {report, OLD_REPORT_NAMES[report]}:
            nsys_report_path(prefix, name).unlink(missing_ok=True)
    if source.suffix != ".sqlite":
        Path(f"{prefix}.sqlite").unlink(missing_ok=True)
    try:
        result = subprocess.run(stats_command(nsys, source, prefix), capture_output=True, text=True,
                                errors="replace")
    except OSError as exc:
        raise NsysError(f"{nsys.path} does not run: {exc}", 2) from None
    log = result.stdout + result.stderr
    Path(log_path).write_text(log)
    export_failed = source.suffix != ".sqlite" and not Path(f"{prefix}.sqlite").exists()
    if result.returncode != 0 or export_failed:
        written_by = report_version(source)
        if written_by and nsys.version and written_by > nsys.version:
            raise NsysError(newer_report_message(source, written_by, nsys), 2)
        said = next((line.strip() for line in log.splitlines() if re.search(r"error", line, re.IGNORECASE)),
                    log.strip().splitlines()[-1] if log.strip() else "no output")
        if result.returncode != 0:
            raise NsysError(f"nsys stats failed on {source} with exit status {result.returncode}: {said} "
                            f"(log: {log_path})", result.returncode if 0 < result.returncode < 126 else 1)
        raise NsysError(f"{nsys.described} could not read {source}: {said} (log: {log_path})", 2)
    notes, missing = [], []
    for report in REPORTS:
        if report not in nsys.known:
            notes.append(f"{report}: this nsys has no such report")
            continue
        asked = nsys.known[report]
        csv = nsys_report_path(prefix, asked)
        if asked != report and csv.exists():
            csv = csv.replace(nsys_report_path(prefix, report))
        said = what_nsys_said(log, asked)
        if not csv.exists():
            if report in NSYS_TRACE_REPORTS:
                missing.append(f"{report} ({said or 'nothing said'})")
            else:
                notes.append(f"warning: nsys stats wrote no {csv.name}: {said or 'nothing said'}")
        elif csv.stat().st_size == 0:
            notes.append(f"{report} is empty: {said or 'no data'}")
    if missing:
        raise NsysError(f"nsys stats wrote no {', '.join(missing)} for {source} (log: {log_path})")
    return notes


# ---- NVTX ranges for a profile on a CPU ----


def nvtx_cache_folder() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "cs336-bench"


def nvtx_include_dir(nsys_path: str | Path) -> Path | None:
    """The NVTX3 headers: inside the nsys package (beside the binary, or in target-linux-x64/ of an installed
    Nsight Systems), else a CUDA toolkit's."""
    real = Path(nsys_path).resolve()
    candidates = (real.parent / "nvtx" / "include", real.parent.parent / "target-linux-x64" / "nvtx" / "include",
                  Path("/usr/local/cuda/include"))
    return next((include for include in candidates if (include / "nvtx3" / "nvToolsExt.h").is_file()), None)


def build_nvtx_library(include: Path, library: Path, compiler: str = "gcc") -> Path:
    """libnvtx.so: NVTX3's header-only implementation compiled with its API exported, so that the library exports
    nvtxRangePushA and nvtxRangePop (what torch binds, and what CUDA's libnvToolsExt.so exports). Under nsys, its
    calls reach nsys's injection library as torch's do on a GPU machine. Written beside, then renamed into place,
    so that two runs never load a half-written library. CalledProcessError when the compiler fails."""
    library.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=library.parent) as work:
        source, built = Path(work) / "nvtx.c", Path(work) / library.name
        source.write_text("#include <nvtx3/nvToolsExt.h>\n")
        subprocess.run([compiler, "-shared", "-fPIC", "-O1", "-DNVTX_EXPORT_API",
                        '-DNVTX_DECLSPEC=__attribute__((visibility("default")))', f"-I{include}",
                        "-o", str(built), str(source), "-ldl"], check=True, capture_output=True, text=True,
                       timeout=300)
        os.replace(built, library)
    return library


def runs_on_cpu(extra: list[str]) -> bool:
    """Whether bench_e2e.py will run on a CPU: its --device when given, else what torch says (common.resolve_device
    picks CUDA when torch sees a GPU), asked in a child process so that the sweep stays torch-free."""
    devices = [arg.partition("=")[2] or (extra[i + 1] if i + 1 < len(extra) else "")
               for i, arg in enumerate(extra) if arg.partition("=")[0] == "--device"]
    device = devices[-1] if devices else "auto"
    if device != "auto":
        return device == "cpu"
    probe = "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 3)"
    return subprocess.run([sys.executable, "-c", probe], capture_output=True).returncode != 0


def nvtx_library_for_cpu(nsys_path: str, extra: list[str], say: Callable[[str], None]) -> str | None:
    """The NVTX library a CPU run of bench_e2e.py (`extra`: its arguments) needs, built once into the cache when
    none is named; None on a GPU (torch's own NVTX) or when $BENCH_NVTX_LIBRARY names one. `say` tells that it
    builds one. NsysError (2) saying what to do when none can be built."""
    if os.environ.get(NVTX_LIBRARY_ENV) or not runs_on_cpu(extra):
        return None
    include = nvtx_include_dir(nsys_path)
    compiler = os.environ.get("CC") or "gcc"
    how = (f"set {NVTX_LIBRARY_ENV} to a library exporting nvtxRangePushA and nvtxRangePop, e.g. built with: gcc "
           f"-shared -fPIC -O1 -DNVTX_EXPORT_API '-DNVTX_DECLSPEC=__attribute__((visibility(\"default\")))' "
           f"-I<nsys folder>/nvtx/include -o libnvtx.so nvtx.c -ldl (nvtx.c: #include <nvtx3/nvToolsExt.h>; "
           "docs/nsys_run.md)")
    why = (f"no C compiler ({compiler} not found)" if shutil.which(compiler) is None
           else f"no NVTX headers (nvtx3/nvToolsExt.h) beside {nsys_path}" if include is None else None)
    if why:
        raise NsysError(f"this run is on a CPU, where torch has no NVTX, and no NVTX library can be built here: "
                        f"{why}; {how}", 2)
    # one library per header folder (per nsys installation), named by a stable digest of its path
    library = nvtx_cache_folder() / f"nvtx-{hashlib.sha1(str(include).encode()).hexdigest()[:12]}" / "libnvtx.so"
    if not library.is_file():
        say(f"this run is on a CPU: building the NVTX library it needs, once, into {library}")
        try:
            build_nvtx_library(include, library, compiler)
        except (OSError, subprocess.SubprocessError) as exc:
            detail = getattr(exc, "stderr", "") or str(exc)
            raise NsysError(f"building the NVTX library for a CPU run failed: {detail.strip()[:300]}; {how}", 2)
    return str(library)
