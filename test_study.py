"""study.py: the plan and its estimate, the budget's drop order, bad input, and one short study (two problems,
killed after its first command, then run again) whose writeup is checked: a section per problem, the script's own
table, the LaTeX."""
import errno
import json
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

import results
import study
from test_nsys import hangup_as_in_a_terminal

HERE = Path(__file__).resolve().parent
PROBLEMS = {"2026": ["benchmarking_script", "nsys_profile", "mixed_precision_accumulation",
                     "benchmarking_mixed_precision", "memory_profiling", "gradient_checkpointing", "pytorch_attention",
                     "torch_compile", "flash_forward", "flash_backward", "flash_benchmarking",
                     "distributed_communication_single_node", "naive_ddp_benchmarking",
                     "minimal_ddp_flat_benchmarking", "ddp_overlap_individual_parameters_benchmarking",
                     "optimizer_state_sharding_accounting", "fsdp_accounting"],
            "2025": ["benchmarking_script", "nsys_profile", "mixed_precision_accumulation",
                     "benchmarking_mixed_precision", "memory_profiling", "pytorch_attention", "torch_compile",
                     "flash_forward", "flash_backward", "flash_benchmarking", "distributed_communication_single_node",
                     "naive_ddp_benchmarking", "minimal_ddp_flat_benchmarking",
                     "ddp_overlap_individual_parameters_benchmarking", "ddp_bucketed_benchmarking",
                     "optimizer_state_sharding_accounting"]}
ONLY = ["mixed_precision_accumulation", "benchmarking_mixed_precision_ab"]  # the two cheapest problems


def run_study(*args, **kwargs):
    return subprocess.run([sys.executable, "study.py", *args], cwd=HERE, capture_output=True, text=True, **kwargs)


def ledger(root: Path) -> list:
    path = root / "study.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.is_file() else []


@pytest.fixture(scope="module")
def killed_and_resumed(tmp_path_factory):
    """The study of ONLY, stopped by SIGTERM once its first command is recorded, then run again to the end."""
    results = tmp_path_factory.mktemp("results")
    root = results / "study" / "s"
    argv = [sys.executable, "study.py", "--quick", "--device", "cpu", "--only", *ONLY, "--results-dir",
            str(results), "--out", "s"]
    first = subprocess.Popen(argv, cwd=HERE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 240
    while not ledger(root) and first.poll() is None and time.time() < deadline:
        time.sleep(0.1)
    before = ledger(root)
    jsonl = root / before[0]["files"]["jsonl"] if before else None
    stamp = (jsonl.stat().st_mtime_ns, len(jsonl.read_text().splitlines())) if jsonl else None
    held = (root / "study.lock").read_text()
    concurrent = run_study(*argv[2:], timeout=60)  # refused while the first runs
    first.send_signal(signal.SIGTERM)
    first.communicate(timeout=120)
    released = not (root / "study.lock").exists()
    second = run_study(*argv[2:], timeout=300)
    return {"root": root, "first_rc": first.returncode, "before": before, "stamp": stamp, "jsonl": jsonl,
            "second": second, "after": ledger(root), "held": held, "concurrent": concurrent, "released": released,
            "pid": first.pid}


def test_killed_study_resumes_without_rerunning_a_finished_command(killed_and_resumed):
    r = killed_and_resumed
    assert r["first_rc"] == 128 + signal.SIGTERM
    assert [e["name"] for e in r["before"]] == ["precision_demo"]
    assert r["second"].returncode == 0, r["second"].stdout + r["second"].stderr
    names = [e["name"] for e in r["after"]]
    assert sorted(names) == ["precision_demo", "toy_autocast"]  # each recorded once: nothing ran twice
    assert r["after"][0] == r["before"][0]
    assert (r["jsonl"].stat().st_mtime_ns, len(r["jsonl"].read_text().splitlines())) == r["stamp"]
    assert "recorded earlier" in r["second"].stdout


def test_a_later_only_keeps_in_the_writeup_the_commands_and_checks_recorded_before(killed_and_resumed, tmp_path,
                                                                                    capsys):
    root = tmp_path / "study" / "s"
    shutil.copytree(killed_and_resumed["root"], root)
    (root / "study.lock").unlink(missing_ok=True)
    whole = (root / "writeup.md").read_text()
    assert study.main(["--quick", "--device", "cpu", "--only", ONLY[0], "--results-dir", str(tmp_path),
                       "--out", "s"]) == 0, capsys.readouterr()
    text = (root / "writeup.md").read_text()
    assert "toy_autocast.py" in text and "# toy_autocast: skipped" not in text
    checks = [line for line in text.splitlines() if line.startswith("Checks: ")]
    assert checks == [line for line in whole.splitlines() if line.startswith("Checks: ")]
    assert "benchmarking_mixed_precision (a), (b)" in checks[0]


def test_a_second_run_in_the_study_folder_is_refused_while_the_first_holds_its_lock(killed_and_resumed, tmp_path):
    r = killed_and_resumed
    assert r["held"].split()[0] == str(r["pid"]) and r["released"] and not (r["root"] / "study.lock").exists()
    assert r["concurrent"].returncode == 2, r["concurrent"].stderr
    assert f"a study is running in this folder: pid {r['pid']}" in r["concurrent"].stderr
    assert len(r["concurrent"].stderr.strip().splitlines()) == 1
    gone = subprocess.Popen(["true"])
    gone.wait()
    root = tmp_path / "study" / "s"
    root.mkdir(parents=True)
    (root / "study.lock").write_text(f"{gone.pid} {socket.gethostname()}")  # killed: taken over
    done = run_study("--quick", "--device", "cpu", "--only", "flash_forward", "--results-dir", str(tmp_path),
                     "--out", "s")
    assert done.returncode == 0 and not (root / "study.lock").exists(), done.stderr


def test_writeup_has_every_problem_and_the_scripts_own_table(killed_and_resumed):
    root = killed_and_resumed["root"]
    text = (root / "writeup.md").read_text()
    assert text.splitlines()[0].startswith("# CS336 assignment 2, part 1 (") and "on a CPU" in text.splitlines()[0]
    headings = [line for line in text.splitlines() if line.startswith("## ")]  # the scripts' own: ### and below
    for name in PROBLEMS["2026"]:
        assert any(name in h for h in headings), name
    assert text.count("\nAnswer:") == len(headings)
    for entry in killed_and_resumed["after"]:
        table = (root / entry["files"]["md"]).read_text()
        assert study.demoted(table.rstrip("\n")) in text  # what the script wrote, its headings one level down
        assert all(line in text.splitlines() for line in table.splitlines() if line.startswith("|"))
        assert entry["command"] in text
    assert "case 2 (float16 += float16): 9.953125" in text  # a measured fact, from the records


def test_a_cpu_writeup_claims_no_measurement_that_did_not_run(killed_and_resumed, tmp_path, monkeypatch):
    """On a CPU: no peak is 'passed', a prediction is not listed as measured, each table is shown once, the header
    says the batch the tables ran at, and the checkpointing shape is one where K changes the predicted peak."""
    header = (killed_and_resumed["root"] / "writeup.md").read_text().splitlines()[0]
    assert "at batch 4" in header and "checkpointing at context 256" in header
    args = study.parse_args(["--quick", "--device", "cpu", "--results-dir", str(tmp_path)])
    machine = study.probe_machine("cpu", args.handout)
    plan = study.build_plan(args, machine)
    root = tmp_path / "study" / "s"
    tables = {"memory_64": "| memory table |\n|---|\n| 1 |", "checkpoint": "| checkpoint table |\n|---|\n| 2 |"}
    records = {"memory_64": {"label": "tiny ctx=64 train fp32 naive", "status": "ok", "config": {},
                             "residual_stream_bytes": 524288, "residual_stream_formula": "4 x 64 x 512 x 4 B"},
               "checkpoint": {"label": "tiny ctx=256 train fp32 naive", "status": "ok", "config": {},
                              "checkpoint_prediction": {"best_k": 1, "best_predicted_peak_bytes": 2**30}}}
    (root / "memory").mkdir(parents=True)
    with open(root / "study.jsonl", "w") as ledger:
        for name, table in tables.items():
            (root / "memory" / f"{name}.md").write_text(table + "\n")
            (root / "memory" / f"{name}.jsonl").write_text(json.dumps(records[name]) + "\n")
            ledger.write(json.dumps({"name": name, "stem": name, "command": f"python3 mem_profile.py --out {name}",
                                     "status": "ok", "seconds": 1.0, "files": {"md": f"memory/{name}.md",
                                     "jsonl": f"memory/{name}.jsonl"}}) + "\n")
    text = study.writeup(study.Study(root), plan, machine, args)
    checks = next(line for line in text.splitlines() if line.startswith("Checks: "))
    assert "(peak memory) passed" not in checks and "not measured: peak memory (needs CUDA)" in checks
    assert "memory_profiling (a), (e), not measured: memory timelines (need CUDA)" in checks
    assert text.count(tables["memory_64"]) == 1 and "(The tables of memory_64 are in section 9" in text
    checkpointing = text.split("gradient_checkpointing (a), (b)\n")[1].split("\n## ")[0]
    measured, predicted = checkpointing.split("Measured:")[1].split("Computed or predicted (not measured):")
    assert "predicted best K" not in measured and "predicted best K 1 at 1.000 GiB" in predicted
    assert "not measured on this machine: the peak memory of each K (needs CUDA)" in measured
    (checkpoint,) = next(p for p in plan if p.key == "gradient_checkpointing").commands
    assert checkpoint.args[checkpoint.args.index("--context-length") + 1] == "256"
    assert ("- no figures" in text) == (study.importlib.util.find_spec("matplotlib") is None)
    monkeypatch.setattr(study.importlib.util, "find_spec", lambda name, *a: None if name == "matplotlib" else 1)
    assert "- no figures: matplotlib is not installed" in study.writeup(study.Study(root), plan, machine, args)


def test_latex_splits_a_wide_table_into_parts_that_each_name_the_row():
    header = ["size", "d_model", "d_ff", "layers", "heads", "ctx", "dtype", "warmup", "fwd ms", "fwd std", "bwd ms",
              "bwd std", "opt ms", "opt std", "step ms", "step std", "tokens/s", "TFLOP/s", "status"]
    markdown = "| " + " | ".join(header) + " |\n|" + "---|" * len(header) + "\n| " + " | ".join(
        str(i) for i in range(len(header))) + " |"
    tex = study.md_to_tex(markdown)
    parts = tex.split("\\begin{tabular}")[1:]
    assert len(parts) > 1 and all(part.split("\\midrule")[0].count("&") < study.TEX_COLUMNS for part in parts)
    assert all("size" in part and "ctx" in part and "warmup" in part for part in parts)
    assert all(name.replace("_", "\\_") in tex for name in header)


def test_latex_writeup_compiles(killed_and_resumed, tmp_path):
    root = killed_and_resumed["root"]
    tex = (root / "writeup.tex").read_text()
    assert "\\begin{document}" in tex and "\\toprule" in tex and tex.isascii()
    if not shutil.which("pdflatex"):
        pytest.skip("pdflatex is not installed")
    env, *command = shlex.split(results.PDFLATEX)
    done = subprocess.run([*command, "-output-directory", str(tmp_path), "writeup.tex"], cwd=root, capture_output=True,
                          text=True, timeout=120, env={**os.environ, **dict([env.split("=")])})
    assert done.returncode == 0, done.stdout[-2000:]
    if shutil.which("pdftotext"):  # outline fonts: a ligature (fl, fi) copies and searches as its letters
        text = subprocess.run(["pdftotext", str(tmp_path / "writeup.pdf"), "-"], capture_output=True, text=True).stdout
        assert "causal flag" in text


def test_from_the_students_folder_their_kernel_runs_and_a_wrong_one_fails_the_check(tmp_path):
    """Every command runs where study.py was started, so --impl imports the student's module from there; a kernel
    the check finds WRONG fails its step, though the command itself succeeded."""
    (tmp_path / "student_flash.py").write_text(
        "import torch.nn.functional as F\n"
        "def good(q, k, v, is_causal=False):\n    return F.scaled_dot_product_attention(q, k, v, is_causal=is_causal)\n"
        "def no_mask(q, k, v, is_causal=False):\n    return F.scaled_dot_product_attention(q, k, v)\n")
    for kernel, verdict in (("good", "passed"), ("no_mask", "failed")):
        done = subprocess.run([sys.executable, str(HERE / "study.py"), "--quick", "--device", "cpu", "--handout",
                               "2025", "--only", "flash_forward", "--impl", f"student_flash:{kernel}", "--out",
                               kernel], cwd=tmp_path, capture_output=True, text=True, timeout=300)
        assert done.returncode == (verdict == "failed") and f"{verdict}: flash_forward" in done.stdout, done.stdout
        text = (tmp_path / "results" / "study" / kernel / "writeup.md").read_text()
        assert f"ran from {tmp_path}" in text and f"python3 {HERE / 'bench_attention.py'} --impl" in text
        assert ("| WRONG: non-causal" in text) == (kernel == "no_mask") and "LoadError" not in text


def test_dry_run_prints_the_plan_with_an_estimate_and_runs_nothing(tmp_path, capsys):
    assert study.main(["--dry-run", "--device", "cpu", "--budget", "2h", "--results-dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "estimate " in out and "within --budget 2:00" in out and "dropped first" in out
    assert "[1/23] benchmarking_script (a)" in out and "python3 bench_e2e.py --size tiny" in out
    assert not any(tmp_path.iterdir())
    for name in PROBLEMS["2026"]:
        assert f"] {name}" in out, name
    assert "needs your kernel" in out
    assert study.main(["--dry-run", "--device", "cpu", "--handout", "2025", "--results-dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    for name in PROBLEMS["2025"]:
        assert f"] {name}" in out, name
    assert "gradient_checkpointing" not in out and "needs your kernel" in out


def test_2025_times_forward_and_backward_and_sizes_for_them():
    """2025's benchmarking_script asks for forward and backward passes, no optimizer: 8 bytes of state per
    parameter, so on 40 GB 2.7B fits there but not in the training step of torch_compile (b)."""
    for h, mode in (("2025", "--mode forward-backward"), ("2026", None)):
        machine = {"device": "cuda", "name": "GPU", "free_bytes": 39.5 * 2**30, "nsys": None,
                   "states": study.predicted_states(h)}
        commands = {c.name: c for p in study.build_plan(study.parse_args(["--handout", h]), machine)
                    for c in p.commands}
        for name in (n for n in commands if n.startswith(("e2e_", "warmup_")) and not n.endswith("_all")):
            assert (mode in " ".join(commands[name].args)) if mode else "--mode" not in commands[name].args, name
        if h == "2025":
            assert not commands["e2e_2.7B"].skipped and "predicted state" in commands["compile_2.7B"].skipped


def test_nsys_profile_2026_profiles_each_size_at_its_own_longest_contexts(tmp_path):
    """Three powers of two > 128 per size, the largest the size's longest context that trained; fewer where fewer
    fit, said in the writeup; 1024 and its halves where the search did not run."""
    machine = {"device": "cuda", "name": "GPU", "free_bytes": 80e9, "nsys": "/usr/bin/nsys",
               "states": {"small": (2e9, 1e9), "medium": (7e9, 2e9)}}
    plan = study.build_plan(study.parse_args([]), machine)
    nsys = {size: next(c for p in plan for c in p.commands if c.name == f"nsys_{size}") for size in ("small", "medium")}
    s = study.Study(tmp_path)

    def contexts():  # what each size's nsys_run.sh command gets after --context-length
        argv = {size: s.argv(c, c.name) for size, c in nsys.items()}
        return {size: " ".join(a[a.index("--context-length") + 1:]) for size, a in argv.items()}
    assert contexts() == {"small": "256 512 1024", "medium": "256 512 1024"}
    longest = {"small": (128, 256, 512, 1024, 2048, 4096, 8192, 12288), "medium": (128, 256, 384)}
    records = [{"label": f"{size} ctx={c}", "config": {"size": size, "model": {"context_length": c}}, "status": "ok",
                "context_search": {"max_context": 16384}} for size, cs in longest.items() for c in cs]
    records.append({**records[-1], "label": "medium ctx=512", "status": "OOM",
                    "config": {"size": "medium", "model": {"context_length": 512}}})
    (tmp_path / "e2e").mkdir()
    (tmp_path / "e2e" / "context_max.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    s.ledger["context_max"] = {"status": "ok", "files": {"jsonl": "e2e/context_max.jsonl"}}
    assert contexts() == {"small": "2048 4096 8192", "medium": "256"}
    facts = study.facts_for("nsys_profile", records)
    assert "longest context that trained: small 12288; profiled at 2048, 4096, 8192" in facts
    assert "longest context that trained: medium 384; profiled at 256 (fewer than three powers of two > 128 fit)" \
        in facts


def test_budget_drops_the_largest_sizes_first_on_a_gpu():
    args = study.parse_args(["--budget", "1h", "--device", "cuda"])
    states = {"small": (2e9, 1e9), "medium": (7e9, 2e9), "large": (16e9, 3e9), "xl": (55e9, 6e9),
              "10B": (205e9, 9e9)}
    machine = {"device": "cuda", "name": "GPU", "free_bytes": 80e9, "nsys": None, "states": states}
    plan = study.build_plan(args, machine)
    commands = {c.name: c for p in plan for c in p.commands}
    assert "predicted state" in commands["e2e_10B"].skipped and "free GPU memory" in commands["e2e_10B"].skipped
    estimate = {c.name: c.estimate() for p in plan for c in p.commands}  # a dropped one's is 0 after
    dropped = study.apply_budget(plan, 3600, 1.0)
    assert dropped[0].endswith("_xl") and "e2e_small" not in dropped and "precision_demo" not in dropped
    kept = [c for p in plan for c in p.commands if not c.skipped]
    total = sum(c.estimate() for c in kept)
    assert total <= 3600 or not any(c.drop for c in kept)  # it fits, unless nothing droppable is left
    assert total + estimate[dropped[-1]] > 3600  # no more dropped than needed
    ranks = [(commands[name].drop, estimate[name]) for name in dropped]
    assert ranks == sorted(ranks, reverse=True)  # in the stated order: highest drop rank, then the longest
    assert all((c.drop, c.estimate()) <= min(ranks) for c in kept if c.drop)  # nothing kept outranks a drop


def test_memory_profiling_f_counts_the_compiled_block_beside_the_handouts_figure():
    """§3.2's command on a GPU, scaled down on a CPU; its fact read from mem_profile.py's record fields."""
    gpu = {"device": "cuda", "name": "GPU", "free_bytes": 80e9, "nsys": None,
           "states": {"small": (2e9, 1e9), "xl": (55e9, 6e9)}}
    for machine, shape in ((gpu, "--size xl --context-length 2048"),
                           (study.probe_machine("cpu", "2026"), "--size tiny --context-length 128")):
        plan = {p.key: p for p in study.build_plan(study.parse_args([]), machine)}
        command = " ".join(plan["memory_profiling_f"].commands[0].args)
        assert f"{shape} --num-heads 16 --mode forward --compile" in command, command
    record = {"label": "xl ctx=2048 forward fp32 naive compiled", "status": "skipped: measured peaks need CUDA",
              "config": {"batch_size": 4}, "block_compiled_saved_bytes": 3650.31 * 2**20,
              "block_compiled_saved_tensors": 18, "block_eager_saved_bytes": 7626.12 * 2**20,
              "block_eager_saved_tensors": 47}
    fact, = study.facts_for("memory_profiling_f", [record])
    assert "3650.31 MiB in 18 tensors compiled, 7626.12 MiB in 47 eager" in fact and "3651.31 MiB" in fact


def test_attention_facts_say_what_the_table_shows():
    """bench_attention.py's table: ms to 3 decimals, bytes in KiB/MiB/GiB; memory before backward where measured."""
    record = {"label": "sdpa d=16 seq=64 bf16", "status": "ok", "forward_ms_mean": 0.018, "forward_ms_std": 0.0024,
              "backward_ms_mean": 0.198, "backward_ms_std": 0.025, "saved_tensor_bytes": 26.62 * 2**10,
              "mem_before_backward_bytes": 3 * 2**20, "check": {"max_error": 3.87e-3}}
    fact, = study.facts_for("pytorch_attention", [record])
    assert fact == ("sdpa d=16 seq=64 bf16: forward 0.018 ms (std 0.002), backward 0.198 ms (std 0.025), "
                    "memory before backward 3.00 MiB, saved 26.62 KiB, max error 3.87e-03")


@pytest.mark.parametrize("key", ["benchmarking_mixed_precision_c", "torch_compile_b"])
def test_comparison_problems_state_each_variants_times(key):
    record = {"label": "small ctx=512 train bf16 naive compiled", "status": "ok", "forward_ms_mean": 10.0,
              "forward_ms_std": 0.1, "backward_ms_mean": 20.0, "backward_ms_std": 0.2, "optimizer_ms_mean": 5.0,
              "optimizer_ms_std": 0.05, "step_ms_mean": 35.0, "step_ms_std": 0.3}
    assert study.facts_for(key, [record, {"label": "small ctx=512 train fp32 naive", "status": "OOM"}]) == [
        "small ctx=512 train fp32 naive: OOM",
        "small ctx=512 train bf16 naive compiled: forward 10.00 ms (std 0.10), backward 20.00 ms (std 0.20), "
        "optimizer 5.00 ms (std 0.05), step 35.00 ms (std 0.30)"]


@pytest.mark.parametrize("bad", [["--budget", "soon"], ["--budget", "0s"], ["--only", "nope"], ["--model", "no colon"],
                                 ["--out", ".."], ["--out", "."], ["--out", "-x"], ["--results-dir", "study.py"]])
def test_bad_input_is_one_line_and_exit_2(bad):
    done = run_study(*bad, "--dry-run", "--device", "cpu")
    assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1, done.stderr


def test_memory_facts_name_the_peaks_as_the_table_does():
    record = {"label": "small ctx=128 train fp32 naive", "status": "ok", "config": {},
              "peak_mem_allocated_bytes": 3 * 2**30, "peak_mem_reserved_bytes": 3.5 * 2**30}
    assert study.facts_for("memory_profiling_bcd", [record]) == [
        "small ctx=128 train fp32 naive: peak allocated 3.000 GiB, peak reserved 3.500 GiB"]


def test_checkpointing_runs_our_model_with_a_note_when_yours_is_given(tmp_path, capsys):
    """mem_profile.py refuses --checkpoint with --model yours: the commands run ours, and the note says so."""
    assert study.main(["--dry-run", "--device", "cpu", "--model", "my_lm:make", "--optimizer", "my_opt:AdamW",
                       "--only", "gradient_checkpointing", "--results-dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    line = next(x for x in out.splitlines() if x.strip().startswith("checkpoint:"))
    assert "--checkpoint 0 1 2" in line and "--model" not in line and "--optimizer my_opt:AdamW" in line
    assert "note: --checkpoint changes model.TransformerLM only" in out


def test_out_naming_a_study_with_other_settings_is_refused(tmp_path):
    root = tmp_path / "study" / "s1"
    root.mkdir(parents=True)
    (root / "settings.json").write_text(json.dumps({"handout": "2026", "quick": False, "device": "cpu", "model": None,
                                                    "optimizer": None, "impl": None}))
    argv = ["--dry-run", "--device", "cpu", "--results-dir", str(tmp_path), "--out", "s1"]
    assert run_study(*argv).returncode == 0
    done = run_study(*argv, "--handout", "2025", "--model", "lm2:make", "--adapters", "tests.adapters")
    assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert "handout 2026 -> 2025, model None -> lm2:make, adapters None -> tests.adapters" in done.stderr
    assert "--fresh" in done.stderr  # the study predates --adapters in its settings: that one was None
    assert run_study(*argv, "--handout", "2025", "--fresh").returncode == 0


def test_a_recorded_command_whose_files_are_gone_runs_again(tmp_path):
    root = tmp_path / "study" / "s"
    root.mkdir(parents=True)
    (root / "settings.json").write_text(json.dumps({"handout": "2026", "quick": True, "device": "cpu", "model": None,
                                                    "optimizer": None, "impl": None}))
    files = {"md": "precision/toy_autocast.md", "jsonl": "precision/toy_autocast.jsonl"}  # deleted since
    (root / "study.jsonl").write_text(json.dumps({"name": "toy_autocast", "stem": "toy_autocast", "command": "x",
                                                  "rc": 0, "seconds": 1.0, "files": files, "status": "ok"}) + "\n")
    done = run_study("--quick", "--device", "cpu", "--only", "benchmarking_mixed_precision_ab", "--results-dir",
                     str(tmp_path), "--out", "s", timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "toy_autocast: recorded, but precision/toy_autocast.md, precision/toy_autocast.jsonl missing" in done.stdout
    entry = ledger(root)[-1]
    assert entry["status"] == "ok" and all((root / f).is_file() for f in entry["files"].values())
    assert "| " in (root / "writeup.md").read_text()


def pdf_text(latex: str, folder: Path) -> str:
    """`latex` compiled by the writeup's preamble, as pdftotext reads it back."""
    if not (shutil.which("pdflatex") and shutil.which("pdftotext")):
        pytest.skip("pdflatex or pdftotext is not installed")
    (folder / "w.tex").write_text(latex)
    env, *command = shlex.split(results.PDFLATEX)
    done = subprocess.run([*command, "w.tex"], cwd=folder, capture_output=True, text=True, timeout=120,
                          env={**os.environ, **dict([env.split("=")])})
    assert done.returncode == 0, done.stdout[-2000:]
    return subprocess.run(["pdftotext", "-layout", "w.pdf", "-"], cwd=folder, capture_output=True, text=True).stdout


def test_latex_keeps_double_hyphens_of_flags_in_text_and_tables(tmp_path):
    latex = study.md_to_tex("# Study\n\nRun it with --quick.\n\n| flag | seconds |\n|---|---|\n"
                            "| [CUDA memcpy Host-to-Device] | 2 |\n| --steps 2 | 1 |\n")  # "[": not \midrule's width
    assert "--" not in latex.replace("\\begin{tabular}", "")
    document = "\n".join(["\\documentclass{article}\\usepackage{booktabs}\\usepackage{graphicx}",
                          "\\usepackage[T1]{fontenc}\\begin{document}", latex, "\\end{document}"])
    text = pdf_text(document, tmp_path)
    assert "Run it with --quick." in text and "--steps 2" in text and "[CUDA memcpy Host-to-Device]" in text, text


def test_a_verbatim_line_that_would_end_the_verbatim_is_printed_as_text(tmp_path):
    latex = study.md_to_tex("# Study\n\n```\n# \\end{verbatim}\\input{/etc/hostname}\n```\n")
    document = "\n".join(["\\documentclass{article}\\usepackage[T1]{fontenc}\\begin{document}", latex,
                          "\\end{document}"])
    text = pdf_text(document, tmp_path)
    assert "input{/etc/hostname}" in text and socket.gethostname() not in text.replace("etc/hostname", "")


def test_latex_shrinks_a_wide_table_and_leaves_a_narrow_one_at_its_size(tmp_path):
    narrow, wide = (f"| {' | '.join(cells)} |\n|{'---|' * 7}\n| {' | '.join(cells)} |\n"
                    for cells in ([f"c{i}" for i in range(7)], [f"column{i}" * 4 for i in range(7)]))
    latex = study.md_to_tex(f"# Study\n\nPlain text.\n\n{narrow}\n{wide}")
    document = "\n".join(["\\documentclass{article}\\usepackage{booktabs}\\usepackage{graphicx}",
                          "\\usepackage[T1]{fontenc}\\begin{document}", latex, "\\end{document}"])
    pdf_text(document, tmp_path)
    boxes = subprocess.run(["pdftotext", "-bbox", "w.pdf", "-"], cwd=tmp_path, capture_output=True, text=True).stdout
    height = {word: float(y1) - float(y0) for y0, y1, word in
              re.findall(r'yMin="([\d.]+)" xMax="[\d.]+" yMax="([\d.]+)">(\w+)</word>', boxes)}
    assert abs(height["c0"] - height["Plain"]) < 0.5 and height["column0column0column0column0"] < height["Plain"]


def test_latex_wraps_long_commands_and_never_continues_a_comment_with_a_backslash(killed_and_resumed):
    long = "python3 bench_e2e.py " + "--size tiny " * 12
    latex = study.md_to_tex(f"```\n# ok, 57 s: {'a long cause ' * 12}\n{long}\n```\n")
    code = latex.split("\\begin{verbatim}\n")[1].split("\n\\end{verbatim}")[0].splitlines()
    comments = [line for line in code if line.startswith("#")]
    command = code[len(comments):]
    assert code[:len(comments)] == comments and len(comments) > 1 and len(command) > 1 and "#" not in "".join(command)
    assert all(line.endswith("\\") for line in command[:-1]) and not any(line.endswith("\\") for line in comments)
    assert " ".join(line.rstrip("\\").strip() for line in command) == long.strip()  # the same words, in order
    assert max(map(len, code)) <= study.CODE_WIDTH  # within the page: a cut command would run another
    text = (killed_and_resumed["root"] / "writeup.md").read_text().splitlines()
    for entry in killed_and_resumed["after"]:  # the status above its command
        assert text[text.index(entry["command"]) - 1] == f"# ok, {entry['seconds']:.0f} s"


def test_benchmarking_script_is_each_handouts_own_with_the_optimizer_step_in_2026():
    cpu = study.probe_machine("cpu", "2026")
    plans = {h: {p.key: p.deliverable for p in study.build_plan(study.parse_args(["--handout", h]), cpu)}
             for h in ("2025", "2026")}
    assert "optimizer" not in plans["2025"]["benchmarking_script_a"] + plans["2025"]["benchmarking_script_b"]
    assert "full training steps with the optimizer step" in plans["2026"]["benchmarking_script_a"]
    assert plans["2026"]["benchmarking_script_b"].startswith("Forward, backward and optimizer step time")
    train = {"config": {"size": "tiny"}, "status": "ok", "forward_ms_mean": 10.0, "forward_ms_std": 0.1,
             "backward_ms_mean": 20.0, "backward_ms_std": 0.2, "optimizer_ms_mean": 5.0, "optimizer_ms_std": 0.05,
             "step_ms_mean": 35.0, "step_ms_std": 0.3}
    assert study.facts_for("benchmarking_script_b", [train]) == [
        "tiny: forward 10.00 ms (std 0.10), backward 20.00 ms (std 0.20), optimizer 5.00 ms (std 0.05), "
        "step 35.00 ms (std 0.30), backward/forward 2.00x"]
    two_phases = {k: v for k, v in train.items() if not k.startswith(("optimizer", "step"))}
    assert study.facts_for("benchmarking_script_a", [two_phases]) == [
        "tiny: forward 10.00 ms (std 0.10), backward 20.00 ms (std 0.20), backward/forward 2.00x"]


def test_a_problem_of_one_command_draws_its_own_figures():
    """Several commands: report.py merges them and draws; one (a CPU's single d): the command itself draws."""
    pytest.importorskip("matplotlib")
    plan = {p.key: p for p in study.build_plan(study.parse_args(["--quick"]), study.probe_machine("cpu", "2026"))}
    for key in ("pytorch_attention", "benchmarking_script_a"):
        (command,) = plan[key].commands
        assert command.args.count("--plot") == 1, (key, command.args)


def test_quick_on_a_cpu_runs_the_training_steps_smaller_still():
    """bf16 has no fast kernels on most CPUs: --quick there checks bench_e2e's and mem_profile's paths at d_model
    64, in seconds (the compiled block keeps §3.2's 16 heads)."""
    gpu = {"device": "cuda", "name": "GPU", "free_bytes": 80e9, "nsys": None,
           "states": study.predicted_states("2026"), "gpus": 1}
    cpu = study.probe_machine("cpu", "2026")
    for machine, argv, smaller in ((cpu, ["--quick"], True), (cpu, [], False), (gpu, ["--quick"], False)):
        commands = [c for p in study.build_plan(study.parse_args(argv), machine) for c in p.commands
                    if c.script in ("bench_e2e.py", "mem_profile.py") and c.name != "block_compiled"]
        assert len(commands) >= 7 and all(("--d-model 64" in " ".join(c.args)) == smaller for c in commands)


def test_ddp_problems_run_bench_ddp_once_and_read_its_rows():
    for gpus, expected in ((2, "--size xl --context-length 512 --device cuda"), (0, "--size tiny")):
        machine = {"device": "cuda" if gpus else "cpu", "name": "GPU", "free_bytes": 80e9, "nsys": None,
                   "states": study.predicted_states("2025") if gpus else {}, "gpus": gpus}
        plan = {p.key: p for p in study.build_plan(study.parse_args(["--handout", "2025", "--adapters", "t.a"]),
                                                   machine)}
        (command,) = plan["naive_ddp_benchmarking"].commands
        assert command.script == "bench_ddp.py" and " ".join(command.args).startswith(expected), command.args
        assert "--adapters t.a" in " ".join(command.args) and plan["ddp_bucketed_benchmarking"].show == ["ddp"]
        assert not plan["ddp_bucketed_benchmarking"].commands and ("stand in" in plan[
            "naive_ddp_benchmarking"].note) == (gpus < 2)
    # the student's rows first, the references beside them; a share of a step is of the step it was measured in:
    # the profiled one (47.30 ms), not the timed rounds' median (14.96 ms), which would make 32.19 ms 215%
    row = {"experiment": "bench_ddp", "status": "ok", "step_ms": [14.0, 15.92, 14.96], "profiled_step_ms": 47.3}
    records = [{**row, "variant": "naive", "comm_ms": 4.0, "hidden_ms": 0.0},
               {**row, "variant": "overlap", "comm_ms": 4.0, "hidden_ms": 3.48},
               {**row, "variant": "bucketed 1 MB", "comm_ms": 4.0, "hidden_ms": 2.0},
               {**row, "variant": "torch", "status": "WRONG: lm_head.weight differs"},
               {**row, "variant": "ddp", "comm_ms": 32.19, "hidden_ms": 0.3},
               {**row, "variant": "ddp_bucketed 1 MB", "comm_ms": 8.0, "hidden_ms": 4.0}]
    facts = study.facts_for("ddp_overlap_individual_parameters_benchmarking", records)
    assert facts[:3] == [
        "ddp (yours): step 14.96 ms (median of the timed rounds); its profiled step 47.30 ms: communication 32.19 ms "
        "(68%), 1% of it hidden behind compute",
        "naive: step 14.96 ms (median of the timed rounds); its profiled step 47.30 ms: communication 4.00 ms (8%), 0% "
        "of it hidden behind compute",
        "overlap: step 14.96 ms (median of the timed rounds); its profiled step 47.30 ms: communication 4.00 ms (8%), "
        "87% of it hidden behind compute"]
    assert facts[-1] == ("ddp (yours) hides 1% of its communication; naive hides none; overlap hides 87% of its "
                         "communication")
    assert "torch: step 14.96 ms (median of the timed rounds); WRONG: lm_head.weight differs" in facts
    assert not any("bucketed" in fact for fact in facts)
    bucketed = study.facts_for("ddp_bucketed_benchmarking", records)  # 2025: yours, then the references
    assert [fact.split(":")[0] for fact in bucketed[:-1]] == ["ddp_bucketed 1 MB (yours)", "overlap", "bucketed 1 MB"]
    fsdp = {"variant": "fsdp", "status": "ok", "predicted": {"state_bytes": 2_000_000},
            "memory": [{"params": 250_000, "grads": 250_000, "optimizer_state": 1_500_000}] * 2,
            "layers": [[{"layer": 0, "all_gather_ms": 1.0, "slack_ms": -0.25}]] * 2}
    stub = {"variant": "fsdp", "status": "not implemented yet: write get_fsdp"}
    assert study.facts_for("fsdp_accounting", [{**fsdp, "variant": "fsdp2"}, fsdp]) == [
        "fsdp (yours): 2.00 MB of parameters, gradients and optimizer state on the largest rank, 1.00x the prediction; "
        "a layer's compute waited 0.250 ms for its all-gather", "fsdp2: 2.00 MB of parameters, gradients and "
        "optimizer state on the largest rank, 1.00x the prediction; a layer's compute waited 0.250 ms for its all-gather"]
    assert study.facts_for("fsdp_accounting", [{**fsdp, "variant": "fsdp2"}, stub])[0] == (
        "fsdp (yours): not implemented yet: write get_fsdp")
    # the sharded optimizer's state on the largest rank; a peak only where one was measured (CUDA)
    point = {"optimizer_state": 1_000_000, "total": 3_000_000}
    sharded = {"experiment": "bench_ddp", "kind": "memory", "variant": "sharded", "status": "ok",
               "expected_bytes_per_param": {"after optimizer step": 12}, "unmeasured": "peak memory (needs CUDA)",
               "ranks": [{"after optimizer step": point}, {"after optimizer step": {**point, "total": 3_500_000}}]}
    on_cuda = {**sharded, "ranks": [{"after optimizer step": {**point, "peak_mem_allocated_bytes": 4_250_000}}]}
    del on_cuda["unmeasured"]
    assert study.facts_for("optimizer_state_sharding_accounting", [sharded, on_cuda]) == [
        "sharded (yours): optimizer state 1.00 MB, in all 3.50 MB after the step on the largest rank (expected 12 "
        "bytes per parameter); peak not measured on this machine (needs CUDA)",
        "sharded (yours): optimizer state 1.00 MB, in all 3.00 MB after the step on the largest rank (expected 12 "
        "bytes per parameter); peak 4.25 MB"]


def test_collectives_run_on_nccl_with_two_gpus_and_on_gloo_at_small_sizes_otherwise():
    key = "distributed_communication_single_node"
    for gpus, quick, expected in ((8, False, "--backend nccl"), (8, True, "--backend nccl --sizes-mb 1 10 100 "),
                                  (1, False, "--backend gloo --sizes-mb 0.1 1 10 --world-sizes 2 4"),
                                  (0, True, "--backend gloo --sizes-mb 0.01 0.1 1 10 --world-sizes 2 --reps 5")):
        machine = {"device": "cuda" if gpus else "cpu", "name": "GPU", "free_bytes": 80e9, "nsys": None,
                   "states": study.predicted_states("2026") if gpus else {}, "gpus": gpus}
        plan = {p.key: p for p in study.build_plan(study.parse_args(["--quick"] * quick), machine)}
        (command,) = plan[key].commands
        assert command.script == "bench_comm.py" and " ".join(command.args).startswith(expected), command.args
        assert ("stands in" in plan[key].note) == (gpus < 2)
    assert key in {p.key for p in study.build_plan(study.parse_args(["--handout", "2025"]), machine)}
    record = {"label": "all_reduce 1 MB x2 nccl", "status": "ok", "ms_median": 0.0421, "busbw_gbps": 23.75,
              "of_link_peak": 0.0264, "link": "NVLink 5 (B200)"}
    assert study.facts_for(key, [record]) == ["all_reduce 1 MB x2 nccl: median 0.042 ms, busbw 23.750 GB/s "
                                              "(3% of NVLink 5 (B200))"]


PARENT = """import pathlib, sys, study
ledger = study.Study(pathlib.Path(sys.argv[1]))
ledger.argv = lambda cmd, stem: [sys.executable, "-c",
                                 "import os, time; print(os.getpid(), flush=True); time.sleep(300)"]
ledger.run(study.Command("sleeper", "bench_e2e.py", []))
"""


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGHUP])
def test_a_killed_study_takes_its_running_command_with_it(sig, tmp_path):
    """kill -9, or the terminal closed: the command it was running (in a session of its own, out of reach of
    the terminal's signals) ends too, never measuring beside the next run."""
    parent = subprocess.Popen([sys.executable, "-c", PARENT, str(tmp_path)], cwd=HERE, stderr=subprocess.PIPE,
                              preexec_fn=hangup_as_in_a_terminal)
    log, deadline = tmp_path / "logs" / "sleeper.log", time.time() + 60
    while not (log.is_file() and log.read_text().strip()) and time.time() < deadline:
        time.sleep(0.05)
    child = int(log.read_text())
    parent.send_signal(sig)
    parent.wait(timeout=60)
    while Path(f"/proc/{child}").exists() and "Z" not in Path(f"/proc/{child}/stat").read_text().split()[2] \
            and time.time() < deadline:
        time.sleep(0.05)
    assert not Path(f"/proc/{child}").exists() or Path(f"/proc/{child}/stat").read_text().split()[2] == "Z"
    assert b"Traceback" not in parent.stderr.read()


HOSTILE = "float32 | forged cell\n```\n\\input{/etc/passwd}\\end{verbatim}\\write18{touch pwned}{\u202eevil\x00"


def compiled(root: Path) -> subprocess.CompletedProcess:
    """writeup.tex compiled as docs/study.md says (results.PDFLATEX)."""
    env, *command = shlex.split(results.PDFLATEX)
    return subprocess.run([*command, "writeup.tex"], cwd=root, capture_output=True, text=True, timeout=120,
                          env={**os.environ, **dict([env.split("=")])})


def test_a_hand_edited_record_and_table_are_text_in_the_writeup_never_markup(killed_and_resumed, tmp_path, capsys):
    root = tmp_path / "study" / "s"
    shutil.copytree(killed_and_resumed["root"], root)
    (root / "study.lock").unlink(missing_ok=True)
    record = root / "precision" / "precision_demo.jsonl"
    rows = [json.loads(line) for line in record.read_text().splitlines()]
    rows[0]["accumulator_dtype"] = HOSTILE  # a dtype: it reaches the measured facts
    record.write_text("".join(json.dumps(r) + "\n" for r in rows))
    md = root / "precision" / "precision_demo.md"  # and the script's table, edited: a row, a stray fence, a figure
    md.write_text(md.read_text() + "\n| " + results.md_cell(HOSTILE) + " | 2 |\n\n```\n"
                  "![x](/etc/passwd)\n![y](../../escape.png)\n")
    argv = ["--quick", "--device", "cpu", "--only", *ONLY, "--results-dir", str(tmp_path), "--out", "s"]
    assert study.main(argv) == 0, capsys.readouterr()
    text = (root / "writeup.md").read_text()
    assert "\u202e" not in text and "\x00" not in text
    (row,) = [line for line in text.splitlines() if line.startswith("|") and "forged" in line]
    assert len(re.findall(r"(?<!\\)\|", row.replace("\\\\", ""))) == 3  # the row's own: 2 cells, not 3
    assert "float32 | forged cell \\`\\`\\` \\\\input{/etc/passwd}" in text  # the fact: one line, escaped
    tex = (root / "writeup.tex").read_text()
    assert "\\input{" not in tex and "\\write18" not in tex and "\\includegraphics[width=\\linewidth]{/" not in tex
    assert "{../" not in tex and tex.isascii()
    if not shutil.which("pdflatex"):
        pytest.skip("pdflatex is not installed")
    done = compiled(root)
    assert done.returncode == 0, done.stdout[-2000:]
    assert "root:" not in done.stdout and not (root / "pwned").exists()


def write_ledger(root: Path, *entries) -> None:
    root.mkdir(parents=True, exist_ok=True)
    (root / "settings.json").write_text(json.dumps({"handout": "2026", "quick": True, "device": "cpu", "model": None,
                                                    "optimizer": None, "impl": None}))
    (root / "study.jsonl").write_text("".join(e if isinstance(e, str) else json.dumps(e) + "\n" for e in entries))


def entry(name: str, **fields) -> dict:
    return {"name": name, "stem": name, "command": "python3 x.py", "rc": 0, "seconds": 1.0, "status": "ok",
            "files": {"md": f"precision/{name}.md"}, **fields}


def test_a_ledger_naming_files_outside_the_study_or_of_another_type_is_reported_and_the_good_lines_kept(
        tmp_path, capsys):
    root = tmp_path / "study" / "s"
    (root / "precision").mkdir(parents=True)
    (root / "precision" / "good.md").write_text("| a |\n|---|\n| 1 |\n")
    (root / "precision" / "link.md").symlink_to("/etc/passwd")
    lines = [entry("good"), entry("up", files={"md": "../../x.md"}), entry("absolute", files={"md": "/etc/passwd"}),
             entry("link", files={"md": "precision/link.md"}), entry("flash_check", files={"md": "/etc/passwd"}),
             entry("typed", seconds="fast"), entry("status", status=5), "[1, 2]\n", "{not json\n",
             entry("cut", files={"md": "precision/good.md"})]
    write_ledger(root, *lines)
    before = (root / "study.jsonl").read_text()
    assert study.main(["--quick", "--device", "cpu", "--only", "flash_forward", "--results-dir", str(tmp_path),
                       "--out", "s"]) == 0
    err = capsys.readouterr().err.splitlines()
    refused = [line for line in err if "ignored (its command runs again)" in line]
    assert len(refused) == 8 and sum("not inside the study folder" in line for line in refused) == 4
    assert study.Study(root).ledger.keys() == {"good", "cut"}
    assert (root / "study.jsonl").read_text() == before  # nothing recorded is lost
    assert "root:" not in (root / "writeup.md").read_text() + (root / "writeup.tex").read_text()


def test_a_full_disk_or_read_only_folder_is_one_line_and_the_study_resumes(tmp_path, capsys, monkeypatch):
    argv = ["--quick", "--device", "cpu", "--only", "flash_forward", "--results-dir", str(tmp_path), "--out", "s"]
    root, write_text, replace_text = tmp_path / "study" / "s", Path.write_text, results.replace_text

    def full(path, *args, **kwargs):
        if Path(path).name.startswith((".study.lock", "writeup")):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return (write_text if isinstance(path, Path) and args else replace_text)(path, *args, **kwargs)

    def read_only(*_):
        raise OSError(errno.EROFS, os.strerror(errno.EROFS))

    for patch, failing, code in ((Path, "write_text", 2), (study.os, "link", 2), (results, "replace_text", 1)):
        with monkeypatch.context() as m:
            m.setattr(patch, failing, read_only if failing == "link" else full)
            try:
                status = study.main(argv)
            except SystemExit as exc:
                status = exc.code
        err = capsys.readouterr().err
        assert status == code and len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
        assert ("No space left" if failing != "link" else "Read-only") in err
        assert not (root / "study.lock").exists() and not list(root.glob(".study.lock*"))  # no lock left behind
    assert study.main(argv) == 0 and (root / "writeup.tex").is_file()


def fake_bench_ddp(monkeypatch, rows: list) -> None:
    """Every command of the study a no-op; bench_ddp.py's writes `rows` as its records and table."""
    def argv(self, cmd, stem):
        if cmd.script == "bench_ddp.py":
            (self.root / "ddp").mkdir(parents=True, exist_ok=True)
            (self.root / "ddp" / f"{stem}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
            (self.root / "ddp" / f"{stem}.md").write_text("| variant | check |\n|---|---|\n" + "".join(
                f"| {r['variant']} | {r['status']} |\n" for r in rows))
        return ["true"]
    monkeypatch.setattr(study.Study, "argv", argv)


def test_the_courses_stub_is_not_implemented_yet_on_its_problem_alone_and_a_failed_problem_exits_1(
        tmp_path, monkeypatch, capsys):
    """The 2026 adapters ship get_fsdp as `raise NotImplementedError`: its row and fsdp_accounting say so, every
    other problem of the run passes, the study exits 0; a WRONG row of yours fails its problem alone, with the
    reason on the Checks line, and the study exits 1 with its writeup written."""
    row = {"experiment": "bench_ddp", "status": "ok", "step_ms": [10.0, 11.0], "profiled_step_ms": 12.0,
           "comm_ms": 3.0, "hidden_ms": 1.0}
    rows = [{**row, "variant": name} for name in ("naive", "flat", "overlap", "torch", "nocomm", "ddp", "fsdp2")]
    stub = {"experiment": "bench_ddp", "variant": "fsdp", "status": "not implemented yet: write get_fsdp"}
    argv = ["--quick", "--device", "cpu", "--adapters", "tests.adapters", "--results-dir", str(tmp_path), "--only"]
    fake_bench_ddp(monkeypatch, [*rows, stub])
    assert study.main([*argv, "naive_ddp_benchmarking", "--out", "stub"]) == 0
    out = capsys.readouterr().out
    passed = out.split("passed: ")[1].split("\n")[0]
    for title in ("naive_ddp_benchmarking (DDP)", "minimal_ddp_flat_benchmarking (DDP flat)",
                  "ddp_overlap_individual_parameters_benchmarking (a), (b) (DDP overlap)"):
        assert title in passed, out
    assert "optimizer_state_sharding_accounting" not in passed  # none of it ran: no sharded optimizer
    assert "failed: none" in out and "not implemented yet: fsdp_accounting (a), (b) (FSDP): write get_fsdp" in out
    text = (tmp_path / "study" / "stub" / "writeup.md").read_text()
    assert text.startswith("# CS336 assignment 2, part 2 (handout 2026)")  # only part 2 ran
    assert "fsdp_accounting (a), (b) (FSDP) not implemented yet: write get_fsdp" in text
    overlap = text.split("ddp_overlap_individual_parameters_benchmarking (a), (b)\n")[1].split("\n## ")[0]
    assert "- ddp (yours): step 10.50 ms" in overlap.split("Measured:")[1]

    wrong = {**row, "variant": "ddp", "status": "WRONG: lm_head.weight differs on rank 1 by up to 5.8"}
    fake_bench_ddp(monkeypatch, [*rows[:-2], wrong, rows[-1]])
    assert study.main([*argv, "naive_ddp_benchmarking", "mixed_precision_accumulation", "--out", "wrong"]) == 1
    out = capsys.readouterr().out
    assert ("failed: ddp_overlap_individual_parameters_benchmarking (a), (b) (DDP overlap): ddp: WRONG: "
            "lm_head.weight differs on rank 1 by up to 5.8\n") in out
    assert "naive_ddp_benchmarking (DDP)" in out.split("passed: ")[1].split("\n")[0]
    text = (tmp_path / "study" / "wrong" / "writeup.md").read_text()
    assert text.startswith("# CS336 assignment 2, parts 1 and 2 (handout 2026)")
    assert "(DDP overlap) failed: ddp: WRONG: lm_head.weight differs on rank 1" in text
