"""bench_comm.py: nccl-tests' bandwidths and the latency + bandwidth fit by hand; one run of 2 gloo ranks (started
by the script) in which rank 1 raises in the last row, which becomes that row; the table, the fit, the figure and
report.py's re-render from that run; after a failure, the rows left run in ranks started afresh (a scripted
SpawnedRanks); bad flags."""
import queue
import statistics
import sys
import textwrap
import types
from pathlib import Path

import pytest

import bench_comm
import common
import parallel
import report
from results import read_records
from test_parallel import bounded_run

HERE = Path(__file__).resolve().parent
RUN_TIMEOUT_S = 180  # a hang fails the test instead of the CI job

# The test aid: run as the main script, it makes rank 1's all_reduce of a buffer over 150 kB raise, then runs
# bench_comm. Started ranks import the main script again (spawn), so the patch is in every rank.
FAILING_RANK_DRIVER = textwrap.dedent(f"""
    import sys
    sys.path.insert(0, {str(HERE)!r})
    import torch.distributed as dist
    real_all_reduce = dist.all_reduce

    def all_reduce(tensor, *args, **kwargs):
        if dist.get_rank() == 1 and tensor.numel() * 4 > 150_000:
            raise RuntimeError("injected failure")
        return real_all_reduce(tensor, *args, **kwargs)

    dist.all_reduce = all_reduce
    import bench_comm
    if __name__ == "__main__":
        sys.exit(bench_comm.main())
""")


# ---- the formulas, without processes ----


def test_bus_bandwidth_is_nccl_tests_algbw_times_its_factor():
    assert bench_comm.algbw_gbps(10**9, 0.5) == 2.0  # GB/s: 10^9 bytes
    for n, all_reduce, gather in ((2, 1.0, 0.5), (4, 1.5, 0.75), (6, 10 / 6, 5 / 6)):
        assert bench_comm.bus_factor("all_reduce", n) == pytest.approx(all_reduce)  # 2(n-1)/n
        assert bench_comm.bus_factor("all_gather_into_tensor", n) == pytest.approx(gather)  # (n-1)/n
        assert bench_comm.bus_factor("reduce_scatter_tensor", n) == pytest.approx(gather)
        assert bench_comm.busbw_gbps("all_reduce", n, 10**9, 0.5) == pytest.approx(2.0 * all_reduce)
    # the full buffer is a whole number of equal shards, at least one element per rank
    assert bench_comm.CommRun("all_gather_into_tensor", 1.0, 6, "gloo").numel == 249_996
    assert bench_comm.CommRun("reduce_scatter_tensor", 1e-7, 4, "gloo").numel == 4


def test_latency_bandwidth_fit_recovers_a_line():
    sizes = [1e6, 1e7, 1e8, 1e9]
    fit = report.latency_bandwidth_fit(sizes, [50e-6 + b / 20e9 for b in sizes])  # 50 us, 20 GB/s
    assert fit["alpha_s"] == pytest.approx(50e-6) and fit["beta_bytes_per_s"] == pytest.approx(20e9)
    assert fit["r2"] == pytest.approx(1.0) and fit["max_residual"] < 1e-9 and fit["bandwidth_bound"]
    noisy = report.latency_bandwidth_fit(sizes, [(50e-6 + b / 20e9) * k for b, k in zip(sizes, (1, 1.2, 1, 1))])
    assert 0.05 < noisy["max_residual"] < 0.2  # one point 20% above the line: the fit meets it part way


def test_three_sizes_given_in_any_order_recover_alpha_and_beta():
    sizes = [4e6, 1e4, 1e6]  # 10 kB-4 MB at 200 us + bytes / 2 GB/s: bytes / beta passes alpha from 0.4 MB
    fit = report.latency_bandwidth_fit(sizes, [200e-6 + b / 2e9 for b in sizes])
    assert fit["alpha_s"] == pytest.approx(200e-6) and fit["beta_bytes_per_s"] == pytest.approx(2e9)
    assert fit["bandwidth_bound"]
    small = [1e3, 1e4, 1e5]  # the same line below 0.4 MB: a beta, but every size latency-bound
    assert not report.latency_bandwidth_fit(small, [200e-6 + b / 2e9 for b in small])["bandwidth_bound"]


def test_a_fit_with_a_negative_alpha_or_a_low_r2_is_poor_and_never_bandwidth_bound():
    sizes = [1e5, 1e6, 1e7, 1e8]  # docs/bench_comm.md's 2 ranks of gloo under load: the 100 MB median above the line
    loaded = report.latency_bandwidth_fit(sizes, [0.189e-3, 0.598e-3, 9.042e-3, 156.418e-3])
    assert loaded["r2"] == pytest.approx(0.5985, abs=1e-4) and loaded["poor"] == "R^2 0.60"
    below = report.latency_bandwidth_fit(sizes[1:], [-100e-6 + b / 1e9 for b in sizes[1:]])  # a line below 0 at 0
    assert below["r2"] == pytest.approx(1.0) and below["poor"] == "a negative alpha"
    assert not loaded["bandwidth_bound"] and not below["bandwidth_bound"]


@pytest.mark.parametrize("sizes, seconds, why", [
    ([1e4, 1e5], [0.155e-3, 1.918e-3], "no fit: too few sizes (2; three or more)"),  # a line meets any two points
    ([1e6, 1e6, 1e7], [1e-3, 2e-3, 3e-3], "no fit: too few sizes (2; three or more)"),
    ([1e4, 1e5, 1e6], [3e-3, 2e-3, 1e-3], "no fit: time does not grow with size"),  # a negative beta
    ([1e4, 1e5, 1e6], [2e-3, 0.5e-3, 1.5e-3], "no fit: time does not grow with size"),  # the largest the faster
])
def test_a_fit_from_two_sizes_or_falling_times_is_refused(sizes, seconds, why):
    assert report.latency_bandwidth_fit(sizes, seconds) == {"refused": why}


def test_the_fit_table_says_why_there_is_no_fit():
    def record(op, mb, ms):
        return {"experiment": "bench_comm", "status": "ok", "bytes": mb * 10**6, "ms_median": ms,
                "config": {"op": op, "size_mb": mb, "world_size": 2, "backend": "gloo"}}
    rows = report.comm_fits([record("all_reduce", 0.01, 0.2), record("all_reduce", 0.1, 0.1),
                             *(record("all_gather_into_tensor", mb, 0.2 + mb / 2) for mb in (0.01, 1, 10))])
    assert rows[0] == {report.RUN_COLUMN: None, "backend": "gloo", "op": "all_reduce", "ranks": 2, "sizes": 2,
                       "fit": "no fit: too few sizes (2; three or more)"}
    assert rows[1]["beta GB/s"] == pytest.approx(2.0) and rows[1]["fit"] == "bandwidth-bound"


def test_link_peaks_per_direction():
    assert common.link_peak_gbps("NVIDIA H100 80GB HBM3") == (450.0, "NVLink 4 (H100/H200 SXM)")
    assert common.link_peak_gbps("NVIDIA B200")[0] == 900.0
    assert common.link_peak_gbps("NVIDIA A100-SXM4-80GB")[0] == 300.0
    assert common.link_peak_gbps("NVIDIA A100 80GB PCIe")[0] == 32.0
    assert common.link_peak_gbps("AMD EPYC 7B13") == (None, None)


def spawned_ranks(exitcodes: list[int | None], messages: list[dict]) -> parallel.SpawnedRanks:
    """A SpawnedRanks whose processes have these exit codes and whose queue holds these messages."""
    ranks = object.__new__(parallel.SpawnedRanks)
    ranks.context = types.SimpleNamespace(processes=[types.SimpleNamespace(exitcode=code) for code in exitcodes])
    ranks.messages = queue.SimpleQueue()
    for message in messages:
        ranks.messages.put(message)
    return ranks


def test_a_rank_that_died_is_the_cause_of_its_peers_failure():
    broken = {"ok": False, "index": 2, "status": "error on rank 0: RuntimeError: Connection closed by peer"}
    assert spawned_ranks([None, -9], [broken]).next_message(5) == {
        "ok": False, "index": 2, "status": "error on rank 1: process died (signal SIGKILL)"}
    raised = {"ok": False, "index": 2, "status": "error on rank 1: RuntimeError: injected failure"}
    assert spawned_ranks([None, 0], [raised]).next_message(5) == raised  # a rank that raised exits 0
    assert spawned_ranks([None, 3], []).next_message(5)["status"] == "error on rank 1: process died (exit code 3)"
    row = {"ok": True, "index": 0, "value": {}}
    assert spawned_ranks([None, None], [row]).next_message(5) == row
    assert spawned_ranks([None, None], []).next_message(0.1)["status"] == "timeout after 0.1 s: no rank answered"


def test_after_a_failed_row_the_rows_left_run_in_ranks_started_afresh(scripted_ranks):
    runs = [bench_comm.CommRun("all_reduce", mb, 2, "gloo") for mb in (0.01, 0.1, 0.2)]
    failed = {"ok": False, "index": 1, "status": "error on rank 1: RuntimeError: injected failure"}
    value = {"environment": {}, "rank_ms": [[1.0], [1.0]], "bytes": 40_000}
    scripted_ranks += [[{"ok": True, "index": 0, "value": value}, failed], [{"ok": True, "index": 0, "value": value}]]
    sweep = bench_comm.Sweep(types.SimpleNamespace(notes=[]), None, len(runs))
    sweep.spawned(runs, store=None)
    assert [batch for batch, _ in scripted_ranks.started] == [runs, runs[2:]]
    assert [r["status"] for r in sweep.records] == ["ok", failed["status"], "ok"]


# ---- one run of 2 gloo ranks ----


@pytest.fixture(scope="module")
def failing_rank_run(tmp_path_factory):
    """reduce_scatter_tensor and all_reduce at 0.01, 0.1, 0.2 MB on 2 ranks (one spawn); rank 1 raises in the
    0.2 MB all_reduce, the last row, which fails."""
    tmp = tmp_path_factory.mktemp("comm")
    (tmp / "driver.py").write_text(FAILING_RANK_DRIVER)
    cmd = [sys.executable, "driver.py", "--op", "reduce_scatter_tensor", "all_reduce", "--sizes-mb", "0.01", "0.1",
           "0.2", "--world-sizes", "2", "--warmup", "1", "--reps", "3", "--timeout", "60", "--out", "run",
           "--plot"]
    done = bounded_run(cmd, tmp, RUN_TIMEOUT_S)
    return tmp, done.returncode, done.stdout, done.stderr


def test_a_failing_rank_is_its_row_and_the_others_run(failing_rank_run):
    tmp, code, out, err = failing_rank_run
    assert code == 0, err[-3000:]
    records = read_records(tmp / "results" / "comm" / "run.jsonl")
    # rank 1's failure can reach the parent before rank 0's answer for the row before it: that row then runs
    # again in the ranks started afresh, after the failed one
    assert sorted((r["config"]["op"], r["config"]["size_mb"]) for r in records) == sorted(
        (op, size) for op in ("reduce_scatter_tensor", "all_reduce") for size in (0.01, 0.1, 0.2))
    (failed,) = [r for r in records if r["status"] != "ok"]
    assert failed["status"] == "error on rank 1: RuntimeError: injected failure"
    assert (failed["config"]["op"], failed["config"]["size_mb"]) == ("all_reduce", 0.2)
    assert "error on rank 1: RuntimeError: injected failure" in out  # the row in the table
    for r in (r for r in records if r is not failed):
        n, op = r["config"]["world_size"], r["config"]["op"]
        assert len(r["rank_ms"]) == 2 and all(len(samples) == 3 for samples in r["rank_ms"])  # every rank's
        median_s = statistics.median([ms for samples in r["rank_ms"] for ms in samples]) / 1e3
        assert r["bytes"] == round(r["config"]["size_mb"] * 10**6)
        assert r["algbw_gbps"] == pytest.approx(r["bytes"] / median_s / 1e9)
        factor = 2 * (n - 1) / n if op == "all_reduce" else (n - 1) / n  # 1 and 1/2 on 2 ranks
        assert r["busbw_gbps"] == pytest.approx(r["algbw_gbps"] * factor)
        assert f"{r['busbw_gbps']:.3f}" in out and r["of_link_peak"] is None  # no link figure for gloo on a CPU
    assert "alpha us" in out and "beta GB/s" in out
    fits = {row["op"]: row for row in report.comm_fits(records)}
    assert fits["all_reduce"]["sizes"] == 2 and fits["reduce_scatter_tensor"]["sizes"] == 3
    assert fits["all_reduce"]["fit"] == "no fit: too few sizes (2; three or more)" and fits["all_reduce"]["fit"] in out
    assert (tmp / "results" / "comm" / "run_time.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_report_renders_the_run_again(failing_rank_run, tmp_path):
    tmp = failing_rank_run[0]
    assert report.main([str(tmp / "results" / "comm" / "run.jsonl"), "--results-dir", str(tmp_path),
                        "--out", "again"]) == 0
    assert (tmp_path / "report" / "again.md").read_text() == (tmp / "results" / "comm" / "run.md").read_text()


# ---- the command line ----


@pytest.mark.parametrize("argv, message", [
    (["--world-sizes", "1"], "--world-sizes: a collective needs at least 2 ranks, got 1"),
    (["--op", "broadcast"], "invalid choice: 'broadcast'"),
    (["--sizes-mb", "0"], "must be a positive finite number"),
    (["--columns", "nope"], "--columns"),
])
def test_bad_flags_are_one_line_and_exit_2(argv, message, capsys):
    with pytest.raises(SystemExit) as exit_info:
        bench_comm.main(argv)
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and message in err and err.count("\n") == 1


def test_under_torchrun_the_world_is_torchruns(monkeypatch, capsys):
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(SystemExit) as exit_info:
        bench_comm.main(["--world-sizes", "4"])
    assert exit_info.value.code == 2 and "under torchrun the world is torchrun's (2 ranks)" in capsys.readouterr().err
    assert bench_comm.parse_args(["--backend", "gloo"])[0].world_sizes == [2]


def test_dry_run_plans_a_configuration_per_world_size(capsys):
    assert bench_comm.main(["--backend", "gloo", "--sizes-mb", "1", "10", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "1. gloo, 2 ranks: all_reduce 1 MB, all_reduce 10 MB" in out and "3. gloo, 6 ranks" in out
