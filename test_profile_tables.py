"""profile_tables.py: launch-window attribution across threads, the four tables on the nsys fixture and on a
torch.profiler trace of the same scenario, and phases from anyone's range names (usual spellings in any case,
warm-up ranges left out, --ranges), with table 1 saying which ranges it used."""
from __future__ import annotations

from pathlib import Path

import pytest

import kernel_categories as kc
import profile_readers as pr
import profile_tables as pt
from test_kernel_tables import (DIRECT_COPY, FOREACH, MEMSET, SGEMM, SUM_REDUCE, WARMUP_KERNEL_NS, XMMA, e2e_record,
                                torch_gpu_trace, write_nsys_fixture)


@pytest.fixture
def nsys_prefix(tmp_path: Path) -> Path:
    return write_nsys_fixture(tmp_path)


# ---- attribution and the tables on the nsys fixture ----


def test_kernels_go_to_the_phase_whose_window_holds_their_launch(nsys_prefix: Path):
    chosen = pt.select_measured(pr.load_nsys(nsys_prefix))
    activities = chosen.activities
    groups = pt.attribute(activities, chosen.ranges, pt.PHASES)
    backward = [a.name for a in groups["backward"]]
    # launched by the autograd thread, which never opened "backward"; the copy ran after the range closed
    assert sorted(backward) == sorted([XMMA, SUM_REDUCE, DIRECT_COPY] * 2)
    assert [a.name for a in groups["optimizer"]] == [FOREACH] * 2
    assert [a.name for a in groups[pt.OUTSIDE]] == [MEMSET] * 2
    assert all(a.duration_ns != WARMUP_KERNEL_NS for a in activities)  # warm-up is outside "measure"


def test_tables_from_nsys_fixture(nsys_prefix: Path):
    tables = pt.build_tables(pr.load_nsys(nsys_prefix), pt.stopwatch_ms(e2e_record()),
                             pt.attention_shape(e2e_record()["config"]), top=3)
    assert tables["steps"] == 2 and tables["device"] == "gpu"
    phases = {row["phase"]: row for row in tables["phases"]}
    assert phases["forward"]["range_ms"] == pytest.approx(0.3) and phases["forward"]["ratio"] == pytest.approx(1.0)
    assert phases["backward"]["work_ms"] == pytest.approx(0.058)  # 40 + 8 + 10 µs per step
    assert phases["step"]["range_ms"] == pytest.approx(1.0)  # the 2 ms measure range over 2 steps
    top_forward = tables["top"]["forward"]
    assert top_forward[0]["name"] == SGEMM and top_forward[0]["per_step"] == 2  # scores + final matmul
    assert top_forward[-1]["name"] == "(3 others)"  # 6 distinct forward kernels, top 3 shown
    assert sum(r["share_pct"] for r in top_forward) == pytest.approx(100)
    categories = {row["scope"]: row for row in tables["categories"]}
    for row in categories.values():
        assert sum(row[c] for c in kc.CATEGORIES) == pytest.approx(100)
    # nothing counted twice, nothing lost: the phases and the gap between them make up the whole
    parts = sum(categories[s]["ms_per_step"] for s in ("forward", "backward", "optimizer", pt.OUTSIDE))
    assert parts == pytest.approx(categories["all"]["ms_per_step"]) == pytest.approx(0.147)
    assert categories["optimizer"]["elementwise"] == pytest.approx(100)
    attention = {row["sub_step"]: row for row in tables["attention"]}
    assert attention["computing softmax"]["ms_per_call"] == pytest.approx(0.010)  # reduce + softmax kernels
    assert attention["final matmul"]["calls_per_step"] == 1
    assert attention["final matmul"]["gflop_per_call"] == pytest.approx(2 * 2 * 32 * 32 * 64 / 1e9)
    assert attention["computing softmax"]["gflop_per_call"] == pytest.approx(5 * 2 * 4 * 32 * 32 / 1e9)
    assert any(note.startswith("softmax takes") for note in tables["notes"])
    text = pt.render_tables(tables)
    assert "### 4. Inside attention" in text and "ampere_sgemm_128x64_tn" in text


def test_a_report_without_nvtx_ranges_says_so(nsys_prefix: Path):
    pr.nsys_report_path(nsys_prefix, "nvtx_pushpop_trace").write_text("")  # nsys's file when no range was recorded
    tables = pt.build_tables(pr.load_nsys(nsys_prefix))
    assert [row["phase"] for row in tables["phases"]] == ["no phase range found"]  # a row, not an empty header
    assert pt.NO_PHASE in tables["notes"] and "--ranges forward=NAME" in pt.NO_PHASE
    assert tables["top"]["all"]  # the kernels are still tabulated, as one scope
    assert "| no phase range found |" in pt.render_tables(tables)


def test_compiled_runs_say_why_the_attention_table_is_absent(nsys_prefix: Path):
    profile = pr.load_nsys(nsys_prefix)
    profile.ranges = [r for r in profile.ranges if r.name not in pt.ATTENTION_STEPS]  # what --compile records
    compiled = pt.build_tables(profile, compiled=True)
    assert compiled["attention"] == [] and any("torch.compile" in note for note in compiled["notes"])
    assert not any("torch.compile" in note for note in pt.build_tables(profile)["notes"])


def test_kernel_summary_cross_check(nsys_prefix: Path):
    profile = pr.load_nsys(nsys_prefix)
    assert pr.nsys_kernel_total_check(nsys_prefix, profile) is None
    truncated = pr.Profile(profile.activities[:5], profile.ranges, "gpu", "x")
    assert "do not match" in pr.nsys_kernel_total_check(nsys_prefix, truncated)



# ---- torch.profiler traces ----


def test_torch_gpu_trace_gives_the_same_tables_as_nsys(nsys_prefix: Path, tmp_path: Path):
    from_torch = pt.build_tables(pr.load_torch_trace(torch_gpu_trace(tmp_path / "t.json")))
    from_nsys = pt.build_tables(pr.load_nsys(nsys_prefix))
    assert from_torch["device"] == "gpu"
    for key in ("categories", "attention"):
        assert from_torch[key] == pytest.approx(from_nsys[key])
    assert from_torch["top"]["backward"] == pytest.approx(from_nsys["top"]["backward"])


def test_cpu_self_time_subtracts_direct_children_per_thread():
    def op(name, ts, dur, tid=1):
        return {"ph": "X", "cat": "cpu_op", "name": name, "pid": 1, "tid": tid, "ts": ts, "dur": dur}
    events = [op("aten::linear", 0, 100), op("aten::matmul", 5, 90), op("aten::mm", 10, 80),
              op("aten::add", 0, 50, tid=2), op("aten::t", 96, 2)]
    self_us = {a.name: a.duration_ns / 1e3 for a in pr.cpu_self_times(events)}
    assert self_us == {"aten::linear": 8, "aten::matmul": 10, "aten::mm": 80, "aten::add": 50, "aten::t": 2}




# ---- phases from anyone's ranges ----


@pytest.mark.parametrize("name, phase", [
    ("forward", "forward"), ("Forward", "forward"), ("FWD", "forward"), ("forward_pass", "forward"),
    ("Forward 3", "forward"), ("backward", "backward"), ("Backward Pass", "backward"), ("bwd", "backward"),
    ("optimizer", "optimizer"), ("Optimizer Step", "optimizer"), ("optimizer.step", "optimizer"),
    ("opt", "optimizer"), ("optimizer_step", "optimizer"), ("step", "step"), ("Step 3", "step"),
    ("train-step", "step"), ("Training Step 12", "step"), ("train_step", "step"),
    ("Benchmark Forward Only", None), ("Run Benchmark", None), ("computing softmax", None), ("measure", None),
    ("forwarding", None), ("Initialize Model", None),
])
def test_the_usual_spellings_of_a_phase_in_any_case(name: str, phase: str | None):
    assert pt.phase_of(name, {}) == phase


def test_warmup_ranges_in_any_spelling():
    assert all(pt.is_warmup(name) for name in ("warmup", "Warm-up", "Warm-up Step 3", "WARM_UP", "warm up 2"))
    assert not any(pt.is_warmup(name) for name in ("forward", "Warmed", "swarmup"))


def student_profile() -> pr.Profile:
    """A profile shaped as a student's own (the realdata export): model set-up, warm-up steps holding Forward and
    Backward, then three benchmarked Forward passes; kernels in each, and one after the benchmark."""
    ranges = [pr.Range("Run Benchmark", 0, 1000), pr.Range("Initialize Model", 0, 100), pr.Range("Warm-up", 100, 400)]
    activities = [pr.Activity("init_kernel", 7, 50)]
    for i, start in enumerate((100, 250)):
        ranges += [pr.Range(f"Warm-up Step {i + 1}", start, start + 150), pr.Range("Forward", start, start + 60),
                   pr.Range("Backward", start + 60, start + 150)]
        activities += [pr.Activity("warmup_kernel", 1000, start + 10), pr.Activity("warmup_kernel", 1000, start + 70)]
    ranges.append(pr.Range("Benchmark Forward Only", 400, 900))
    for start in (410, 560, 710):
        ranges.append(pr.Range("Forward", start, start + 100 + start // 100))  # 104, 105, 107 ns
        activities.append(pr.Activity("ampere_sgemm_128x64_tn", 80, start + 5))
        activities.append(pr.Activity("[CUDA memset]", 3, start + 120))  # between passes: outside the phases
    activities.append(pr.Activity("teardown_kernel", 500, 950))  # after the last pass
    return pr.Profile(activities, ranges, "gpu", "student")


def test_a_students_own_ranges_fill_table_1_and_say_which_were_used():
    tables = pt.build_tables(student_profile())
    assert tables["steps"] == 3
    (forward,) = tables["phases"]  # no measured Backward: those were all inside warm-up ranges
    assert forward["phase"] == "forward" and forward["range_ms"] == pytest.approx((104 + 105 + 107) / 3 / 1e6)
    assert forward["work_ms"] == pytest.approx(80 / 1e6)  # per step: the sgemm; no warm-up, set-up or teardown work
    assert {r["name"] for r in tables["top"]["all"]} == {"ampere_sgemm_128x64_tn", "[CUDA memset]"}
    assert tables["ranges_used"] == ("ranges used: forward = 'Forward' x3 (left out, inside warm-up ranges: 2 "
                                     "forward, 2 backward); 3 steps (the forward ranges); measured region: from the "
                                     "first to the last phase range, warm-up ranges left out")
    text = pt.render_tables(tables)
    assert tables["ranges_used"] in text and pt.NO_STOPWATCH in text


def test_ranges_given_by_name_replace_the_usual_spellings_for_their_phase():
    profile = student_profile()
    profile.ranges = [pr.Range("Model Fwd Pass" if r.name == "Forward" else r.name, r.start_ns, r.end_ns)
                      for r in profile.ranges]
    assert [row["phase"] for row in pt.build_tables(profile)["phases"]] == ["no phase range found"]
    given = pt.build_tables(profile, ranges={"forward": "Model Fwd Pass"})
    assert given["steps"] == 3 and given["phases"][0]["phase"] == "forward"
    # a measure range given by name: the region is inside it, whatever else was recorded
    benchmark = pt.build_tables(student_profile(), ranges={"measure": "Benchmark Forward Only"})
    assert benchmark["phases"][-1]["phase"] == "step"  # the measure range over the 3 steps
    assert benchmark["phases"][-1]["range_ms"] == pytest.approx(500 / 3 / 1e6)
    # forward given another name: a range merely spelled "forward" no longer counts
    renamed = pt.build_tables(student_profile(), ranges={"forward": "nothing by that name"})
    assert [row["phase"] for row in renamed["phases"]] == ["no phase range found"]
    # ... nor joins the named one when it lies inside it: forward is the outer range alone
    outer = student_profile()
    outer.ranges += [pr.Range("Model Forward", r.start_ns, r.end_ns + 50) for r in outer.ranges if r.name == "Forward"
                     and r.start_ns >= 400]
    outer.ranges = [pr.Range("forward", r.start_ns, r.end_ns) if r.name == "Forward" else r for r in outer.ranges]
    chosen = pt.build_tables(outer, ranges={"forward": "Model Forward"})
    (forward,) = chosen["phases"]
    assert forward["range_ms"] == pytest.approx((154 + 155 + 157) / 3 / 1e6)  # the outer ranges only


def test_step_ranges_count_the_steps_and_give_the_step_row():
    ranges, activities = [], []
    for i, start in enumerate((0, 300)):
        ranges += [pr.Range("train_step", start, start + 250), pr.Range("fwd", start, start + 100),
                   pr.Range("bwd", start + 100, start + 200), pr.Range("Optimizer Step", start + 200, start + 250)]
        activities += [pr.Activity("ampere_sgemm_128x64_tn", 50, start + 10)]
    tables = pt.build_tables(pr.Profile(activities, ranges, "gpu", "x"), {"step": 0.00025})
    assert tables["steps"] == 2 and "2 steps (the step ranges)" in tables["ranges_used"]
    rows = {row["phase"]: row for row in tables["phases"]}
    assert list(rows) == ["forward", "backward", "optimizer", "step"]
    assert rows["step"]["range_ms"] == pytest.approx(250 / 1e6) and rows["step"]["agrees"] == "yes"


def test_gradient_accumulation_two_forwards_a_step_counts_per_step():
    """Two micro-batches a step (forward, backward, forward, backward, optimizer): the steps are the optimizer's
    ranges, and every phase's range time and work are per step, as the stopwatch's are."""
    ranges, activities = [], []
    for start in (0, 1000):
        for micro in (0, 300):
            ranges += [pr.Range("forward", start + micro, start + micro + 100),
                       pr.Range("backward", start + micro + 100, start + micro + 300)]
            activities.append(pr.Activity("ampere_sgemm_128x64_tn", 90, start + micro + 10))
        ranges.append(pr.Range("optimizer", start + 600, start + 700))
    tables = pt.build_tables(pr.Profile(activities, ranges, "gpu", "x"), {"forward": 0.0002})
    assert tables["steps"] == 2 and "2 steps (the optimizer ranges)" in tables["ranges_used"]
    rows = {row["phase"]: row for row in tables["phases"]}
    assert rows["forward"]["range_ms"] == pytest.approx(200 / 1e6)  # two 100 ns ranges a step
    assert rows["forward"]["work_pct_of_range"] == pytest.approx(90.0)  # 180 ns of sgemm in 200 ns of forward
    assert rows["forward"]["agrees"] == "yes" and rows["backward"]["range_ms"] == pytest.approx(400 / 1e6)
