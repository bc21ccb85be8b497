"""Smoke tests across the whole toolkit: every script answers --help, also from a folder of impostors named as our
modules, importing does no work, and the model, loss and AdamW together actually learn."""
import importlib
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from model import TransformerLM, cross_entropy
from results import ModelConfig
from optim import AdamW

HERE = Path(__file__).resolve().parent
# every experiment script: a file here, not a test, that runs as __main__
SCRIPTS = sorted(p.name for p in HERE.glob("*.py")
                 if not p.name.startswith("test_") and '\nif __name__ == "__main__":' in p.read_text())


@pytest.fixture(scope="module")
def impostors(tmp_path_factory):
    """A student's folder holding a file named as each of our modules (and torch's): importing one leaves a mark."""
    folder = tmp_path_factory.mktemp("impostors")
    for name in [p.stem for p in HERE.glob("*.py")] + ["torch", "numpy", "tabulate"]:
        (folder / f"{name}.py").write_text(f"open('marks', 'a').write('{name} ')\nraise SystemExit('impostor')\n")
    return folder


# One interpreter with the path `python3 <this folder>/<script>.py` starts with (the script's folder first, the
# working directory nowhere) imports torch, then forks a child per script, which runs it as __main__ with --help:
# each imports our modules afresh, as its own interpreter would, but not torch again (seconds each).
HELP_FROM_EACH_SCRIPT = """
import os, runpy, sys, traceback
here, out, scripts = sys.argv[1], sys.argv[2], sys.argv[3:]
sys.path[0] = here
import torch
for script in scripts:
    if pid := os.fork():
        os.waitpid(pid, 0)
        continue
    code = 1
    try:
        fd = os.open(os.path.join(out, script), os.O_WRONLY | os.O_CREAT | os.O_EXCL)
        os.dup2(fd, 1), os.dup2(fd, 2)
        sys.argv = [os.path.join(here, script), "--help"]
        runpy.run_path(sys.argv[0], run_name="__main__")
        code = 0
    except SystemExit as exit:  # as the interpreter reads it: None is 0, a message is printed and is 1
        if exit.code is None or isinstance(exit.code, int):
            code = exit.code or 0
        else:
            print(exit.code, file=sys.stderr)
    except BaseException:
        traceback.print_exc()
    finally:
        sys.stdout.flush(), sys.stderr.flush()
        print(f"exit {code}", flush=True)
        os._exit(0)
"""


def test_every_script_answers_help_from_a_folder_of_impostors(impostors, tmp_path):
    assert {"bench_e2e.py", "bench_ddp.py", "leaderboard.py", "study.py"} <= set(SCRIPTS)  # the scripts were found
    done = subprocess.run([sys.executable, "-c", HELP_FROM_EACH_SCRIPT, str(HERE), str(tmp_path), *SCRIPTS],
                          cwd=impostors, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    answers = {script: (tmp_path / script).read_text() for script in SCRIPTS}
    refused = {script: out[-300:] for script, out in answers.items() if not out.endswith("exit 0\n") or "usage:"
               not in out or ("--fmt" not in out and script not in ("study.py", "runner.py"))}
    # every script that prints tables takes any tabulate format (the study writes its writeup instead; runner.py is
    # nsys_run.sh's sweep, whose tables are markdown beside each report)
    assert not refused, refused
    assert not (impostors / "marks").exists(), (impostors / "marks").read_text()


@pytest.mark.parametrize("module", [s.removesuffix(".py") for s in SCRIPTS] + ["common", "model", "optim", "runner",
                                                                                "results", "report", "parallel", "study"])
def test_import_does_no_work(module, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # a script that wrote results at import would create ./results here
    importlib.import_module(module)
    assert not (tmp_path / "results").exists()


def test_model_loss_and_adamw_learn_a_fixed_batch():
    torch.manual_seed(0)
    cfg = ModelConfig(d_model=64, d_ff=128, num_layers=2, num_heads=4, vocab_size=50, context_length=16)
    model = TransformerLM(cfg)
    opt = AdamW(model.parameters(), lr=3e-3)
    tokens = torch.randint(0, cfg.vocab_size, (4, 16))
    targets = torch.roll(tokens, -1, dims=1)
    losses = []
    for _ in range(60):
        loss = cross_entropy(model(tokens), targets)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.item())
    assert losses[0] > 3.0  # about log(50) at random init
    assert losses[-1] < 0.5 * losses[0]  # it memorises the batch


# ---- the docs: every name they mention exists, every command of the README's tables runs ----

DOCS = [HERE / "README.md", HERE / "results" / "README.md", *sorted((HERE / "docs").glob("*.md"))]
# Files the docs name that are not ours: a student's own modules, given as examples, and the CI's nsys fetcher.
NOT_OURS = {"my_lm.py", "my_factory.py", "my_flash.py", "my_optim.py", "flash_pytorch.py", "get-nsys.sh",
            "adapters.py"}
# Modules this toolkit had before it was folded into a dozen files: a doc that names one is out of date.
RETIRED = {"sweep", "isolation", "search", "stats", "cli", "model_config", "user_code", "attention_impls",
           "attention_check", "kernel_timing", "profile_readers", "profile_tables", "kernel_categories", "nsys_tool",
           "nsys_sweep", "memory_snapshot", "lm_memory", "figures", "e2e_tables", "attention_tables", "memory_tables",
           "precision_tables"}
FILE_SUFFIXES = {"py", "sh", "md", "jsonl", "json", "tex", "png", "html", "pickle", "csv", "sqlite", "args", "log"}


def defined_names(path: Path) -> set[str]:
    """Top-level names of a module (functions, classes, assignments, imports), read from its source: no import."""
    import ast
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and node.col_offset == 0:
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)) and node.col_offset == 0:
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names.update(n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name))
        elif isinstance(node, (ast.Import, ast.ImportFrom)) and node.col_offset == 0:
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
    return names


def test_every_file_and_function_the_docs_name_exists():
    import re
    ours = {p.stem for p in HERE.glob("*.py")} - RETIRED
    reference = re.compile(r"(?<![\w./:~-])(" + "|".join(sorted(ours | RETIRED)) + r")\.([A-Za-z_]\w*)(?![\w-])")
    missing = []
    for doc in DOCS:
        text = doc.read_text()
        for name in re.findall(r"(?<![\w.-])(?:[\w.~-]*/)*([A-Za-z_][\w-]*\.(?:py|sh))\b", text):
            if name not in NOT_OURS and (name.removesuffix(".py") in RETIRED or not (HERE / name).is_file()):
                missing.append(f"{doc.name}: {name}")
        for module, attr in reference.findall(text):
            if attr in FILE_SUFFIXES:
                continue
            if module in RETIRED or attr not in defined_names(HERE / f"{module}.py"):
                missing.append(f"{doc.name}: {module}.{attr}")
    assert not missing, "named in the docs but not in the code: " + ", ".join(sorted(set(missing)))


def test_the_gpu_tests_name_only_what_exists():
    """test_gpu.py runs only where a GPU is lent: on a CPU, check at least that what it calls of ours exists."""
    import ast
    tree = ast.parse((HERE / "test_gpu.py").read_text())
    ours = {p.stem for p in HERE.glob("*.py")}
    modules = {a.asname or a.name: a.name for node in ast.walk(tree) if isinstance(node, ast.Import)
               for a in node.names if a.name in ours}
    missing = [f"{node.value.id}.{node.attr} (line {node.lineno})" for node in ast.walk(tree)
               if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id in modules
               and not hasattr(importlib.import_module(modules[node.value.id]), node.attr)]
    assert not missing, "test_gpu.py names what is gone: " + ", ".join(missing)


def heading_anchor(heading: str) -> str:
    """GitHub's anchor of a markdown heading: lower case, punctuation dropped, spaces as hyphens."""
    import re
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def test_every_link_between_the_docs_lands():
    import re
    broken = []
    for doc in DOCS:
        for target, anchor in re.findall(r"\]\(([^)#\s]*)(?:#([^)\s]+))?\)", doc.read_text()):
            if target.startswith("http"):
                continue
            path = (doc.parent / target).resolve() if target else doc
            if not path.exists():
                broken.append(f"{doc.name}: {target}")
            elif anchor and path.suffix == ".md":
                headings = re.findall(r"^#+ (.+)$", path.read_text(), flags=re.MULTILINE)
                if anchor not in {heading_anchor(h) for h in headings}:
                    broken.append(f"{doc.name}: {target}#{anchor}")
    assert not broken, "links that land nowhere: " + ", ".join(broken)


def readme_table_commands() -> list[list[str]]:
    """Every command in a table of the README (a `python3 ...`, `bash ...` or `torchrun ...` code span), as argv."""
    import re
    import shlex
    commands = []
    for line in (HERE / "README.md").read_text().splitlines():
        if line.startswith("|"):
            for span in re.findall(r"`([^`]+)`", line):
                if re.match(r"(python3|bash|torchrun) ", span):
                    commands.append(shlex.split(span))
    return commands


def as_dry_run(argv: list[str], files: Path) -> tuple[str, list[str]]:
    """(script, its arguments) with the README's placeholders filled in; torchrun's ranks become --world-size; a
    CUDA device on a machine without one becomes the CPU (the commands are for a GPU, the test runs anywhere)."""
    placeholders = {"MODULE:CALLABLE": "my_flash:flash", "MODULE:CLASS": "my_optim:AdamW",
                    "PICKLE": str(files / "snapshot.pickle"), "REPORT.nsys-rep": str(files / "report.nsys-rep")}
    if not torch.cuda.is_available():
        placeholders["cuda"] = "cpu"
    argv = [placeholders.get(a, a) for a in argv]
    if argv[0] == "torchrun":
        ranks = argv[argv.index("--nproc-per-node") + 1]
        argv = ["python3", *argv[argv.index("--nproc-per-node") + 2:], "--world-size", ranks]
    assert argv[0] in ("python3", "bash"), argv
    return argv[1], argv[2:]


def test_every_command_of_the_readme_tables_runs_dry(capsys, tmp_path):
    """The study and figure tables' commands, each checked the cheapest way that still runs its script's own code:
    --dry-run in this process where the script has one, else its parse_args."""
    import kernel_tables
    import report
    import runner
    import study
    import bench_e2e, bench_attention, bench_comm, bench_ddp, leaderboard, mem_profile, precision_demo  # noqa: E401
    import toy_autocast
    dry_run = {"bench_e2e.py": bench_e2e.main, "bench_attention.py": bench_attention.main,
               "bench_comm.py": bench_comm.main,
               "leaderboard.py": leaderboard.main, "mem_profile.py": mem_profile.main, "study.py": study.main,
               "nsys_run.sh": runner.nsys_run_main}
    parse_only = {"report.py": report.parse_args, "kernel_tables.py": kernel_tables.parse_args,
                  "precision_demo.py": precision_demo.parse_args, "toy_autocast.py": toy_autocast.parse_args,
                  "mem_profile.py --analyze": mem_profile.parse_args, "bench_ddp.py": bench_ddp.parse_args}
    commands = readme_table_commands()
    assert len(commands) >= 20  # the tables were found
    for placeholder in ("snapshot.pickle", "report.nsys-rep"):
        (tmp_path / placeholder).touch()
    failed = []
    for command in commands:
        capsys.readouterr()
        script, args = as_dry_run(command, tmp_path)
        key = f"{script} --analyze" if "--analyze" in args else script
        try:
            if key in parse_only:
                parse_only[key](args)
                code = 0
            else:
                code = dry_run[script]([*args, "--dry-run"])
        except SystemExit as exit:
            code = exit.code
        if code not in (0, None):
            failed.append(f"{' '.join(command)} (exit {code}): {capsys.readouterr().err.strip()[-300:]}")
    assert not failed, "\n".join(failed)
