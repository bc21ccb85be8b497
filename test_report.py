"""report.py: a saved run re-rendered in any format is the run's own file, merges get a run column, bad input is
one line and exit 2, output names follow --out's rules, and the figures label their log axes and keep legends off
the bars. Scripts run in process on CPU; figures are drawn from hand-made records."""
from __future__ import annotations

import copy
import dataclasses
import json
import os
import platform
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import precision_demo
import report
import results

HERE = Path(__file__).resolve().parent


def run(argv: list[str], capsys) -> tuple[int, str, str]:
    try:
        code = report.main(argv)
    except SystemExit as exc:
        code = exc.code
    out = capsys.readouterr()
    return code, out.out, out.err


@pytest.fixture(scope="module")
def precision_run(tmp_path_factory) -> Path:
    """precision_demo's records, in LaTeX: its folder (run.jsonl, run.md, run.tex)."""
    folder = tmp_path_factory.mktemp("precision")
    assert precision_demo.main(["--count", "20", "--fmt", "latex_booktabs", "--results-dir", str(folder),
                                "--out", "run"]) == 0
    return folder / "precision"


def test_a_saved_run_renders_again_byte_for_byte_in_its_format_and_others(precision_run, tmp_path, capsys):
    jsonl = precision_run / "run.jsonl"
    code, out, err = run([str(jsonl), "--fmt", "latex_booktabs", "--results-dir", str(tmp_path)], capsys)
    assert code == 0 and err == "" and f" | Python {platform.python_version()} | " in out
    assert (tmp_path / "report" / "run.tex").read_text() == (precision_run / "run.tex").read_text()
    assert (tmp_path / "report" / "run.md").read_text() == (precision_run / "run.md").read_text()
    for fmt, suffix in (("html", ".html"), ("plain", ".txt")):
        code, out, _ = run([str(jsonl), "--fmt", fmt, "--results-dir", str(tmp_path), "--out", fmt], capsys)
        assert code == 0 and (tmp_path / "report" / f"{fmt}{suffix}").is_file() and f"{fmt}{suffix}" in out
    assert (tmp_path / "report" / "html.html").read_text().count("<table>") >= 1
    # an existing report is never overwritten: the second one gets its own stem
    run([str(jsonl), "--results-dir", str(tmp_path)], capsys)
    assert (tmp_path / "report" / "run-2.md").is_file()


@pytest.mark.parametrize("fmt", ["github", "latex_booktabs", "latex_raw"])
def test_a_hand_edited_record_is_text_in_every_table_format(fmt, precision_run):
    """A field with '|', a newline, a fence, LaTeX and a right-to-left override: one row, the same cells."""
    records = results.read_records(precision_run / "run.jsonl")
    hostile = "fp|32\n```\n\\input{/etc/passwd}\u202e"
    records[0]["accumulator_dtype"] = hostile
    text = report.render("precision_demo", records, fmt)
    clean = report.render("precision_demo", [dict(records[0], accumulator_dtype="x")] + records[1:], fmt)
    assert len(text.splitlines()) == len(clean.splitlines()) and "\u202e" not in text
    assert not any(line.lstrip().startswith("```") for line in text.splitlines())  # no fence opens
    if fmt == "github":
        row = next(line for line in text.splitlines() if "input" in line)
        assert "fp\\|32" in row and row.count("|") - row.count("\\|") == clean.splitlines()[
            text.splitlines().index(row)].count("|")  # no cell forged
    else:
        live = [line for line in results.as_report_file(text, fmt).splitlines() if not line.startswith("%")]
        assert "\\input{" not in "".join(live) and "\\textbackslash{}input\\{" in "".join(live)  # as its .tex


def test_a_merge_has_a_run_column_and_columns_are_checked(precision_run, tmp_path, capsys):
    other = tmp_path / "tuesday.jsonl"
    other.write_text((precision_run / "run.jsonl").read_text())
    code, out, _ = run([str(precision_run / "run.jsonl"), str(other), "--results-dir", str(tmp_path)], capsys)
    assert code == 0 and "| run " in out and "tuesday" in out and (tmp_path / "report" / "run-merged-2.md").is_file()
    code, _, err = run([str(other), "--columns", "case", "nonsense", "--results-dir", str(tmp_path)], capsys)
    assert code == 2 and "unknown column 'nonsense'" in err and len(err.splitlines()) == 1


@pytest.mark.parametrize("text, message", [
    ("not json\n{}\n", "not a JSON record"),
    ("[1, 2]\n", "not a JSON object"),
    ('{"experiment": "os.system"}\n', "experiment 'os.system'"),
    ('{"status": "ok"}\n', "no experiment field"),
    ("", "no records"),
])
def test_bad_input_is_one_line_and_exit_2(text, message, tmp_path, capsys):
    bad = tmp_path / "bad.jsonl"
    bad.write_text(text)
    code, out, err = run([str(bad), "--results-dir", str(tmp_path)], capsys)
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1 and out == ""


def test_endless_input_is_one_line_and_exit_2(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(report, "MAX_LINE_BYTES", 1 << 20)  # the same rule at 1 MiB: quick
    code, _, err = run(["/dev/zero", "--results-dir", str(tmp_path)], capsys)
    assert code == 2 and "without a record's end" in err and len(err.strip().splitlines()) == 1


def test_a_record_file_past_the_read_limit_is_one_line_exit_2(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv(results.READ_LIMIT_ENV, "1")  # MB; by default a twentieth of the memory the process may use
    big = tmp_path / "big.jsonl"
    big.write_text('{"experiment": "precision_demo"}\n' * 50_000)  # 1.6 MB of rows
    code, out, err = run([str(big), "--results-dir", str(tmp_path)], capsys)
    assert code == 2 and "the record file holds more than 1 MiB (CS336_READ_LIMIT_MB=1)" in err and not out
    assert len(err.strip().splitlines()) == 1


def test_a_million_rows_past_what_memory_allows_are_refused_before_parsing(tmp_path):
    """A million rows (33 MB) under `ulimit -v` 512 MiB and no CS336_READ_LIMIT_MB: the default limit, a twentieth
    of that (25 MiB), refuses the file in one line before a row is parsed, so memory stays below the file's size
    (a 662 MiB file under 4 GiB was a MemoryError traceback after a minute)."""
    big = tmp_path / "million.jsonl"
    big.write_text('{"experiment": "precision_demo"}\n' * 1_000_000)
    child = ("import resource, sys; resource.setrlimit(resource.RLIMIT_AS, (512 << 20,) * 2); import report\n"
             "try: sys.exit(report.main(sys.argv[1:]))\n"  # VmHWM: the peak resident kB of this program alone
             "finally: print(open('/proc/self/status').read().split('VmHWM:')[1].split()[0])")  # (ru_maxrss
    # keeps the forking pytest's)
    env = {k: v for k, v in os.environ.items() if k != results.READ_LIMIT_ENV}
    done = subprocess.run([sys.executable, "-c", child, str(big), "--results-dir", str(tmp_path)], cwd=HERE, env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1, done.stderr[-2000:]
    assert "the record file holds more than 25 MiB (a twentieth of the memory this process may use" in done.stderr
    assert int(done.stdout) < 33_000, done.stdout  # kB resident: the rows were never read into memory


def test_a_number_past_floats_range_is_one_cell_and_the_rest_renders(tmp_path, capsys):
    """10**400 ms, in the main table and in the floors table (its bytes too): "inf" cells, every other value as
    it was; the figures drawn (without that bar)."""
    cfg = results.ModelConfig(d_model=64, d_ff=128, num_layers=2, num_heads=4, vocab_size=256, context_length=16)
    record = e2e("bf16", 0, [1.5])
    record["config"].update(model=dataclasses.asdict(cfg), batch_size=4, steps=1, no_grad=False)
    record.update(forward_ms_std=0.1, backward_ms_std=0.1, optimizer_ms_std=0.1, tokens_per_s=1000.0, noisy=[])
    roofs = {"precision": "bf16", "tflops": 989.4, "gbs": 3350.0, "ceiling": "datasheet", "measured": None,
             "datasheet": {"tflops": 989.4, "gbs": 3350.0, "label": "H100 SXM"}}
    record["floors"] = results.beside_measured(results.step_floors(cfg, 4, 16, "train", 2, "naive", 989.4, 3350.0),
                                               record, roofs)
    huge = copy.deepcopy(record) | {"forward_ms_mean": 10**400}
    huge["floors"]["phases"]["backward"]["bytes"] = 10**400
    (tmp_path / "huge.jsonl").write_text(json.dumps(huge) + "\n" + json.dumps(record) + "\n")
    code, out, err = run([str(tmp_path / "huge.jsonl"), "--results-dir", str(tmp_path), "--plot"], capsys)
    assert code == 0 and err == "" and (tmp_path / "report" / "huge_phases.png").is_file(), err
    rows = [[cell.strip() for cell in line.split("|")] for line in out.splitlines() if line.startswith("| tiny ")]
    assert [row[9] for row in rows if "ok" in row] == ["inf", "0.50"]  # fwd ms
    assert [row[3:7] for row in rows if row[3] in ("fwd", "bwd")] == [  # phase, measured ms, GFLOP, MB moved
        ["fwd", "inf", "0.013107", "0.6144"], ["bwd", "0.5", "0.026214", "inf"],
        ["fwd", "0.5", "0.013107", "0.6144"], ["bwd", "0.5", "0.026214", "1.0744"]]


def test_an_interrupted_runs_last_line_is_skipped_with_a_note(precision_run, tmp_path, capsys):
    cut = tmp_path / "cut.jsonl"
    text = (precision_run / "run.jsonl").read_text()
    cut.write_text(text + text.splitlines()[0][:40])
    code, _, err = run([str(cut), "--results-dir", str(tmp_path)], capsys)
    assert code == 0 and "skipped a truncated last line" in err


@pytest.mark.parametrize("name, stem", [(".hidden.jsonl", "hidden"), ("-x.jsonl", "x"), ("..jsonl", "report"),
                                        ("n" * 243 + ".jsonl", "n" * 200)])
def test_output_names_from_input_names_follow_the_out_rules(precision_run, name, stem, tmp_path, capsys):
    source = tmp_path / name
    source.write_text((precision_run / "run.jsonl").read_text())
    code, _, err = run(["--results-dir", str(tmp_path / "r"), "--", str(source)], capsys)
    assert code == 0, err
    assert [p.name for p in (tmp_path / "r" / "report").iterdir()] == [f"{stem}.md"]


def test_a_record_a_table_cannot_use_is_left_out_and_the_others_render(precision_run, tmp_path, capsys):
    records = [json.loads(line) for line in (precision_run / "run.jsonl").read_text().splitlines()]
    broken = copy.deepcopy(records[1])
    del broken["accumulator_dtype"]
    records[1] = broken
    (tmp_path / "b.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    code, out, err = run([str(tmp_path / "b.jsonl"), "--results-dir", str(tmp_path)], capsys)
    assert code == 2 and "b.jsonl:2: left out" in err and "no field 'accumulator_dtype'" in err
    assert out.count("float32") > 2  # the other cases are in the table


def test_a_file_of_unusable_records_is_refused_in_one_line(precision_run, tmp_path, capsys):
    records = [json.loads(line) for line in (precision_run / "run.jsonl").read_text().splitlines()]
    (tmp_path / "b.jsonl").write_text("".join(
        json.dumps({k: v for k, v in r.items() if k != "accumulator_dtype"}) + "\n" for r in records))
    code, out, err = run([str(tmp_path / "b.jsonl"), "--results-dir", str(tmp_path)], capsys)
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1, err
    assert f"none of its {len(records)} records: no field 'accumulator_dtype'" in err


def test_ctrl_c_while_the_report_is_written_still_prints_the_finished_rows(precision_run, tmp_path, capsys,
                                                                         monkeypatch):
    files = results.ResultFiles(tmp_path, "precision", "c", "precision")
    files.markdown.write_text("| case | result |\n|---|---|\n| 1 | 10.0001 |\n")  # as the live report left it

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(report, "render", interrupted)
    assert report.publish("precision_demo", [], files, "github") == 130
    out, err = capsys.readouterr()
    assert "| 1 | 10.0001 |" in out and "interrupted by Ctrl-C while the report was written" in err


@pytest.mark.parametrize("fmt", ["github", "plain", "latex_booktabs"])
def test_numbers_beside_a_dash_are_rounded_as_the_rest_of_their_column(fmt):
    rows = [{"fit": "ok", "beta GB/s": 1.190659514450661, "R^2": 0.97351}, {"fit": "no", "beta GB/s": "—"},
            {"fit": "ok", "beta GB/s": 20.0, "R^2": 0.5}]
    table = results.render_table(rows, ["fit", "beta GB/s", "R^2"], fmt, floatfmt=["g", ".3g", ".3f"])
    assert "1.19" in table and "1.1906" not in table and "0.974" in table and "0.9735" not in table
    assert results.render_table(rows, ["beta GB/s"], fmt, ".2f").split().count("20.00") == 1  # one format for all


@pytest.mark.skipif(not shutil.which("pdflatex"), reason="pdflatex is not installed")
def test_a_latex_table_of_memcpy_rows_and_flags_compiles(tmp_path):
    rows = [{"kernel": "[CUDA memcpy Host-to-Device]", "ms": 0.04, "note": "--steps"}]
    table = results.render_table(rows, ["kernel", "ms", "note"], "latex_booktabs")
    (tmp_path / "t.tex").write_text("\\documentclass{article}\\usepackage{booktabs}\\begin{document}\n"
                                    f"{table}\n\\end{{document}}\n")
    env, *command = results.PDFLATEX.split()
    done = subprocess.run(["timeout", "60", *command, "t.tex"], cwd=tmp_path, capture_output=True, text=True,
                          env={**os.environ, **dict([env.split("=")])})
    assert done.returncode == 0, done.stdout[-2000:]
    assert "-{}-steps" in table


def test_report_starts_without_torch():
    proc = subprocess.run([sys.executable, "-X", "importtime", str(HERE / "report.py"), "--help"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and "usage" in proc.stdout
    assert not [line for line in proc.stderr.splitlines() if line.rstrip().endswith(("| torch", "| numpy"))]


# ---- figures ----

ENV = {"device": "cpu", "device_name": "test CPU", "torch": "2.x", "threads": 2}


def e2e(dtype: str, warmup: int, step: list[float], status: str = "ok", ctx: int = 16) -> dict:
    fwd = [s / 3 for s in step]
    mean = lambda xs: sum(xs) / len(xs) if xs else None  # noqa: E731
    return {"experiment": "bench_e2e", "status": status, "environment": ENV,
            "config": {"size": "tiny", "model": {"context_length": ctx}, "warmup": warmup, "mode": "train",
                       "dtype": dtype, "compile": False, "attn": "naive", "optimizer": "ours", "handout": "2026"},
            "step_ms": step, "step_ms_mean": mean(step), "step_ms_std": 0.1, "forward_ms": fwd,
            "forward_ms_mean": mean(fwd), "backward_ms_mean": mean(fwd), "optimizer_ms_mean": mean(fwd)}


def figures(experiment: str, records: list[dict]) -> dict:
    """Every figure the records allow, by name (matplotlib Figures, not saved)."""
    return {name: fig for name, plot in report.FIGURES[experiment][1].items() if (fig := plot(records)) is not None}


def labelled_ticks(labels) -> int:
    return len([t for t in labels if t.get_text()])


def check_axes(fig, log: str = "") -> None:
    """`log` ("x", "y", "xy"): the axes every panel draws on a log scale; log axes carry several labelled ticks;
    no legend inside an axes that holds bars."""
    fig.savefig(Path("/dev/null"), format="png")
    for ax in fig.axes:
        assert all(getattr(ax, f"get_{axis}scale")() == "log" for axis in log), (log, ax.get_xlabel())
        if ax.get_yscale() == "log":
            assert labelled_ticks(ax.get_yticklabels()) > 1, ax.get_ylabel()
        if ax.get_xscale() == "log":
            assert labelled_ticks(ax.get_xticklabels()) > 1, ax.get_xlabel()
        if ax.patches:
            assert ax.get_legend() is None


def test_e2e_figures_from_records():
    records = [e2e("fp32", 0, [30.0, 20.0, 10.0]), e2e("bf16", 0, [15.0, 10.0, 5.0]),
               e2e("fp32", 1, [12.0, 11.0, 10.5]), e2e("bf16", 1, [], status="OOM")]
    made = figures("bench_e2e", records)
    assert set(made) == {"phases", "speedup", "warmup"}
    for fig in made.values():
        check_axes(fig)
    check_axes(made["warmup"], log="y")
    speedup = made["speedup"].axes[0]
    heights = [round(p.get_height(), 2) for p in speedup.patches]
    assert heights[0::2] == [2.0, 2.0, 2.0]  # fp32 20 ms / bf16 10 ms at warm-up 0: fwd, fwd+bwd, step
    assert [t.get_text() for t in speedup.texts] == ["OOM"] * 3  # the OOM row's status where its bars would be
    assert "warm-up 1" in {line.get_label() for line in made["warmup"].axes[0].get_lines()}
    assert {label.get_rotation() for label in speedup.get_xticklabels()} == {0.0}  # two bars: room to stand


def test_the_roofline_draws_each_phase_of_the_run_at_its_intensity_under_both_roofs(tmp_path):
    cfg = results.ModelConfig(d_model=64, d_ff=128, num_layers=2, num_heads=4, vocab_size=256, context_length=16)
    roofs = {"precision": "bf16", "tflops": 989.4, "gbs": 3350.0, "ceiling": "datasheet",
             "datasheet": {"tflops": 989.4, "gbs": 3350.0, "label": "H100 SXM"},
             "measured": {"tflops": 600, "gbs": 2900}}
    records = []
    for ctx, ms in ((16, 0.5), (32, 0.8)):
        record = e2e("bf16", 0, [3 * ms], ctx=ctx)
        floors = results.step_floors(cfg, 4, ctx, "train", 2, "naive", roofs["tflops"], roofs["gbs"])
        records.append({**record, "floors": results.beside_measured(floors, record, roofs)})
    points = report.roofline_points(records)
    assert [(p["series"], p["label"]) for p in points] == [  # the optimizer has no FLOPs: no point
        (phase, f"tiny ctx {ctx} bf16 naive") for ctx in (16, 32) for phase in ("forward", "backward")]
    for p, (ctx, phase) in zip(points, [(c, ph) for c in (16, 32) for ph in ("forward", "backward")]):
        flops = results.forward_flops(cfg, 4, ctx) * (1 if phase == "forward" else 2)
        nbytes = (results.forward_bytes if phase == "forward" else results.backward_bytes)(cfg, 4, ctx, 2, "naive")
        ms = next(r for r in records if r["config"]["model"]["context_length"] == ctx)[f"{phase}_ms_mean"]
        assert p["intensity"] == pytest.approx(flops / nbytes) and p["tflops"] == pytest.approx(flops / ms / 1e9)
    fig = report.plot_roofline(records)
    (ax,) = fig.axes
    drawn = [tuple(xy) for c in ax.collections for xy in c.get_offsets()]
    assert drawn == [(p["intensity"], p["tflops"]) for p in sorted(points, key=lambda p: p["series"] != "forward")]
    roofs_drawn = {line.get_label(): line for line in ax.get_lines()}
    assert set(roofs_drawn) == {"roof: datasheet H100 SXM bf16 (989 TFLOP/s, 3350 GB/s)",
                                "roof: measured bf16 (600 TFLOP/s, 2900 GB/s)"}
    datasheet = roofs_drawn["roof: datasheet H100 SXM bf16 (989 TFLOP/s, 3350 GB/s)"]
    assert max(datasheet.get_ydata()) == 989.4 and datasheet.get_linestyle() == "--"
    assert (ax.get_xscale(), ax.get_yscale()) == ("log", "log")
    (line,) = results.floor_facts(records)  # the study's writeup reads them in one line
    low, high = map(results.share, sorted(r["floors"]["phases"]["optimizer"]["of_floor"] for r in records))
    assert line.startswith("floors (datasheet ceiling; floor / measured time): forward at ")
    assert f"optimizer at {low}-{high} of its memory floor" in line
    assert [results.share(v) for v in (1.0, 0.714, 0.01, 0.0034)] == ["100%", "71%", "1%", "0.3%"]
    assert "(!)" not in report.floors_section(records, lambda r: {}, {}, "github", "") and "too low" not in line
    # a phase faster than its floor: the ceiling was too low (a measured one under load): flagged, never a bound
    fast = {**records[0], "forward_ms_mean": records[0]["floors"]["phases"]["forward"]["floor_ms"] / 2}
    fast["floors"] = results.beside_measured(fast["floors"]["phases"], fast, roofs)
    text = report.floors_section([fast], lambda r: {}, {}, "github", "")
    assert re.search(r"\| 200% \(!\) +\|", text) and "ceiling it used is too low" in text
    assert "too low to bound it" in results.floor_facts([fast])[0]
    files = results.ResultFiles(tmp_path, "e2e", "run", "e2e")
    drawn_paths, failed = report.draw("bench_e2e", records, files)
    assert not failed and tmp_path / "e2e" / "run_roofline.png" in drawn_paths


def test_the_warmup_figure_of_repeated_runs_shows_each_step_index_once():
    """--repeats 2: each run's 3 steps in turn; the first step of each run is cold."""
    records = [{**e2e("fp32", 0, [500.0, 20.0, 10.0, 300.0, 20.0, 12.0]), "repeats": 2},
               {**e2e("fp32", 1, [12.0, 11.0, 10.0, 14.0, 11.0, 12.0]), "repeats": 2}]
    line = next(line for line in figures("bench_e2e", records)["warmup"].axes[0].get_lines()
                if line.get_label() == "warm-up 0 (mean of 2 runs)")
    assert list(line.get_xdata()) == [1, 2, 3] and list(line.get_ydata()) == [400.0, 20.0, 11.0]


def test_six_variants_slant_their_bar_labels_and_wrap_the_title_within_the_figure():
    records = [e2e("fp32", 0, [30.0, 20.0]) for _ in range(6)]
    variants = [(attn, opt) for attn in ("naive", "sdpa") for opt in ("ours", "torch", "torch.optim:AdamW")]
    for r, (attn, optimizer) in zip(records, variants):
        r["config"].update(attn=attn, optimizer=optimizer)
    made = figures("bench_e2e", records)
    for fig in (made["phases"], made["speedup"]):
        check_axes(fig)  # drawn: the title's extent is known
        assert {label.get_rotation() for label in fig.axes[0].get_xticklabels()} == {30.0}
        title = fig._suptitle.get_window_extent()
        assert 0 <= title.x0 and title.x1 <= fig.bbox.width


@pytest.mark.parametrize("lo,hi,ticks", [
    (17, 482, [20, 50, 100, 200, 500]),  # the top line near 500 gets that label, not left above 200
    (200, 290, [200, 290]),  # within one step: the ends themselves
    (1, 1000, [1, 10, 100, 1000]),  # many: decades only
])
def test_log_ticks_reach_an_end_of_the_data_that_lies_near_the_next_tick(lo, hi, ticks):
    assert report.log_ticks(lo, hi) == ticks


def test_paired_speed_ups_carry_their_intervals_as_error_bars():
    def paired(dtype, step):
        r = e2e(dtype, 0, step)
        r.update(backward_ms=r["forward_ms"], optimizer_ms=r["forward_ms"],
                 pairing={"group": "g", "rounds": [[i, i + 1] for i in range(len(step))]})
        return r

    fp32 = [20.0 + i % 3 for i in range(12)]
    records = [paired("fp32", fp32), paired("bf16", [s / (1.9 + 0.05 * (i % 4)) for i, s in enumerate(fp32)])]
    ax = figures("bench_e2e", records)["speedup"].axes[0]
    from matplotlib.container import ErrorbarContainer
    (bars,) = [c for c in ax.containers if isinstance(c, ErrorbarContainer)]
    assert bars.get_label() == "95% interval"
    (segments,) = bars.lines[2]
    lows, highs = zip(*[(seg[0][1], seg[1][1]) for seg in segments.get_segments()])
    found = results.paired_ratio(fp32, records[1]["step_ms"])
    assert all(1.9 <= low < high <= 2.1 for low, high in zip(lows, highs))
    assert (round(lows[-1], 6), round(highs[-1], 6)) == (round(found.low, 6), round(found.high, 6))  # the step's


def test_a_null_where_a_number_is_expected_draws_the_rest():
    records = [e2e("fp32", 0, [3.0, 2.0]), e2e("bf16", 0, [1.5, 1.0])]
    records[1]["step_ms_std"] = None  # a NaN stored as null
    records[1]["backward_ms_mean"] = None
    fig = figures("bench_e2e", records)["phases"]
    check_axes(fig)


def test_precision_and_attention_figures_label_their_log_axes(precision_run):
    records = [json.loads(line) for line in (precision_run / "run.jsonl").read_text().splitlines()]
    sums = figures("precision_demo", records)["sums"]
    check_axes(sums, log="xy")
    labels = [line.get_label() for line in sums.axes[0].get_lines()]
    assert len(set(labels)) == len(labels) == len(records) + 1  # each case told apart, and the exact sum
    assert "case 4: float32 += float16 -> float32" in labels and "exact: n x 0.01" in labels
    attention = [{"experiment": "bench_attention", "status": "ok" if seq < 64 else "OOM", "environment": ENV,
                  "config": {"impl": impl, "d": 16, "seq_len": seq, "dtype": "fp32", "batch_size": 1},
                  "forward_ms_mean": seq * f, "backward_ms_mean": 2 * seq * f, "saved_tensor_bytes": seq**2 * 4096}
                 for impl, f in (("naive", 0.011), ("sdpa", 0.007)) for seq in (16, 32, 64)]
    fig = figures("bench_attention", attention)["attention"]
    check_axes(fig, log="xy")
    assert {line.get_label() for line in fig.axes[0].get_lines()} == {"naive 16", "sdpa 16"}


def test_plot_writes_pngs_beside_the_report(precision_run, tmp_path, capsys):
    code, out, _ = run([str(precision_run / "run.jsonl"), "--plot", "--results-dir", str(tmp_path)], capsys)
    png = tmp_path / "report" / "run_sums.png"
    assert code == 0 and png.stat().st_size > 10_000 and str(png) in out


def test_memory_figures_against_context_and_checkpoint_size():
    def memory(ctx: int, k: int) -> dict:
        return {"experiment": "mem_profile", "status": "ok", "saved_status": "ok", "environment": ENV,
                "config": {"model": {"context_length": ctx}, "checkpoint_every": k, "dtype": "fp32", "mode": "train",
                           "size": "tiny"}, "saved_total_bytes": ctx * MIB // (k + 1),
                "checkpoint_prediction": {"predicted_peak_bytes": (100 + ctx / (k + 1)) * MIB}}
    MIB = 2**20
    made = figures("mem_profile", [memory(ctx, k) for ctx in (16, 32) for k in (0, 1, 2)])
    assert set(made) == {"memory_context", "memory_checkpoint"}
    for fig in made.values():
        check_axes(fig, log="y")
    ax = made["memory_checkpoint"].axes[0]
    assert [t.get_text() for t in ax.get_xticklabels()] == ["0 (off)", "1", "2"]
    assert "predicted peak, train fp32 ctx 16" in {line.get_label() for line in ax.get_lines()}


def test_your_optimizer_is_named_by_its_short_name():
    assert report.optimizer_label({"optimizer": "mine=my_optim:SGD"}) == "mine"
    assert report.optimizer_label({"optimizer": "my_optim:SGD"}) == "my_optim:SGD"
    assert report.VARIANT_AXES["optimizer"]({"optimizer": "torch"}) == "torch AdamW"


def test_e2e_rows_of_different_modes_say_their_mode():
    """A merge of a 2026 run (a training step) and a 2025 one (forward and backward): step ms differ in kind."""
    train, fwd_bwd = e2e("fp32", 1, [3.0, 3.1]), e2e("fp32", 1, [2.0, 2.1])
    for r in (train, fwd_bwd):
        r["config"].update(model=dataclasses.asdict(results.get_config("tiny", "2026", context_length=16)),
                           batch_size=4, steps=2, no_grad=False)
        r.update(tokens_per_s=1.0, noisy=[], backward_ms_std=0.1, forward_ms_std=0.1, optimizer_ms_std=0.1)
    fwd_bwd["config"]["mode"] = "forward-backward"
    table = report.render("bench_e2e", [{**train, results.RUN_KEY: "a"}, {**fwd_bwd, results.RUN_KEY: "b"}], "github")
    assert re.search(r"\| mode +\|", table) and "| train " in table and "| forward-backward " in table
    assert not re.search(r"\| mode +\|", report.render("bench_e2e", [train], "github"))  # one mode: no column


def test_help_gives_the_default_stem_report_uses(capsys):
    with pytest.raises(SystemExit):
        report.main(["--help"])
    assert "(default: <first input's stem>); an existing result" in " ".join(capsys.readouterr().out.split())
