"""report.py: one rendering path (a saved run re-rendered is the run's own file, byte for byte, for every script),
merges with a run column in every table, figures that skip what they cannot draw, bad input in one line, and
nothing lost on a full disk or a Ctrl-C while the report is written. CPU, tiny shapes, scripts run in process."""
from __future__ import annotations

import errno
import json
import os
import re
import shutil
import subprocess
import sys
from contextlib import redirect_stdout
from io import StringIO
from pathlib import Path

import pytest

import attention_tables
import bench_attention
import bench_e2e
import e2e_tables
import figures
import mem_profile
import precision_demo
import report
import results
import toy_autocast

HERE = Path(__file__).resolve().parent
TINY_MODEL = ["--d-model", "64", "--d-ff", "128", "--num-layers", "2", "--num-heads", "4", "--vocab-size", "256",
              "--context-length", "32", "--batch-size", "2"]
# the smallest run of each script (seconds in process); bench_e2e's compares naive and sdpa attention
SCRIPTS = {
    "bench_e2e": (bench_e2e.main, "e2e", ["--size", "tiny", "--d-model", "64", "--num-heads", "4", "--d-ff", "128",
                                          "--num-layers", "1", "--vocab-size", "256", "--context-length", "16",
                                          "--steps", "2", "--warmup", "0", "--device", "cpu", "--in-process",
                                          "--attn", "naive", "sdpa"]),
    "bench_attention": (bench_attention.main, "attention", ["--impl", "naive", "sdpa", "--seq-len", "16", "--d", "8",
                                                            "--batch-size", "1", "--iters", "2", "--warmup", "0",
                                                            "--device", "cpu", "--in-process"]),
    "mem_profile": (mem_profile.main, "memory", ["--size", "tiny", "--context-length", "16", "--mode", "forward",
                                                 "--device", "cpu"]),
    "precision_demo": (precision_demo.main, "precision", ["--count", "20"]),
    "toy_autocast": (toy_autocast.main, "precision", ["--device", "cpu"]),
}
RUN_FORMATS = ["latex_booktabs", "html", "plain"]  # a run writes its .md (github) and the file of its --fmt


def run_script(main, argv: list[str]) -> str:
    buffer = StringIO()
    with redirect_stdout(buffer):
        assert main(argv) == 0
    return buffer.getvalue()


def run_report(argv: list[str], capsys) -> tuple[int, str, str]:
    """(exit status, stdout, stderr) of report.main, a usage error (SystemExit) included."""
    try:
        status = report.main(argv)
    except SystemExit as exc:
        status = exc.code
    out = capsys.readouterr()
    return status, out.out, out.err


def markdown_tables(text: str) -> list[list[dict[str, str]]]:
    """Every GitHub-markdown table in `text`, as rows of {header: cell} (cells stripped)."""
    tables, lines = [], text.splitlines()
    i = 0
    while i < len(lines):
        if lines[i].startswith("|") and i + 1 < len(lines) and lines[i + 1].startswith("|-"):
            headers = [h.strip() for h in lines[i].strip("|").split("|")]
            i += 2
            rows = []
            while i < len(lines) and lines[i].startswith("|"):
                rows.append(dict(zip(headers, (c.strip() for c in lines[i].strip("|").split("|")))))
                i += 1
            tables.append(rows)
        else:
            i += 1
    return tables


def records_of(jsonl: Path) -> list[dict]:
    return [json.loads(line) for line in jsonl.read_text().splitlines()]


def write_jsonl(path: Path, records: list) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


@pytest.fixture(scope="module")
def script_runs(tmp_path_factory):
    """Every script run once per format of RUN_FORMATS: {(script, fmt): (stdout, folder of its files)}."""
    made = {}
    for script, (main, subdir, argv) in SCRIPTS.items():
        for fmt in RUN_FORMATS:
            folder = tmp_path_factory.mktemp(f"{script}-{fmt}")
            out = run_script(main, argv + ["--fmt", fmt, "--results-dir", str(folder), "--out", "run"])
            made[script, fmt] = out, folder / subdir
    return made


@pytest.fixture(scope="module")
def e2e_run(tmp_path_factory):
    """fp32 and bf16, warm-up 0 and 1, 2 timed steps: (printed output, jsonl path)."""
    folder = tmp_path_factory.mktemp("e2e")
    out = run_script(bench_e2e.main, TINY_MODEL + ["--dtype", "fp32", "bf16", "--warmup", "0", "1", "--steps", "2",
                                                   "--device", "cpu", "--in-process", "--results-dir", str(folder),
                                                   "--out", "sweep"])
    return out, folder / "e2e" / "sweep.jsonl"


@pytest.fixture(scope="module")
def attention_run(tmp_path_factory):
    """naive and sdpa at two lengths, the longest naive one an injected OOM: (printed output, jsonl path)."""
    folder = tmp_path_factory.mktemp("attention")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("BENCH_INJECT_FAULT", "oom:impl=naive,seq_len=32")
        out = run_script(bench_attention.main, ["--impl", "naive", "sdpa", "--seq-len", "16", "32", "--d", "8",
                                                "--batch-size", "1", "--iters", "2", "--warmup", "0", "--device",
                                                "cpu", "--in-process", "--results-dir", str(folder), "--out", "att"])
    return out, folder / "attention" / "att.jsonl"


@pytest.fixture(scope="module")
def memory_run(tmp_path_factory):
    folder = tmp_path_factory.mktemp("memory")
    out = run_script(mem_profile.main, ["--size", "tiny", "--context-length", "16", "32", "--mode", "forward", "train",
                                        "--checkpoint", "0", "1", "--device", "cpu", "--in-process",
                                        "--results-dir", str(folder), "--out", "mem"])
    return out, folder / "memory" / "mem.jsonl"


@pytest.fixture(scope="module")
def precision_run(script_runs):
    out, folder = script_runs["precision_demo", "plain"]
    return out, folder / "run.jsonl"


# ---- one rendering path: the re-render is the run's own file ----


@pytest.mark.parametrize("fmt", ["github"] + RUN_FORMATS)
@pytest.mark.parametrize("script", list(SCRIPTS))
def test_a_rerender_is_the_file_the_run_wrote_byte_for_byte(script, fmt, script_runs, tmp_path, capsys):
    out, folder = script_runs[script, "latex_booktabs" if fmt == "github" else fmt]
    status, printed, err = run_report([str(folder / "run.jsonl"), "--fmt", fmt, "--results-dir", str(tmp_path)],
                                      capsys)
    assert status == 0, err
    suffix = results.report_suffix(fmt)
    again = tmp_path / "report" / f"run{suffix}"
    assert again.read_bytes() == (folder / f"run{suffix}").read_bytes()
    assert (tmp_path / "report" / "run.md").read_bytes() == (folder / "run.md").read_bytes()
    if fmt != "github":  # what the run printed at the end is what report.py prints
        assert printed.split("\nwrote ")[0] == out.split("\nwrote ")[0]


def test_the_tex_of_an_attention_sweep_labels_its_rows(script_runs):
    _, folder = script_runs["bench_e2e", "latex_booktabs"]
    tex = (folder / "run.tex").read_text()
    results_table = re.findall(r"\\begin\{tabular\}.*?\\end\{tabular\}", tex, re.S)[1]
    header, *rows = [[cell.strip(" \\") for cell in line.split("&")] for line in results_table.splitlines()
                     if "&" in line]
    attn = header.index("attn")  # the column that tells the two rows of each size apart
    assert sorted(row[attn] for row in rows) == ["naive", "sdpa"]


def test_the_sweep_builds_its_report_once_per_row(monkeypatch, tmp_path):
    calls = []
    real = e2e_tables.render_report
    monkeypatch.setitem(report.RENDERERS, "bench_e2e",
                        report.Renderer(lambda *a: calls.append(1) or real(*a), lambda r: e2e_tables.COLUMNS))
    _, _, argv = SCRIPTS["bench_e2e"]
    run_script(bench_e2e.main, argv + ["--results-dir", str(tmp_path)])
    assert len(calls) == 2  # two configurations, the markdown after each; the end prints what was saved


def test_columns_choose_and_order(e2e_run, tmp_path, capsys):
    _, jsonl = e2e_run
    status, out, _ = run_report([str(jsonl), "--results-dir", str(tmp_path), "--columns", "step ms", "dtype",
                                 "warmup"], capsys)
    assert status == 0
    table = markdown_tables(out)[1]
    assert list(table[0]) == ["step ms", "dtype", "warmup"]
    assert [row["dtype"] for row in table] == ["fp32", "bf16", "fp32", "bf16"]  # each warm-up's variants together


def test_readers_stay_light_and_load_no_script():
    code = "import sys, report, figures; sys.exit('torch' in sys.modules or 'bench_e2e' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], cwd=HERE, timeout=60).returncode == 0
    sources = [p for p in HERE.glob("*.py") if not p.name.startswith("test_")]
    # importlib only where the student's own code is loaded (MODULE:CALLABLE on the command line): never a script
    assert [p.name for p in sources if "importlib" in p.read_text()] == ["user_code.py"]


# ---- merges: a run column in every table, nothing dropped ----


def test_a_merge_of_two_runs_of_one_comparison_shows_both_pairs(script_runs, tmp_path, capsys):
    first, second = (script_runs["bench_e2e", fmt][1] / "run.jsonl" for fmt in ("html", "plain"))
    status, out, err = run_report([str(first), str(second), "--results-dir", str(tmp_path)], capsys)
    assert status == 0, err
    tables = markdown_tables(out)
    assert tables and all(list(table[0])[0] == "run" for table in tables)  # config, results, comparison
    names = [str(first), str(second)]  # both stems are "run": each run is named by its path
    comparison = next(t for t in tables if "step speed-up: sdpa" in t[0])
    assert [row["run"] for row in comparison] == names
    for row in comparison:
        expected = [r for r in records_of(Path(row["run"])) if r["config"]["attn"] == "naive"][0]["step_ms_mean"]
        assert float(row["step ms: naive"]) == pytest.approx(expected, abs=0.006)
    runs = [report.read_run(name) for name in names]
    report.name_runs(runs)
    figure = figures.figures("bench_e2e", report.merged_records(runs))["speedup"]
    assert len(figure.axes[0].patches) == 2 * 3  # two pairs, three phases each


def test_merge_of_two_files_has_a_run_column_and_compares_across_them(e2e_run, tmp_path, capsys):
    _, jsonl = e2e_run
    # as if from two runs: records of different runs were not measured as pairs
    records = [{k: v for k, v in r.items() if k != "pairing"} for r in records_of(jsonl)]
    fp32 = write_jsonl(tmp_path / "monday.jsonl", [r for r in records if r["config"]["dtype"] == "fp32"])
    bf16 = write_jsonl(tmp_path / "tuesday.jsonl", [r for r in records if r["config"]["dtype"] == "bf16"])
    status, out, err = run_report([str(fp32), str(bf16), "--results-dir", str(tmp_path)], capsys)
    assert status == 0, err
    tables = markdown_tables(out)
    assert all(list(table[0])[0] == "run" for table in tables)
    main_table = next(t for t in tables if "step ms" in t[0])
    assert [row["run"] for row in main_table] == ["monday", "monday", "tuesday", "tuesday"]
    assert "monday: device:" in out and "tuesday: device:" in out
    speedups = next(t for t in tables if "step speed-up: bf16" in t[0])  # across the two files: one per warm-up
    by_run = {(r["run"], r["dtype"], r["warmup"]): float(r["step ms"]) for r in main_table}
    assert [row["run"] for row in speedups] == ["monday, tuesday"] * 2
    for row in speedups:  # baseline time / variant time, from the two files' rows, both printed to 2 decimals
        expected = by_run[("monday", "fp32", row["warmup"])] / by_run[("tuesday", "bf16", row["warmup"])]
        assert float(row["step speed-up: bf16"].rstrip("x")) == pytest.approx(expected, rel=0.01, abs=0.006)
    assert (tmp_path / "report" / "monday-merged-2.md").is_file()
    # --columns chooses the columns, but a merge keeps its run column first: the rows stay told apart
    status, out, err = run_report([str(fp32), str(bf16), "--results-dir", str(tmp_path), "--columns", "step ms"],
                                  capsys)
    picked = next(t for t in markdown_tables(out) if "step ms" in t[0])
    assert status == 0 and list(picked[0]) == ["run", "step ms"], err


@pytest.mark.parametrize("script", ["bench_attention", "mem_profile", "precision_demo", "toy_autocast"])
def test_every_merged_table_has_a_run_column(script, script_runs, tmp_path, capsys):
    paths = [str(script_runs[script, fmt][1] / "run.jsonl") for fmt in ("html", "plain")]
    status, out, err = run_report([*paths, "--results-dir", str(tmp_path)], capsys)
    assert status == 0, err
    tables = markdown_tables(out)
    assert tables and all(list(table[0])[0] == "run" for table in tables)
    assert all({row["run"] for row in table} == set(paths) for table in tables)  # both runs' rows, every table


def test_merging_different_experiments_is_refused(e2e_run, precision_run, tmp_path, capsys):
    status, out, err = run_report([str(e2e_run[1]), str(precision_run[1]), "--results-dir", str(tmp_path)], capsys)
    assert status == 2 and out == ""
    assert err.count("\n") == 1
    assert "cannot merge records of different experiments: sweep is bench_e2e, run is precision_demo" in err


def test_experiment_is_read_from_the_record_or_inferred(e2e_run, attention_run, memory_run, script_runs):
    toy = script_runs["toy_autocast", "html"][1] / "run.jsonl"
    precision = script_runs["precision_demo", "html"][1] / "run.jsonl"
    for jsonl, name in ((e2e_run[1], "bench_e2e"), (attention_run[1], "bench_attention"),
                        (memory_run[1], "mem_profile"), (precision, "precision_demo"), (toy, "toy_autocast")):
        record = json.loads(jsonl.read_text().splitlines()[0])
        assert report.experiment_of(record, jsonl) == name
        del record["experiment"]  # records from before the field: known by their shape, wherever they are
        assert report.experiment_of(record, Path("elsewhere/x.jsonl")) == name


def test_old_toy_autocast_records_render(script_runs, tmp_path, capsys):
    old = [{k: v for k, v in r.items() if k != "experiment"}
           for r in records_of(script_runs["toy_autocast", "plain"][1] / "run.jsonl")]
    status, out, err = run_report([str(write_jsonl(tmp_path / "precision" / "toy_autocast-1.jsonl", old)),
                                   "--results-dir", str(tmp_path)], capsys)
    assert status == 0, err
    assert markdown_tables(out)[0][0]["tensor"] == "parameter fc1.weight (inside autocast)"


# ---- LaTeX ----


def test_latex_format_writes_a_tex_file_without_the_model_shape(e2e_run, tmp_path, capsys):
    _, jsonl = e2e_run
    status, out, _ = run_report([str(jsonl), "--results-dir", str(tmp_path), "--fmt", "latex_booktabs"], capsys)
    assert status == 0
    folder = tmp_path / "report"
    assert sorted(p.name for p in folder.iterdir()) == ["sweep.md", "sweep.tex"]
    assert "\\begin" not in (folder / "sweep.md").read_text() and "|" in (folder / "sweep.md").read_text()  # markdown
    tex = (folder / "sweep.tex").read_text()
    assert tex.count("\\begin{tabular}") == tex.count("\\end{tabular}") >= 3  # config, results, speed-ups
    in_table = False
    for line in tex.splitlines():
        in_table = in_table or line.startswith("\\begin{tabular}")
        if not in_table:
            assert not line.strip() or line.startswith("%"), line  # prose is a comment: nothing to break LaTeX
        elif "&" in line:
            assert line.rstrip().endswith("\\\\") and line.count("{") == line.count("}")
        in_table = in_table and not line.startswith("\\end{tabular}")
    config_table, results_table = re.findall(r"\\begin\{tabular\}.*?\\end\{tabular\}", tex, re.S)[:2]
    assert "d\\_model" in config_table  # the shape lives in the config table ...
    assert "d\\_model" not in results_table and "layers" not in results_table  # ... not again in the results
    assert "step ms" in results_table


@pytest.mark.skipif(shutil.which("pdflatex") is None, reason="no LaTeX installed")
def test_tex_file_compiles_in_a_minimal_document(e2e_run, tmp_path, capsys):
    _, jsonl = e2e_run
    assert run_report([str(jsonl), "--results-dir", str(tmp_path), "--fmt", "latex_booktabs"], capsys)[0] == 0
    doc = tmp_path / "doc.tex"
    doc.write_text("\\documentclass{article}\\usepackage{booktabs}\\begin{document}\n\\input{report/sweep.tex}\n"
                   "\\end{document}\n")
    out = subprocess.run(["pdflatex", "-interaction=nonstopmode", doc.name], cwd=tmp_path, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0 and "Undefined control sequence" not in out.stdout


# ---- figures ----


def check_figure(fig, path: Path) -> None:
    """Axes labelled, titled with the device and torch version, written as a non-empty PNG."""
    title = fig._suptitle.get_text()
    assert "torch 2." in title or "torch " in title
    for ax in fig.axes:
        if ax.has_data():
            assert ax.get_xlabel() and ax.get_ylabel()
    fig.savefig(path)
    assert path.stat().st_size > 1000


def test_e2e_figures(e2e_run, tmp_path):
    made = figures.figures("bench_e2e", records_of(e2e_run[1]))
    assert set(made) == {"phases", "speedup", "warmup"}
    for name, fig in made.items():
        check_figure(fig, tmp_path / f"{name}.png")
    phases_ax = made["phases"].axes[0]
    assert {t.get_text() for t in phases_ax.get_legend().get_texts()} >= {"forward", "backward", "optimizer"}
    warmup_ax = made["warmup"].axes[0]
    assert sorted(line.get_label() for line in warmup_ax.get_lines()) == ["warm-up 0", "warm-up 1"]
    assert all(len(line.get_xdata()) == 2 for line in warmup_ax.get_lines())  # one point per timed step


def test_eager_vs_compiled_speedup_bars_are_bench_e2e_comparison():
    """The bars are bench_e2e's comparison (baseline / variant over forward, forward+backward, step); made-up
    compiled records (a compile costs ~40 s on CPU), a failed variant has no bar but its status."""
    from test_bench_e2e import synthetic_record

    eager = synthetic_record(128, "fp32", (30.0, 60.0, 10.0, 100.0))
    eager["environment"].update(device="cuda", device_name="H100")
    compiled = {**synthetic_record(128, "fp32", (15.0, 40.0, 10.0, 65.0)), "environment": eager["environment"]}
    compiled["config"] = {**compiled["config"], "compile": True}
    oom = {**synthetic_record(128, "bf16", status="OOM"), "environment": eager["environment"]}
    found = e2e_tables.comparison([eager, compiled])
    assert found.variants == ["eager", "compiled"] and found.ratios == ["fwd", "fwd+bwd", "step"]
    fig = figures.plot_e2e_speedups([eager, compiled], [])
    assert "handout 2026" in fig._suptitle.get_text() and "H100" in fig._suptitle.get_text()
    assert [round(p.get_height(), 2) for p in fig.axes[0].patches] == [2.0, 1.64, 1.54]  # 30/15, 90/55, 100/65
    assert fig.axes[0].get_ylabel() == "speed-up over eager (x)"
    fig = figures.plot_e2e_speedups([eager, oom], [])  # fp32 vs bf16, the bf16 row out of memory
    assert [t.get_text() for t in fig.axes[0].texts] == ["OOM"] * 3
    assert figures.plot_e2e_speedups([eager], []) is None  # one variant: nothing to compare
    for record in (eager, compiled):  # a record without its handout (older runs): the title does not make one up
        record["config"] = {k: v for k, v in record["config"].items() if k != "handout"}
    assert "handout" not in figures.plot_e2e_speedups([eager, compiled], [])._suptitle.get_text()


def test_the_comparison_says_when_the_means_disagree_with_the_paired_speed_up(e2e_run):
    """20 interleaved rounds where bf16 is twice as fast in each, but one of its steps took 40x longer: the
    speed-up stays 2x, its interval excludes the ratio of the means, and the row says so."""
    fp32, bf16 = [r for r in records_of(e2e_run[1]) if r["config"]["warmup"] == 0]
    wild = [5.0] * 20
    wild[7] = 200.0
    for rec, step in ((fp32, [10.0] * 20), (bf16, wild)):
        for phase in ("forward", "backward", "optimizer"):
            rec[f"{phase}_ms"] = [s / 3 for s in step]
        rec["step_ms"] = step
        rec.update({f"{p}_ms_mean": sum(rec[f"{p}_ms"]) / 20 for p in ("forward", "backward", "optimizer", "step")})
        rec["pairing"] = {"group": "g", "mode": "steps", "rounds": [[i, i + 1] for i in range(20)]}
    (row,) = e2e_tables.comparison([fp32, bf16]).rows
    assert row["step speed-up: bf16"] == "2.00x" and row["step 95% CI: bf16"] == "2.00-2.00x"
    assert "ratio of the means outside the interval (a few slow steps pull a mean): " in row["notes"]
    assert f"step bf16 {10.0 / (295.0 / 20):.2f}x" in row["notes"]  # 0.68x: the table's means divided


def test_attention_figure_marks_the_oom(attention_run, tmp_path):
    made = figures.figures("bench_attention", records_of(attention_run[1]))
    fig = made["attention"]
    check_figure(fig, tmp_path / "attention.png")
    forward_ax = fig.axes[0]
    assert forward_ax.get_xscale() == "log" and forward_ax.get_yscale() == "log"
    assert {line.get_label() for line in forward_ax.get_lines()} == {"naive d=8", "sdpa d=8"}
    oom = [c for c in forward_ax.collections if c.get_label() == "OOM"]
    assert len(oom) == 1 and len(oom[0].get_offsets()) == 1
    # a sweep over --dtype fp32 bf16: each dtype its own line, never one line through both
    records = records_of(attention_run[1])
    both = records + [{**r, "config": {**r["config"], "dtype": "bf16"}} for r in records]
    fig = figures.figures("bench_attention", both)["attention"]
    assert {line.get_label() for line in fig.axes[0].get_lines()} == {
        f"{impl} d=8 {dtype}" for impl in ("naive", "sdpa") for dtype in ("fp32", "bf16")}
    assert all(len(line.get_xdata()) == len({x for x in line.get_xdata()}) for line in fig.axes[0].get_lines())


def test_attention_comparison_never_compares_across_batch_sizes(attention_run):
    records = [r for r in records_of(attention_run[1]) if r["status"] == "ok"]
    batch8 = [{**r, "config": {**r["config"], "batch_size": 8}} for r in records]
    table = attention_tables.comparison_table(records + batch8, ["naive", "sdpa"], "github")
    header, _, *rows = [[c.strip() for c in line.strip("|").split("|")] for line in table.splitlines()]
    assert "batch" in header and len(rows) == 2 * len({(r["config"]["seq_len"]) for r in records})
    assert {row[header.index("batch")] for row in rows} == {"1", "8"}


def test_memory_figures(memory_run, tmp_path):
    made = figures.figures("mem_profile", records_of(memory_run[1]))
    assert set(made) == {"memory_context", "memory_checkpoint"}
    for name, fig in made.items():
        check_figure(fig, tmp_path / f"{name}.png")
    (line,) = made["memory_context"].axes[0].get_lines()  # CPU: saved for backward only, fp32, no checkpointing
    assert list(line.get_xdata()) == [16, 32] and line.get_ydata()[1] > line.get_ydata()[0]
    lines = {line.get_label(): line for line in made["memory_checkpoint"].axes[0].get_lines()}
    saved = [line for label, line in lines.items() if label.startswith("saved for backward")]
    assert saved and all(line.get_ydata()[1] < line.get_ydata()[0] for line in saved)  # checkpointing keeps less...
    # ...and the predicted peak is drawn beside it (lm_memory.checkpoint_prediction), its smallest K named
    assert any(label.startswith("predicted peak") and "smallest at K = " in label for label in lines)
    # two optimizers (or models) in one run: a line each, never one line zigzagging between them
    records = records_of(memory_run[1])
    both = records + [{**r, "config": {**r["config"], "optimizer": "torch"}} for r in records]
    (ours, torchs) = figures.figures("mem_profile", both)["memory_context"].axes[0].get_lines()
    assert (ours.get_label(), torchs.get_label()) == ("saved for backward, fp32 ours", "saved for backward, fp32 torch")
    assert list(ours.get_xdata()) == list(torchs.get_xdata()) == [16, 32]


def test_e2e_bars_are_told_apart_by_every_setting_that_varies(e2e_run):
    records = records_of(e2e_run[1])
    theirs = [{**r, "config": {**r["config"], "model_factory": "my_model:build"}} for r in records]
    fig = figures.plot_e2e_phases(records + theirs, [])
    labels = [tick.get_text() for tick in fig.axes[0].get_xticklabels()]
    assert len(labels) == 8 and len(set(labels)) == 8, labels
    assert any("my_model:build" in label for label in labels) and any("our model" in label for label in labels)


def test_precision_partial_sums_and_figure(precision_run, tmp_path):
    records = records_of(precision_run[1])
    for r in records:
        counts = [n for n, _ in r["partial_sums"]]
        assert counts[0] == 1 and counts[-1] == 20 and counts == sorted(set(counts))
        assert r["partial_sums"][-1][1] == r["result"]  # the last partial sum is the table's result
    bf16 = next(r for r in records if r["case"] == "2-bf16")
    assert dict(bf16["partial_sums"])[1] == pytest.approx(0.01, rel=0.01)
    fig = figures.figures("precision_demo", records)["sums"]
    check_figure(fig, tmp_path / "sums.png")
    assert len(fig.axes[0].get_lines()) == len(records) + 1  # every case and the exact line


def test_plot_writes_pngs_beside_the_report(attention_run, tmp_path, capsys):
    status, out, _ = run_report([attention_run[1].as_posix(), "--results-dir", str(tmp_path), "--plot"], capsys)
    assert status == 0
    png = tmp_path / "report" / "att_attention.png"
    assert png.stat().st_size > 1000 and str(png) in out


def test_precision_demo_plot_flag(tmp_path):
    out = run_script(precision_demo.main, ["--count", "20", "--results-dir", str(tmp_path), "--out", "p", "--plot"])
    png = tmp_path / "precision" / "p_sums.png"
    assert png.stat().st_size > 1000 and str(png) in out


def test_one_timed_step_and_a_search_plot_what_they_can(tmp_path, capsys):
    """--plot after a run with one timed step (no std): the table first, the figure without error bars and a
    note; report.py --plot on a --context-length max search's records (one step each, the answers after them)."""
    _, _, argv = SCRIPTS["bench_e2e"]
    argv = [a for a in argv if a not in ("naive", "sdpa", "--attn")]
    argv[argv.index("--steps") + 1] = "1"
    argv[argv.index("--context-length") + 1:argv.index("--context-length") + 2] = ["16", "32"]
    assert bench_e2e.main(argv + ["--results-dir", str(tmp_path), "--out", "one", "--plot"]) == 0
    out, err = capsys.readouterr()
    assert out.index("| tiny") < out.index("one_phases.png")  # the table is printed before the figures are drawn
    assert "note: figure phases: 2 of 2 configurations have no step std (one timed step)" in err
    assert (tmp_path / "e2e" / "one_phases.png").stat().st_size > 1000
    probes = records_of(tmp_path / "e2e" / "one.jsonl")
    for probe in probes:  # as a search writes them: each probe marked, the answer after them
        probe["context_search"] = {"max_context": 32}
    search = write_jsonl(tmp_path / "search.jsonl", probes + e2e_tables.context_searches(probes))
    status, out, err = run_report([str(search), "--plot", "--results-dir", str(tmp_path)], capsys)
    assert status == 0 and "Traceback" not in err, err
    assert "## Longest context that runs" in out and (tmp_path / "report" / "search_phases.png").is_file()


def test_plot_with_nothing_plottable(precision_run, tmp_path, capsys):
    old = write_jsonl(tmp_path / "old.jsonl", [{k: v for k, v in r.items() if k != "partial_sums"}
                                                for r in records_of(precision_run[1])])
    status, out, err = run_report([str(old), "--plot", "--results-dir", str(tmp_path)], capsys)
    one_line_error(status, err, "nothing to plot", "partial sums")
    assert "| case" in out  # the tables stand


def test_plot_without_matplotlib(e2e_run, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib now raises ImportError
    status, _, err = run_report([str(e2e_run[1]), "--plot"], capsys)
    one_line_error(status, err, "--plot needs matplotlib", "pip install matplotlib")


def test_a_figure_that_cannot_be_written_keeps_the_tables(tmp_path, capsys, monkeypatch):
    from matplotlib.figure import Figure

    def full_disk(self, path, **kwargs):
        Path(path).write_bytes(b"\x89PNG half")
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(Figure, "savefig", full_disk)
    _, _, argv = SCRIPTS["bench_e2e"]
    assert bench_e2e.main(argv + ["--results-dir", str(tmp_path), "--out", "f", "--plot"]) == 1
    out, err = capsys.readouterr()
    assert "| tiny" in out and "wrote" in out
    lines = err.strip().splitlines()
    assert [line for line in lines if line.startswith("error:")] == [
        f"error: cannot write {tmp_path / 'e2e' / f'f_{name}.png'}: No space left on device; the tables and records "
        "already written are kept" for name in ("phases", "speedup")]
    assert sorted(p.name for p in (tmp_path / "e2e").iterdir()) == ["f.jsonl", "f.md"]  # no partial PNG
    assert len(records_of(tmp_path / "e2e" / "f.jsonl")) == 2


# ---- bad input: one line naming the file, the line and what is wrong ----


def one_line_error(status: int, err: str, *fragments: str) -> None:
    assert status == 2
    assert err.count("\n") == 1 and "Traceback" not in err, err
    for fragment in fragments:
        assert fragment in err, err


def test_missing_and_empty_files(tmp_path, capsys):
    one_line_error(*run_report([str(tmp_path / "nope.jsonl")], capsys)[::2], "no such file")
    (tmp_path / "empty.jsonl").write_text("")
    one_line_error(*run_report([str(tmp_path / "empty.jsonl")], capsys)[::2], "no records")


def test_truncated_last_line_is_skipped_with_a_note(e2e_run, tmp_path, capsys):
    lines = e2e_run[1].read_text().splitlines()
    cut = tmp_path / "e2e" / "cut.jsonl"
    cut.parent.mkdir()
    cut.write_text("\n".join(lines[:3]) + "\n" + lines[3][:40])  # the run died writing its 4th record
    status, out, err = run_report([str(cut), "--results-dir", str(tmp_path)], capsys)
    assert status == 0
    assert "skipped 1 truncated line(s)" in err and "3 complete record(s)" in err
    assert len(markdown_tables(out)[1]) == 3


def test_a_non_json_line_is_an_error(e2e_run, tmp_path, capsys):
    lines = e2e_run[1].read_text().splitlines()
    bad = tmp_path / "bad.jsonl"
    bad.write_text(lines[0] + "\nnot json at all\n" + lines[1] + "\n")
    one_line_error(*run_report([str(bad)], capsys)[::2], "bad.jsonl:2: not a JSON record")


def test_unknown_column_lists_the_valid_ones(e2e_run, capsys):
    status, _, err = run_report([str(e2e_run[1]), "--columns", "size", "speed"], capsys)
    one_line_error(status, err, "unknown column 'speed'", "valid columns: size, d_model", "step ms")


BAD_RUNS = ["an experiment it does not know", "an experiment field of the wrong type", "bare records without config",
            "a file named like ours holding something else", "a field of the wrong type", "a field missing",
            "records of another shape entirely"]


def bad_records(e2e_record: dict) -> dict[str, tuple[str, list, str]]:
    """Saved runs report.py cannot render, by class: (folder, records, what the error says)."""
    wrong_type = json.loads(json.dumps(e2e_record))
    wrong_type["config"]["model"] = "tiny"
    missing = {k: v for k, v in e2e_record.items() if k != "status"}
    return {
        "an experiment it does not know": ("e2e", [e2e_record, {**e2e_record, "experiment": "this"}],
                                           "x.jsonl:2: unknown experiment 'this'"),
        "an experiment field of the wrong type": ("e2e", [{**e2e_record, "experiment": ["bench_e2e"]}],
                                                  "x.jsonl:1: its 'experiment' is [\"bench_e2e\"]"),
        "bare records without config": ("e2e", [{"status": "ok", "step_ms": [1.0]}], "x.jsonl:1: not a bench_e2e "
                                                                                    "record as its script writes it: "
                                                                                    "no field 'config'"),
        "a file named like ours holding something else": ("attention", [{"name": "aten::mm", "dur": 3}],
                                                          "x.jsonl:1: not a bench_attention record"),
        "a field of the wrong type": ("e2e", [e2e_record, wrong_type], "x.jsonl:2: not a bench_e2e record"),
        "a field missing": ("e2e", [e2e_record, missing], "x.jsonl:2: not a bench_e2e record as its script writes "
                                                          "it: no field 'status'"),
        "records of another shape entirely": ("other", [{"loss": 1.5}], "x.jsonl:1: cannot tell which experiment"),
    }


@pytest.mark.parametrize("case", BAD_RUNS)
def test_a_run_it_cannot_render_is_one_line_naming_file_and_line(case, e2e_run, tmp_path, capsys):
    folder, records, message = bad_records(records_of(e2e_run[1])[0])[case]
    jsonl = write_jsonl(tmp_path / folder / "x.jsonl", records)
    modules = set(sys.modules)
    status, out, err = run_report([str(jsonl), "--results-dir", str(tmp_path)], capsys)
    one_line_error(status, err, message)
    assert out == "" and not (tmp_path / "report").exists()
    assert set(sys.modules) == modules  # data chooses no code: nothing was imported ("this" prints a poem)


def test_a_merge_renders_the_files_it_can_and_names_the_others(e2e_run, tmp_path, capsys):
    records = records_of(e2e_run[1])
    good = write_jsonl(tmp_path / "good.jsonl", records)
    bare = write_jsonl(tmp_path / "e2e" / "bare.jsonl", [{"status": "ok"}])
    odd = write_jsonl(tmp_path / "odd.jsonl", [{**records[0], "experiment": 7}])
    status, out, err = run_report([str(good), str(bare), str(odd), "--results-dir", str(tmp_path)], capsys)
    assert status == 2
    assert err.count("\n") == 2 and "Traceback" not in err
    assert f"{bare}:1: not a bench_e2e record" in err and f"{odd}:1: its 'experiment' is 7" in err
    assert len(markdown_tables(out)[1]) == len(records) and (tmp_path / "report" / "good.md").is_file()


# ---- nothing lost: a full disk, Ctrl-C while the report is written ----


def test_a_full_disk_leaves_no_empty_report_and_names_only_real_files(e2e_run, tmp_path, capsys, monkeypatch):
    def full(self, text, *args, **kwargs):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(Path, "write_text", full)
    status, out, err = run_report([str(e2e_run[1]), "--results-dir", str(tmp_path)], capsys)
    assert status == 1 and err.count("\n") == 1 and "No space left on device" in err
    assert f"the records are unchanged in {e2e_run[1]}" in err and "report/sweep.jsonl" not in err
    assert list((tmp_path / "report").iterdir()) == []  # neither an empty .md nor a .partial


def test_ctrl_c_while_the_final_report_is_printed(tmp_path, capsys, monkeypatch):
    def interrupted(text):
        raise KeyboardInterrupt

    monkeypatch.setattr(report, "emit", interrupted)
    _, _, argv = SCRIPTS["bench_e2e"]
    assert bench_e2e.main(argv + ["--results-dir", str(tmp_path), "--out", "c"]) == 130
    err = capsys.readouterr().err.strip().splitlines()
    jsonl = tmp_path / "e2e" / "c.jsonl"
    assert err[-1] == (f"interrupted by Ctrl-C while the report was written: the 2 finished record(s) are in {jsonl}; "
                       f"python3 report.py {jsonl} renders them again")
    assert len(records_of(jsonl)) == 2 and "| sdpa" in (tmp_path / "e2e" / "c.md").read_text()


def test_ctrl_c_while_the_last_row_is_saved_still_saves_and_prints_every_row(tmp_path, capsys, monkeypatch):
    real_replace, calls = results.ResultFiles._replace, []

    def interrupt_the_second(self, path, text):
        calls.append(path)
        if len(calls) == 2:  # the .md after the second (last) configuration
            raise KeyboardInterrupt
        real_replace(self, path, text)

    monkeypatch.setattr(results.ResultFiles, "_replace", interrupt_the_second)
    _, _, argv = SCRIPTS["bench_e2e"]
    assert bench_e2e.main(argv + ["--results-dir", str(tmp_path), "--out", "s"]) == 130
    out, err = capsys.readouterr()
    assert "interrupted by Ctrl-C after 2 of 2 configurations" in err
    md = (tmp_path / "e2e" / "s.md").read_text()
    assert "| sdpa" in md and md.strip() in out  # saved again, whole, and printed
    assert not list((tmp_path / "e2e").glob("*.partial"))


def test_a_file_given_twice_is_one_run(e2e_run, tmp_path, capsys):
    jsonl = e2e_run[1]
    status, out, err = run_report([str(jsonl), str(jsonl.parent / ".." / "e2e" / jsonl.name), "--results-dir",
                                   str(tmp_path)], capsys)
    assert status == 0 and "given more than once is read once" in err
    assert len(markdown_tables(out)[1]) == len(records_of(jsonl)) and "run" not in markdown_tables(out)[1][0]
