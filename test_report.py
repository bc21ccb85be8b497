"""report.py: saved runs re-rendered with the numbers the run printed, merges, LaTeX files, figures, bad input.
CPU, tiny shapes, every experiment run in process (a few seconds each)."""
from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from contextlib import redirect_stdout
from io import StringIO
from pathlib import Path

import pytest

import bench_attention
import bench_e2e
import mem_profile
import precision_demo
import report

TINY_MODEL = ["--d-model", "64", "--d-ff", "128", "--num-layers", "2", "--num-heads", "4", "--vocab-size", "256",
              "--context-length", "32", "--batch-size", "2"]


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


@pytest.fixture(scope="module")
def e2e_run(tmp_path_factory):
    """fp32 and bf16, warm-up 0 and 1, 2 timed steps: (printed output, jsonl path)."""
    results = tmp_path_factory.mktemp("e2e")
    out = run_script(bench_e2e.main, TINY_MODEL + ["--dtype", "fp32", "bf16", "--warmup", "0", "1", "--steps", "2",
                                                   "--device", "cpu", "--in-process", "--results-dir", str(results),
                                                   "--out", "sweep"])
    return out, results / "e2e" / "sweep.jsonl"


@pytest.fixture(scope="module")
def attention_run(tmp_path_factory):
    """naive and sdpa at two lengths, the longest naive one an injected OOM: (printed output, jsonl path)."""
    results = tmp_path_factory.mktemp("attention")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("BENCH_INJECT_FAULT", "oom:impl=naive,seq_len=32")
        out = run_script(bench_attention.main, ["--impl", "naive", "sdpa", "--seq-len", "16", "32", "--d", "8",
                                                "--batch-size", "1", "--iters", "2", "--warmup", "0", "--device",
                                                "cpu", "--in-process", "--results-dir", str(results), "--out", "att"])
    return out, results / "attention" / "att.jsonl"


@pytest.fixture(scope="module")
def memory_run(tmp_path_factory):
    results = tmp_path_factory.mktemp("memory")
    out = run_script(mem_profile.main, ["--size", "tiny", "--context-length", "16", "32", "--mode", "forward", "train",
                                        "--checkpoint", "0", "1", "--device", "cpu", "--in-process",
                                        "--results-dir", str(results), "--out", "mem"])
    return out, results / "memory" / "mem.jsonl"


@pytest.fixture(scope="module")
def precision_run(tmp_path_factory):
    results = tmp_path_factory.mktemp("precision")
    out = run_script(precision_demo.main, ["--count", "200", "--results-dir", str(results), "--out", "prec"])
    return out, results / "precision" / "prec.jsonl"


# ---- the same numbers as the run printed ----


def test_e2e_rerendered_tables_equal_the_printed_ones(e2e_run, tmp_path, capsys):
    printed, jsonl = e2e_run
    status, out, err = run_report([str(jsonl), "--results-dir", str(tmp_path)], capsys)
    assert status == 0, err
    printed_tables = markdown_tables(printed)
    assert len(printed_tables) == 3  # the config table, the results table and the comparison (fp32 vs bf16)
    again = markdown_tables(out)
    assert again == printed_tables
    assert any(row["step ms"] not in ("", None) for row in again[1])
    assert (tmp_path / "report" / "sweep.md").read_text().strip() in out  # the .md holds what was printed
    # the table built row by row (what --columns and merges use) is the printed one
    status, out, err = run_report([str(jsonl), "--results-dir", str(tmp_path), "--columns",
                                   *printed_tables[1][0]], capsys)
    assert status == 0, err
    assert markdown_tables(out)[1] == printed_tables[1]


def test_attention_rerendered_numbers_equal_the_printed_ones(attention_run, tmp_path, capsys):
    printed, jsonl = attention_run
    status, out, err = run_report([str(jsonl), "--results-dir", str(tmp_path)], capsys)
    assert status == 0, err
    naive, sdpa, comparison = markdown_tables(printed)
    assert markdown_tables(out) == [naive, sdpa, comparison]
    # the one-table form (what --columns and merges use) holds the same cells
    columns = ["impl"] + list(dict.fromkeys([*naive[0], *sdpa[0]]))
    status, out, err = run_report([str(jsonl), "--results-dir", str(tmp_path), "--columns", *columns], capsys)
    assert status == 0, err
    main_table = markdown_tables(out)[0]
    for impl, rows in (("naive", naive), ("sdpa", sdpa)):
        assert [{k: row[k] for k in rows[0]} for row in main_table if row["impl"] == impl] == rows
    assert any(row["status"] == "OOM" for row in main_table)


def test_memory_and_precision_rerendered_tables_equal_the_printed_ones(memory_run, precision_run, tmp_path, capsys):
    for printed, jsonl in (memory_run, precision_run):
        status, out, err = run_report([str(jsonl), "--results-dir", str(tmp_path)], capsys)
        assert status == 0, err
        assert markdown_tables(out) == markdown_tables(printed)
        assert markdown_tables(out)


def test_columns_choose_and_order(e2e_run, tmp_path, capsys):
    _, jsonl = e2e_run
    status, out, _ = run_report([str(jsonl), "--results-dir", str(tmp_path), "--columns", "step ms", "dtype",
                                 "warmup"], capsys)
    assert status == 0
    table = markdown_tables(out)[1]
    assert list(table[0]) == ["step ms", "dtype", "warmup"]
    assert [row["dtype"] for row in table] == ["fp32", "bf16", "fp32", "bf16"]  # each warm-up's variants together


# ---- merges ----


def test_merge_of_two_files_has_a_run_column_and_compares_across_them(e2e_run, tmp_path, capsys):
    _, jsonl = e2e_run
    # as if from two runs: records of different runs were not measured as pairs
    records = [{k: v for k, v in json.loads(line).items() if k != "pairing"} for line in jsonl.read_text().splitlines()]
    fp32, bf16 = tmp_path / "monday.jsonl", tmp_path / "tuesday.jsonl"
    fp32.write_text("".join(json.dumps(r) + "\n" for r in records if r["config"]["dtype"] == "fp32"))
    bf16.write_text("".join(json.dumps(r) + "\n" for r in records if r["config"]["dtype"] == "bf16"))
    status, out, err = run_report([str(fp32), str(bf16), "--results-dir", str(tmp_path)], capsys)
    assert status == 0, err
    main_table = next(t for t in markdown_tables(out) if "run" in t[0])
    assert list(main_table[0])[0] == "run"
    assert [row["run"] for row in main_table] == ["monday", "monday", "tuesday", "tuesday"]
    assert "monday: device:" in out and "tuesday: device:" in out
    speedups = next(t for t in markdown_tables(out) if "step speed-up: bf16" in t[0])  # bench_e2e's comparison
    by_run = {(r["run"], r["dtype"], r["warmup"]): float(r["step ms"]) for r in main_table}
    assert len(speedups) == 2
    for row in speedups:  # baseline time / variant time, from the two files' rows
        expected = by_run[("monday", "fp32", row["warmup"])] / by_run[("tuesday", "bf16", row["warmup"])]
        # both printed to 2 decimals
        assert float(row["step speed-up: bf16"].rstrip("x")) == pytest.approx(expected, rel=0.01, abs=0.006)
    assert (tmp_path / "report" / "monday-merged-2.md").is_file()


def test_merging_different_experiments_is_refused(e2e_run, precision_run, tmp_path, capsys):
    status, out, err = run_report([str(e2e_run[1]), str(precision_run[1]), "--results-dir", str(tmp_path)], capsys)
    assert status == 2 and out == ""
    assert err.count("\n") == 1
    assert "cannot merge records of different experiments: sweep is bench_e2e, prec is precision_demo" in err


def test_experiment_is_read_from_the_record_or_inferred(e2e_run, attention_run, memory_run, precision_run):
    for (_, jsonl), name in ((e2e_run, "bench_e2e"), (attention_run, "bench_attention"), (memory_run, "mem_profile"),
                             (precision_run, "precision_demo")):
        record = json.loads(jsonl.read_text().splitlines()[0])
        assert report.experiment_of(record, jsonl) == name
        assert report.experiment_of(record, Path("elsewhere/x.jsonl")) == name  # from its shape alone
    assert report.experiment_of({"experiment": "bench_e2e"}) == "bench_e2e"


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


def records_of(jsonl: Path) -> list[dict]:
    return [json.loads(line) for line in jsonl.read_text().splitlines()]


def test_e2e_figures(e2e_run, tmp_path):
    made = report.figures("bench_e2e", records_of(e2e_run[1]))
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
    import bench_e2e
    from test_bench_e2e import synthetic_record

    eager = synthetic_record(128, "fp32", (30.0, 60.0, 10.0, 100.0))
    eager["environment"].update(device="cuda", device_name="H100")
    compiled = {**synthetic_record(128, "fp32", (15.0, 40.0, 10.0, 65.0)), "environment": eager["environment"]}
    compiled["config"] = {**compiled["config"], "compile": True}
    oom = {**synthetic_record(128, "bf16", status="OOM"), "environment": eager["environment"]}
    found = bench_e2e.comparison([eager, compiled])
    assert found.variants == ["eager", "compiled"] and found.ratios == ["fwd", "fwd+bwd", "step"]
    fig = report.plot_e2e_speedups([eager, compiled])
    assert "handout 2026" in fig._suptitle.get_text() and "H100" in fig._suptitle.get_text()
    assert [round(p.get_height(), 2) for p in fig.axes[0].patches] == [2.0, 1.64, 1.54]  # 30/15, 90/55, 100/65
    assert fig.axes[0].get_ylabel() == "speed-up over eager (x)"
    fig = report.plot_e2e_speedups([eager, oom])  # fp32 vs bf16, the bf16 row out of memory
    assert [t.get_text() for t in fig.axes[0].texts] == ["OOM"] * 3
    assert report.plot_e2e_speedups([eager]) is None  # one variant: nothing to compare
    for record in (eager, compiled):  # a record without its handout (older runs): the title does not make one up
        record["config"] = {k: v for k, v in record["config"].items() if k != "handout"}
    assert "handout" not in report.plot_e2e_speedups([eager, compiled])._suptitle.get_text()


def test_attention_figure_marks_the_oom(attention_run, tmp_path):
    made = report.figures("bench_attention", records_of(attention_run[1]))
    fig = made["attention"]
    check_figure(fig, tmp_path / "attention.png")
    forward_ax = fig.axes[0]
    assert forward_ax.get_xscale() == "log" and forward_ax.get_yscale() == "log"
    assert {line.get_label() for line in forward_ax.get_lines()} == {"naive d=8", "sdpa d=8"}
    oom = [c for c in forward_ax.collections if c.get_label() == "OOM"]
    assert len(oom) == 1 and len(oom[0].get_offsets()) == 1


def test_memory_figures(memory_run, tmp_path):
    made = report.figures("mem_profile", records_of(memory_run[1]))
    assert set(made) == {"memory_context", "memory_checkpoint"}
    for name, fig in made.items():
        check_figure(fig, tmp_path / f"{name}.png")
    (line,) = made["memory_context"].axes[0].get_lines()  # CPU: saved for backward only, fp32, no checkpointing
    assert list(line.get_xdata()) == [16, 32] and line.get_ydata()[1] > line.get_ydata()[0]
    for line in made["memory_checkpoint"].axes[0].get_lines():  # checkpointing keeps less for backward
        assert line.get_ydata()[1] < line.get_ydata()[0]


def test_precision_partial_sums_and_figure(precision_run, tmp_path):
    records = records_of(precision_run[1])
    for r in records:
        counts = [n for n, _ in r["partial_sums"]]
        assert counts[0] == 1 and counts[-1] == 200 and counts == sorted(set(counts))
        assert r["partial_sums"][-1][1] == r["result"]  # the last partial sum is the table's result
    bf16 = next(r for r in records if r["case"] == "2-bf16")
    assert dict(bf16["partial_sums"])[1] == pytest.approx(0.01, rel=0.01)
    fig = report.figures("precision_demo", records)["sums"]
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


# ---- bad input ----


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


def test_plot_with_nothing_plottable(precision_run, tmp_path, capsys):
    old = tmp_path / "old.jsonl"  # records from before partial sums were recorded
    old.write_text("".join(json.dumps({k: v for k, v in r.items() if k != "partial_sums"}) + "\n"
                           for r in records_of(precision_run[1])))
    status, _, err = run_report([str(old), "--plot", "--results-dir", str(tmp_path)], capsys)
    one_line_error(status, err, "nothing to plot", "partial sums")


def test_plot_without_matplotlib(e2e_run, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib now raises ImportError
    status, _, err = run_report([str(e2e_run[1]), "--plot"], capsys)
    one_line_error(status, err, "--plot needs matplotlib", "pip install matplotlib")
