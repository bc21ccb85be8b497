"""Nsight Systems profiles of bench_e2e.py's measured steps, one report per configuration, turned into kernel tables
(kernel_tables.py) and one summary across them: the study's nsys_profile questions on a GPU (which kernels dominate
the forward pass and how often they run, how the matmul share changes from inference to a training step, softmax
vs the attention matmuls). `bash nsys_run.sh ...` runs this file after finding Python and nsys; every option, the
environment and the exit statuses are in `--help` (below), the method in docs/nsys_run.md.

    bash nsys_run.sh medium 256                      # one configuration: a training step (forward, backward, AdamW)
    bash nsys_run.sh medium 256 forward              # forward only; also forward-backward
    bash nsys_run.sh --size small medium --context-length 256 512 1024 --mode forward train   # 12 reports + summary
    bash nsys_run.sh                                 # the handout's nsys_profile plan; --dry-run lists it
    bash nsys_run.sh small 512 train -- --dtype bf16 --steps 5    # anything after -- goes to bench_e2e.py
    bash nsys_run.sh --backtrace small 128           # Python backtraces for CUDA calls (slower run)
    bash nsys_run.sh --handout 2025 xl 256           # sizes from the Spring 2025 handout (default: 2026)
    bash nsys_run.sh --pytorch=autograd-nvtx --cuda-memory-usage=true xl 128   # memory_profiling (f), 2026

One report per configuration, each from its own `nsys profile` run, in the order size, context (ascending), mode:
results/nsys/<size>_ctx<ctx>_<mode>[_<dtype>][_pytorch][_cudamem][_h2025].nsys-rep, with beside it the SQLite
export, the `nsys stats` CSVs (<report>_<name>.csv) and their log (<report>.stats.log), bench_e2e's record and
table of the run (<report>_e2e.jsonl, .md), the arguments it was made with (<report>.args) and the kernel tables
(<report>.md). Only the measured steps are captured: the capture range is bench_e2e's "measure" NVTX range. An
existing report made with the same arguments is reused; one made with others is kept and that configuration fails
(--force profiles again). After an out-of-memory error the larger contexts of that size and mode are skipped
(results.SkipAfterOOM, the rule of every sweep here). torch-free: bench_e2e.py runs in its own process under nsys.
Longer than a script here usually is (~490 lines) because it is a whole command line that used to be 464 lines of
bash: the options and their checks, the plan, and what happens to each configuration's files.
"""
from __future__ import annotations

import argparse
import contextlib
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import cli
import kernel_tables
import model_config
import nsys_tool
import results
from nsys_tool import NVTX_LIBRARY_ENV, NsysError
from profile_readers import nsys_report_path

PROG = "nsys_run.sh"
HERE = Path(__file__).resolve().parent
MODES = model_config.MODES
# the handouts' nsys_profile plans, for the axes not given: 2025 "every size of Table 1 x 128, 256, 512, 1024";
# 2026 "two sizes of your choice x three power-of-two contexts > 128, the largest the longest that fits"
DEFAULT_PLANS = {"2025": (["all"], [128, 256, 512, 1024]), "2026": (["small", "medium"], [256, 512, 1024])}
DEFAULT_MODES = ["forward", "train"]
# a size or dtype becomes part of a report's file name: nothing that could leave the results folder
PLAIN_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
# bench_e2e options that take one value per report; a second value would make bench_e2e sweep it
ONE_VALUE_OPTIONS = ("--dtype", "--compile", "--attn", "--optimizer", "--warmup")
OWN_OPTIONS_AFTER_DASHES = {  # given after --, these would reach bench_e2e, where they mean something else
    "--size": "give sizes, contexts and modes before -- (SIZE CTX [MODE] or --size ...), not --size after it",
    "--context-length": "give sizes, contexts and modes before -- (SIZE CTX [MODE] or --size ...), not "
                        "--context-length after it",
    "--mode": "give sizes, contexts and modes before -- (SIZE CTX [MODE] or --size ...), not --mode after it",
    "--handout": "give --handout before --, not after it (it also names the report)",
    "--dry-run": "give --dry-run before --: after it, bench_e2e.py would only list its plan and nsys record nothing",
    "--results-dir": "give --results-dir before --: bench_e2e's record is kept beside the report",
    "--out": "nsys_run.sh names the reports itself (<size>_ctx<ctx>_<mode>...); no --out after --",
}
# torch's NVTX ranges are unregistered strings, which an NVTX capture range only matches with this variable set
# in the profiled process; --env-var hands it to the process nsys launches.
REGISTER_ONLY = "NSYS_NVTX_PROFILER_REGISTER_ONLY"
EPILOG = f"""\
Environment: NSYS = the nsys binary (default: nsys on PATH); PYTHON = the interpreter that runs this and
bench_e2e.py (default: python3); CS336_HANDOUT = the handout when --handout is not given; {NVTX_LIBRARY_ENV} = an NVTX
library for runs on a CPU (torch has NVTX only with CUDA; unset, one is built with gcc from the NVTX headers that ship
with nsys, once, into ~/.cache/cs336-bench).
Exit status: 0 when every configuration has its tables; 2 for a usage error (here or refused by bench_e2e.py), a
missing or too old nsys, or no NVTX library for a CPU run; otherwise that of the first configuration that failed: the
profiled run's own status when it fails, 1 when it stopped at an OOM, nsys wrote no report or `nsys stats` no trace
CSV, or an existing report was kept. Ctrl-C: 130, finished reports kept."""


def say(message: str) -> None:
    results.progress(f"{PROG}: {message}")


# ---- the command line ----


def build_parser() -> argparse.ArgumentParser:
    p = cli.ArgParser(prog=PROG, description=__doc__.split("\n\nOne report")[0], epilog=EPILOG,
                      formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("config", nargs="*", metavar="SIZE CTX [MODE]",
                   help="one configuration (MODE: forward, forward-backward or train; default train)")
    p.add_argument("--size", nargs="+", help="sizes of the handout's Table 1 (or tiny, or all)")
    p.add_argument("--context-length", nargs="+", metavar="CTX", help="context lengths")
    p.add_argument("--mode", nargs="+", help="forward, forward-backward, train (default with these flags: forward "
                                             "train)")
    p.add_argument("--force", action="store_true", help="profile again even where a report exists, replacing it")
    p.add_argument("--no-skip", action="store_true",
                   help="after an OOM, still profile the larger contexts of that size and mode")
    p.add_argument("--dry-run", action="store_true",
                   help="list the configurations and what would happen to each; profile nothing")
    p.add_argument("--backtrace", "--python-backtrace", action="store_true",
                   help="collect Python + CUDA backtraces for CUDA API calls (--python-backtrace=cuda "
                        "--cudabacktrace=all); off by default since it slows the run noticeably")
    p.add_argument("--pytorch", metavar="VALUES",
                   help="passed to nsys profile (autograd-nvtx, autograd-shapes-nvtx, functions-trace, ...: PyTorch's "
                        "own NVTX labels); adds _pytorch to the report name. Not in nsys 2023.4")
    p.add_argument("--cuda-memory-usage", choices=("true", "false"), default="false",
                   help="true: passed to nsys profile (GPU memory usage over time); adds _cudamem to the name")
    p.add_argument("--results-dir", default="results", type=results.results_folder,
                   help="results root (reports go to its nsys/ folder)")
    cli.add_handout_arg(p)
    return p


def split_at_dashes(argv: list[str]) -> tuple[list[str], list[str]]:
    """(this script's arguments, bench_e2e.py's: everything after the first --)."""
    if "--" in argv:
        i = argv.index("--")
        return argv[:i], argv[i + 1:]
    return argv, []


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = build_parser()
    own, extra = split_at_dashes(sys.argv[1:] if argv is None else list(argv))
    # a bare --cuda-memory-usage means true (nsys's own spelling takes =true), and must not take the SIZE after it
    own = ["--cuda-memory-usage=true" if arg == "--cuda-memory-usage" else arg for arg in own]
    args = p.parse_intermixed_args(own)
    args.extra = extra
    cli.handout_or_exit(p, args)  # --handout, else $CS336_HANDOUT (stripped, as every script reads it)
    if args.pytorch is not None and not args.pytorch.strip():
        p.error("--pytorch needs a value, e.g. --pytorch=autograd-nvtx")
    if args.config:
        if args.size or args.context_length or args.mode:
            p.error("give SIZE CTX [MODE] or --size/--context-length/--mode, not both")
        if not 2 <= len(args.config) <= 3:
            p.error("usage: bash nsys_run.sh [options] SIZE CTX [MODE] [-- bench_e2e.py arguments]")
        args.size, args.context_length, args.mode = [args.config[0]], [args.config[1]], args.config[2:] or ["train"]
    plan_sizes, plan_contexts = DEFAULT_PLANS[args.handout]
    args.size = args.size or plan_sizes
    args.mode = list(dict.fromkeys(args.mode or DEFAULT_MODES))
    for size in args.size:
        if not PLAIN_NAME.fullmatch(size):
            p.error(f"SIZE must be a preset name such as tiny or 2.7B, got {size!r}")
    contexts = []
    for ctx in args.context_length or [str(c) for c in plan_contexts]:
        if not re.fullmatch(r"[1-9][0-9]*", ctx):
            p.error(f"CTX must be a positive integer, got {ctx!r}")
        contexts.append(int(ctx))
    args.context_length = sorted(set(contexts))  # ascending: an OOM skips the larger ones
    for mode in args.mode:
        if mode not in MODES:
            p.error(f"MODE must be forward, forward-backward or train, got {mode!r}")
    args.size = cli.sizes_or_exit(p, args, args.size)  # with the note when xl means another handout's xl
    args.dtype = check_extra(p, extra)
    return args


def check_extra(p: argparse.ArgumentParser, extra: list[str]) -> str:
    """bench_e2e's arguments: one value per report for the options that would otherwise sweep, none of this
    script's own. Returns the --dtype given ('' for none), which names the report."""
    dtype = ""
    for i, arg in enumerate(extra):
        name, _, value = arg.partition("=")
        if name in OWN_OPTIONS_AFTER_DASHES:
            p.error(OWN_OPTIONS_AFTER_DASHES[name])
        if name == "--dtype":
            dtype = value or (extra[i + 1] if i + 1 < len(extra) else "")
        if arg in ONE_VALUE_OPTIONS:
            values = extra[i + 1:i + 3]
            if len(values) == 2 and not any(v.startswith("-") for v in values):
                p.error(f"profile one {arg} at a time")
    if dtype not in ("", "fp32", "bf16", "fp16"):
        p.error(f"--dtype must be fp32, bf16 or fp16, got {dtype!r}")
    return dtype


# ---- the plan ----


@dataclass
class Configuration:
    size: str
    context: int
    mode: str
    report: Path  # <results>/nsys/<size>_ctx<ctx>_<mode><suffix>, the report's path without .nsys-rep

    @property
    def label(self) -> str:
        return f"{self.size} ctx={self.context} {self.mode}"

    def path(self, suffix: str) -> Path:
        return Path(f"{self.report}{suffix}")


class Sweep:
    """The configurations, how each is profiled, and what happens to the reports that exist."""

    def __init__(self, args: argparse.Namespace):
        self.args = args
        self.folder = Path(args.results_dir) / "nsys"
        backtrace = ["--cudabacktrace=all", "--python-backtrace=cuda"] if args.backtrace else []
        # nsys flags passed through, checked against this nsys's --help; they change what the report holds (and
        # the run's overhead), so they name it too: such a report never replaces nor stands in for a plain one
        self.pass_through = ([f"--pytorch={args.pytorch}"] if args.pytorch else []) + (
            ["--cuda-memory-usage=true"] if args.cuda_memory_usage == "true" else [])
        suffix = f"_{args.dtype}" if args.dtype not in ("", "fp32") else ""
        suffix += "_pytorch" if args.pytorch else ""
        suffix += "_cudamem" if args.cuda_memory_usage == "true" else ""
        suffix += f"_h{args.handout}" if args.handout != model_config.DEFAULT_HANDOUT else ""
        self.nsys_options = ["--trace=cuda,nvtx,osrt", "--capture-range=nvtx", "--nvtx-capture=measure",
                             "--capture-range-end=stop", f"--env-var={REGISTER_ONLY}=0", "--force-overwrite=true",
                             *backtrace, *self.pass_through]
        self.plan = [Configuration(size, ctx, mode, self.folder / f"{size}_ctx{ctx}_{mode}{suffix}")
                     for size in args.size for ctx in args.context_length for mode in args.mode]

    def app_args(self, config: Configuration) -> list[str]:
        """bench_e2e's arguments for one configuration (--in-process: the measured steps, their NVTX ranges and
        their kernels all live in the process nsys launched)."""
        return ["--size", config.size, "--context-length", str(config.context), "--mode", config.mode, "--nvtx",
                "--in-process", *self.args.extra, "--handout", self.args.handout]

    def args_line(self, config: Configuration) -> str:
        """What a report was made with, kept beside it as <report>.args: a report is reused only for the same
        line. (Shell-quoted words, each followed by a space: the shape the bash nsys_run.sh wrote, so its
        reports of plain arguments are still recognised.)"""
        words = ["nsys", "profile", *self.nsys_options, "--", "bench_e2e.py", *self.app_args(config)]
        return "".join(shlex.quote(word) + " " for word in words)

    def action(self, config: Configuration) -> str:
        """What happens to a configuration: profile, reuse (report and tables exist), tabulate (report without
        tables), kept (a report made with other arguments)."""
        if self.args.force or not config.path(".nsys-rep").is_file():
            return "profile"
        try:
            made_with = config.path(".args").read_text()
        except (OSError, UnicodeDecodeError):
            made_with = None
        if made_with != self.args_line(config):
            return "kept"
        if config.path(".md").is_file() and config.path(".md").stat().st_size and config.path("_e2e.jsonl").is_file():
            return "reuse"
        return "tabulate"


# ---- checks before anything is profiled ----


def check_with_bench_e2e(sweep: Sweep, show: bool) -> int:
    """bench_e2e.py --dry-run on the whole plan, once per mode (it takes one): the handout's sizes and every
    bench_e2e option checked, building nothing. The modes' checks run side by side (each imports torch, seconds
    apart); the first failing one's stderr is passed on, the others' dropped, so a bad option is said once. `show`:
    print the first mode's list. Returns the first failing check's exit status, else 0."""
    args = sweep.args
    if show:
        print(f"{PROG}: the arguments, checked by bench_e2e.py --dry-run (its list: mode {args.mode[0]}; every mode "
              "checked):", flush=True)
    checks = [subprocess.Popen([sys.executable, str(HERE / "bench_e2e.py"), "--size", *args.size, "--context-length",
                                *map(str, args.context_length), "--mode", mode, "--in-process", *args.extra,
                                "--handout", args.handout, "--dry-run"],
                               stdout=None if show and i == 0 else subprocess.DEVNULL, stderr=subprocess.PIPE,
                               text=True)
              for i, mode in enumerate(args.mode)]
    status = 0
    for check in checks:
        _, err = check.communicate()
        if status == 0:
            sys.stderr.write(err)
            status = check.returncode
    return status


def dry_run(sweep: Sweep) -> int:
    status = check_with_bench_e2e(sweep, show=True)
    if status:
        return status
    print(f"\n{PROG}: dry run: {len(sweep.plan)} configuration(s), one nsys profile each, in this order:")
    actions = {"profile": "profile", "reuse": "reuse the existing report",
               "tabulate": "make the tables of the existing report",
               "kept": "keep the existing report, made with other arguments: fails (--force replaces it)"}
    for i, config in enumerate(sweep.plan, 1):
        action = actions[sweep.action(config)]
        if sweep.args.force and config.path(".nsys-rep").exists():
            action = "profile again, replacing the report (--force)"
        print(f"  {i}. {config.label} -> {config.report}: {action}")
    if not sweep.args.no_skip:
        print("after an OOM, the larger contexts of that size and mode are skipped (--no-skip runs them)")
    print(f"each: nsys profile {' '.join(sweep.nsys_options)} --output=<report> {sys.executable} bench_e2e.py "
          f"{' '.join(sweep.app_args(sweep.plan[0]))} ...")
    print(f"NVTX ranges: torch's on a GPU; on a CPU the library named by {NVTX_LIBRARY_ENV}, else one built with gcc "
          f"into {nsys_tool.nvtx_cache_folder()} on the first run")
    if len(sweep.plan) > 1:
        print(f"then: the summary across them ({sweep.folder}/summary-<time>.md), as kernel_tables.py --summary")
    print("nothing was profiled or written (drop --dry-run to run them)")
    return 0


def missing_nsys_message(why: str, sweep: Sweep) -> str:
    first = sweep.plan[0]
    return (f"{PROG}: error: {why}.\n{nsys_tool.install_hint()}.\nWithout nsys, torch.profiler gives the same "
            f"tables:\n    python3 bench_e2e.py --size {first.size} --context-length {first.context} --mode "
            f"{first.mode} --profile --handout {sweep.args.handout} {' '.join(sweep.args.extra)}".rstrip())


def check_pass_through(nsys: nsys_tool.Nsys, flags: list[str]) -> None:
    """NsysError (2) naming the first flag this nsys's `nsys profile --help` does not list."""
    if not flags:
        return
    known = nsys.profile_options()
    for flag in flags:
        name = flag.split("=")[0]
        if not re.search(rf"(^|[\s,]){re.escape(name)}=", known):
            raise NsysError(f"{nsys.described} does not know {name} (not in its nsys profile --help); it needs a "
                            "newer Nsight Systems", 2)


# ---- one configuration ----


@dataclass
class Outcome:
    status: int  # the configuration's exit status
    kind: str  # ok, reused, OOM, kept, failed, refused (bench_e2e refused its arguments)
    failure: str = ""  # why, for the summary's runs column, when the record does not say it


def record_status(path: Path) -> str:
    """The status of the last record of a bench_e2e JSONL file ('' when there is none or it is unreadable)."""
    try:
        return str(kernel_tables.last_e2e_record(path).get("status", ""))
    except (kernel_tables.ProfileFormatError, OSError):
        return ""


def remove_files(config: Configuration) -> None:
    """A configuration's files, before it is profiled again, or after bench_e2e refused its arguments: none of
    them may outlive the new run."""
    for suffix in (".nsys-rep", ".sqlite", ".stats.log", ".md", ".args"):
        config.path(suffix).unlink(missing_ok=True)
    for report in nsys_tool.REPORTS:
        for name in {report, nsys_tool.OLD_REPORT_NAMES[report]}:
            nsys_report_path(config.report, name).unlink(missing_ok=True)
    for kept in config.report.parent.glob(f"{glob_escape(config.report.name)}_e2e*"):
        kept.unlink()


def glob_escape(name: str) -> str:
    return re.sub(r"([*?[])", r"[\1]", name)


def run_under_nsys(sweep: Sweep, nsys: nsys_tool.Nsys, config: Configuration, env: dict[str, str]) -> int:
    """`nsys profile` of bench_e2e.py for one configuration. bench_e2e writes its record into a temporary folder
    (its results go to <dir>/e2e/<stem>.*); every file of it is kept beside the report as <report>_e2e.*, and the
    run's own "wrote ..." lines are shown with those paths, never the temporary one."""
    with tempfile.TemporaryDirectory(prefix="nsys_run-") as tmp:
        app = [sys.executable, str(HERE / "bench_e2e.py"), *sweep.app_args(config), "--results-dir", tmp,
               "--out", "e2e"]
        say(f"profiling {config.label}: bench_e2e.py {' '.join(sweep.app_args(config))}")
        staged, kept = f"{tmp}/e2e/e2e", f"{config.report}_e2e"
        with subprocess.Popen([nsys.path, "profile", *sweep.nsys_options, f"--output={config.report}", *app],
                              stdout=subprocess.PIPE, env=env) as proc:
            for line in proc.stdout:  # nsys's and bench_e2e's output, line by line as it comes
                results.emit(line.decode(errors="replace").replace(staged, kept).rstrip("\n"))
        for made in sorted(Path(tmp, "e2e").glob("e2e*")):
            shutil.copyfile(made, f"{config.report}_{made.name}")
        return proc.returncode


def profile_one(sweep: Sweep, nsys: nsys_tool.Nsys, config: Configuration, env: dict[str, str]) -> Outcome:
    """Profile (or reuse) one configuration, export its report and make its tables."""
    action = sweep.action(config)
    if action == "kept":
        say(f"error: {config.report}.nsys-rep exists, made with other arguments than these (see "
            f"{config.report}.args, if any); it is kept: --force profiles this configuration again, replacing it")
        return Outcome(1, "kept", "kept: made with other arguments (--force replaces it)")
    if action == "reuse":
        say(f"reusing {config.report}.nsys-rep, made with the same arguments (--force profiles it again)")
        results.emit(config.path(".md").read_text().rstrip("\n"))
        return Outcome(0, "reused")
    oom = False
    if action == "profile":
        remove_files(config)
        config.path(".args").write_text(sweep.args_line(config))
        try:
            status = run_under_nsys(sweep, nsys, config, env)
        except KeyboardInterrupt:  # what nsys wrote of an interrupted run is partial: not a report to reuse
            remove_files(config)
            raise
        said = record_status(config.path("_e2e.jsonl"))
        oom = results.is_oom_status(said)
        if status == 2:  # bench_e2e's usage error: a user mistake, and every configuration would fail alike
            remove_files(config)
            say("error: the profiled bench_e2e.py refused its arguments (exit status 2); nothing of this "
                "configuration was kept")
            return Outcome(2, "refused")
        if status != 0:
            say(f"the profiled run failed with exit status {status}")
            return Outcome(status, "OOM" if oom else "failed", "" if said else
                           f"failed: the profiled run's exit status was {status}")
        if not config.path(".nsys-rep").is_file():
            # bench_e2e exits 0 when its configuration fails (a failure is a row): its record says why
            said_text = f'the profiled run recorded "status": "{said}"' if said else \
                "the 'measure' range never started"
            say(f"nsys wrote no {config.report}.nsys-rep: {said_text}")
            return Outcome(1, "OOM" if oom else "failed",
                           "" if said else "failed: nsys wrote no report (the measure range never started)")
    else:
        say(f"{config.report}.nsys-rep exists, made with the same arguments: making its tables")
        oom = results.is_oom_status(record_status(config.path("_e2e.jsonl")))
    try:
        for note in nsys_tool.export_csvs(nsys, config.path(".nsys-rep"), config.report, config.path(".stats.log")):
            say(f"note: {note}")
    except NsysError as exc:
        say(f"error: {exc}")
        return Outcome(exc.status, "OOM" if oom else "failed", f"failed: {exc}")
    table_args = [str(config.report), "--md", str(config.path(".md"))]
    if config.path("_e2e.jsonl").is_file():
        table_args += ["--e2e-jsonl", str(config.path("_e2e.jsonl"))]
    status = kernel_tables.main(table_args)
    if status:
        return Outcome(status, "OOM" if oom else "failed")
    results.emit(f"report: {config.report}.nsys-rep (open it with nsys-ui, the Nsight Systems GUI)")
    return Outcome(0, "ok")


# ---- every configuration, then the summary ----


def run_sweep(sweep: Sweep, nsys: nsys_tool.Nsys, env: dict[str, str]) -> int:
    """Every configuration in order, a failure losing none of the others; then the summary. Returns the exit
    status: the first failure's, 0 when every configuration has its tables."""
    multi, exit_status = len(sweep.plan) > 1, 0
    statuses: dict[str, str] = {}  # report -> why it has no tables, for the summary
    skip = results.SkipAfterOOM(enabled=not sweep.args.no_skip)
    created = [folder for folder in (sweep.folder, *sweep.folder.parents) if not folder.exists()]
    sweep.folder.mkdir(parents=True, exist_ok=True)
    for i, config in enumerate(sweep.plan, 1):
        reason = skip.reason((config.size, config.mode), "context_length", config.context)
        if reason:
            say(f"{config.label}: {reason} (--no-skip profiles it anyway)")
            statuses[str(config.report)] = reason
            continue
        if multi:
            say(f"configuration {i}/{len(sweep.plan)}: {config.label}")
        outcome = profile_one(sweep, nsys, config, env)
        if outcome.kind == "refused":  # wrong for every configuration: no summary, and no folder made for it
            for folder in created:
                with contextlib.suppress(OSError):
                    folder.rmdir()  # only when empty
            return 2
        skip.record((config.size, config.mode), config.context, outcome.kind)  # kind "OOM": the record's status
        exit_status = exit_status or outcome.status
        if outcome.failure:
            statuses[str(config.report)] = outcome.failure
    if multi:
        kernel_tables.write_summary([str(c.report) for c in sweep.plan], statuses, sweep.args.results_dir)
    return exit_status


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    sweep = Sweep(args)
    if args.dry_run:
        return dry_run(sweep)
    if len(sweep.plan) > 1:  # a mistyped option fails in seconds, not after the first hour of a sweep
        status = check_with_bench_e2e(sweep, show=False)
        if status:
            return status
    found, why = nsys_tool.find_nsys()
    if found is None:
        print(missing_nsys_message(why, sweep), file=sys.stderr)
        return 2
    env = {**os.environ, REGISTER_ONLY: "0"}
    try:
        nsys = nsys_tool.Nsys.probe(found)
        nsys.check_reports()
        check_pass_through(nsys, sweep.pass_through)
        if any(sweep.action(config) == "profile" for config in sweep.plan):
            library = nsys_tool.nvtx_library_for_cpu(nsys.path, args.extra, say)
            if library:
                env[NVTX_LIBRARY_ENV] = library
    except NsysError as exc:
        say(f"error: {exc}")
        return exc.status
    try:
        return run_sweep(sweep, nsys, env)
    except KeyboardInterrupt:
        say("interrupted; finished reports are kept")
        return 130


if __name__ == "__main__":
    sys.exit(main())
