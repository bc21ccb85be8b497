"""results.py's statistics and tables: summaries, the order of interleaved rounds, paired speed-ups with their
interval against the classic critical-value tables, the drift test, the one comparison table and the run-settings
header."""
import math
import statistics

import pytest

import results as stats


def test_summarize():
    s = stats.summarize([1.0, 2.0, 3.0, 10.0])
    assert s["mean"] == 4.0 and s["median"] == 2.5 and s["min"] == 1.0 and s["n"] == 4
    assert s["std"] == pytest.approx(4.0825, abs=1e-4)  # sample (n-1) standard deviation
    one = stats.summarize([5.0])  # one sample has no standard deviation: None, not a made-up 0
    assert one["std"] is None and one["cv"] is None and one["mean"] == 5.0 and one["n"] == 1


def test_rounds_alternate_a_b_b_a_and_each_holds_every_variant_once():
    order = [v for r in range(4) for v in stats.round_order(2, r)]
    assert "".join("AB"[v] for v in order) == "ABBAABBA"
    assert [stats.round_order(3, r) for r in range(3)] == [[0, 1, 2], [2, 1, 0], [0, 1, 2]]
    # a drift linear in time adds the same to both sides over every pair of rounds: A at t=0 and 3, B at 1 and 2
    times = {v: [t for t, u in enumerate(order[:4]) if u == v] for v in (0, 1)}
    assert sum(times[0]) == sum(times[1])


def test_blocks_of_steps():
    assert stats.block_sizes(10, 3) == [3, 3, 3, 1]
    assert stats.block_sizes(4, 1) == [1, 1, 1, 1]
    assert stats.steps_per_block(0.5, 10, 0.005) == 1  # a long step: one per block
    assert stats.steps_per_block(0.001, 100, 0.005) == 5  # 5 steps of 1 ms make a 5 ms block
    assert stats.steps_per_block(0.0001, 24, 0.005) == 4  # 50 wanted, but 6 rounds must remain (a 95% interval)
    assert stats.steps_per_block(None, 10, 0.005) == 1  # no warm-up step to size it by


# the two-sided 5% critical values of the Wilcoxon signed-rank statistic from the classic tables; the interval's
# depth is one more (the k-th smallest to the k-th largest Walsh average); below 6 rounds there is none
@pytest.mark.parametrize("n, critical", [(6, 0), (7, 2), (8, 3), (9, 5), (10, 8), (12, 13), (15, 25), (20, 52),
                                         (25, 89), (30, 137)])
def test_signed_rank_depth_matches_the_tables(n, critical):
    assert stats.signed_rank_depth(n) == critical + 1


def test_signed_rank_distribution_and_its_normal_approximation(monkeypatch):
    assert stats.signed_rank_depth(5) is None and stats.MIN_ROUNDS_FOR_INTERVAL == 6
    assert stats.signed_rank_depth(6) == 1
    exact = stats.signed_rank_depth(stats.EXACT_SIGNED_RANK_N)  # 435: the table's 434 plus one
    monkeypatch.setattr(stats, "EXACT_SIGNED_RANK_N", 0)  # the approximation where the exact one ends: within one
    assert abs(stats.signed_rank_depth(50) - exact) <= 1
    assert stats.signed_rank_depth(200) == pytest.approx(200 * 201 / 4 - 1.96 * math.sqrt(200 * 201 * 401 / 24), abs=1)


def test_paired_ratio_and_its_interval_from_known_samples():
    # six rounds whose log-ratios are 0.1 .. 0.5 and one wild 5.0 (a round the machine disturbed on one side): the
    # 21 Walsh averages sorted are .1 .15 .2 .2 .25 .25 .3 .3 .3 .35 [.35] .4 .4 .45 .5 2.55 2.6 2.65 2.7 2.75 5.0
    logs = [0.1, 0.2, 0.3, 0.4, 0.5, 5.0]
    found = stats.paired_ratio([math.exp(x) for x in logs], [1.0] * 6)
    assert found.ratio == pytest.approx(math.exp(0.35))  # the 11th of 21; the geometric mean would be e^1.08 = 2.95
    assert (found.low, found.high) == (pytest.approx(math.exp(0.1)), pytest.approx(math.exp(5.0)))  # k = 1 at n = 6
    assert found.rounds == 6 and found.resolved is True and found.interval_text() == "1.11-148.41x"
    # ratio = baseline / variant: the variant twice as fast gives 2, whatever the rounds' absolute times
    exact = stats.paired_ratio([4.0, 8.0, 6.0, 4.0, 8.0, 6.0], [2.0, 4.0, 3.0, 2.0, 4.0, 3.0])
    assert exact.ratio == pytest.approx(2.0) and exact.low == pytest.approx(2.0) and exact.high == pytest.approx(2.0)
    # ratios on both sides of 1: not resolved
    mixed = stats.paired_ratio([10.0] * 6, [9.0, 11.0, 10.5, 9.5, 10.2, 9.8])
    assert mixed.low < 1 < mixed.high and mixed.resolved is False
    # ten rounds: the interval runs from the 9th to the 9th-last of the 55 Walsh averages
    ten = [0.01 * i for i in range(10)]
    walsh = sorted((a + b) / 2 for i, a in enumerate(ten) for b in ten[i:])
    tenth = stats.paired_ratio([math.exp(x) for x in ten], [1.0] * 10)
    assert tenth.low == pytest.approx(math.exp(walsh[8])) and tenth.high == pytest.approx(math.exp(walsh[-9]))
    assert tenth.ratio == pytest.approx(math.exp(0.045))  # symmetric samples: the centre
    # fewer than six rounds: an estimate, no interval
    five = stats.paired_ratio([10.0, 12.0, 11.0, 13.0, 12.0], [5.0, 5.0, 5.5, 6.5, 6.0])
    assert five.ratio == pytest.approx(2.0) and five.low is None and five.resolved is None
    single = stats.paired_ratio([10.0], [4.0])
    assert single.ratio == pytest.approx(2.5) and single.low is None and single.resolved is None
    with pytest.raises(ValueError):
        stats.paired_ratio([1.0, 2.0], [1.0])
    # thousands of rounds are merged in neighbours (still paired) before the n^2 Walsh averages: quick, and the same
    many = stats.paired_ratio([2.0 + (i % 7) * 0.01 for i in range(5001)], [1.0] * 5001)
    assert many.rounds == math.ceil(5001 / math.ceil(5001 / stats.MAX_ROUNDS)) and 2.0 < many.ratio < 2.07


def record(forward, backward, group=None, rounds=None):
    rec = {"forward_ms": forward, "backward_ms": backward,
           "forward_ms_mean": statistics.fmean(forward), "backward_ms_mean": statistics.fmean(backward)}
    if group:
        rec["pairing"] = {"group": group, "rounds": rounds}
    return rec


def test_speedup_pairs_by_round_and_falls_back_to_means_when_unpaired():
    # two rounds of two steps each: the machine halves its speed in the second round, for both variants alike
    base = record([10.0, 10.0, 20.0, 20.0], [20.0, 20.0, 40.0, 40.0], "g", [[0, 2], [2, 4]])
    other = record([5.0, 5.0, 10.0, 10.0], [10.0, 10.0, 20.0, 20.0], "g", [[0, 2], [2, 4]])
    assert stats.round_times(base, ("forward", "backward")) == [30.0, 60.0]
    paired = stats.speedup(base, other, ("forward", "backward"))
    assert paired.ratio == pytest.approx(2.0) and paired.rounds == 2 and paired.low is None  # 2 rounds: no interval
    # measured apart (different groups): the ratio of the means, and no interval
    apart = stats.speedup(base, {**other, "pairing": {"group": "h", "rounds": [[0, 2], [2, 4]]}}, ("forward",))
    assert apart.rounds == 0 and apart.low is None and apart.ratio == pytest.approx(15.0 / 7.5)
    assert stats.speedup(record([3.0], [1.0]), record([1.0], [1.0]), ("forward",)).ratio == pytest.approx(3.0)


def test_a_ratio_of_means_outside_the_paired_interval_is_found():
    # 20 rounds of one step: the variant twice as fast every round, but one of its steps took 200 ms (a recompile);
    # at 20 rounds the interval's ends lie 53 Walsh averages in, beyond the 20 that hold the wild round
    rounds = [[i, i + 1] for i in range(20)]
    wild = [5.0] * 20
    wild[7] = 200.0
    base = record([10.0] * 20, [20.0] * 20, "g", rounds)
    other = record(wild, [10.0] * 20, "g", rounds)
    found = stats.speedup(base, other, ("forward",))
    assert found.ratio == pytest.approx(2.0) and found.low == pytest.approx(2.0)  # the wild round moves nothing
    means = 10.0 / statistics.fmean(wild)  # 1.03x: what dividing the table's means gives
    base, other = ({**r, "status": "ok", "v": v} for r, v in ((base, "a"), (other, "b")))
    _, (row,), _ = stats.comparison_rows([base, other], lambda r: r["v"], lambda r: {}, {"fwd": ("forward",),
                                                                                       "bwd": ("backward",)})
    # no wild step in the backward: the means agree with the paired estimate
    assert row["notes"] == f"ratio of the means outside the interval (a few slow steps pull a mean): fwd b {means:.2f}x"
    few = [{**record([10.0], [1.0], "h", [[0, 1]]), "status": "ok", "v": "a"},
           {**record([1.0], [1.0], "h", [[0, 1]]), "status": "ok", "v": "b"}]
    _, (row,), _ = stats.comparison_rows(few, lambda r: r["v"], lambda r: {}, {"fwd": ("forward",)})
    assert "ratio of the means" not in row["notes"]  # no interval: nothing to be outside of


def test_drift_is_a_control_phase_moving_by_more_than_its_spread():
    steady = {"optimizer_ms": [50.0, 52.0, 49.0, 51.0, 50.0]}
    slowed = {"optimizer_ms": [80.0, 83.0, 79.0, 81.0, 82.0]}  # +61%: far beyond a spread of ~1 ms
    found = stats.drift(steady, slowed, "optimizer")
    assert found.phase == "optimizer" and found.change == pytest.approx(81.0 / 50.4 - 1)
    pair = [{"status": "ok", "v": v, "optimizer_ms": r["optimizer_ms"], "optimizer_ms_mean": statistics.fmean(
        r["optimizer_ms"])} for v, r in (("a", steady), ("b", slowed))]
    _, (row,), _ = stats.comparison_rows(pair, lambda r: r["v"], lambda r: {}, {"opt": ("optimizer",)},
                                         control="optimizer")
    assert "drift: optimizer changed by +61% (b)" in row["notes"]
    assert stats.drift(steady, {"optimizer_ms": [51.0, 50.0, 52.0, 49.5, 50.5]}, "optimizer") is None
    noisy = {"optimizer_ms": [30.0, 90.0, 40.0, 80.0, 60.0]}  # moved 19%, but within twice its standard error (11 ms)
    assert stats.drift(steady, noisy, "optimizer") is None
    # +3%: beyond twice its standard error (1 ms) but under DRIFT_MIN_CHANGE (5%)
    assert stats.drift(steady, {"optimizer_ms": [52.0, 52.0, 52.0, 52.0]}, "optimizer") is None
    many = {"optimizer_ms": [30.0, 90.0, 40.0, 80.0, 60.0] * 20}  # the same noise, 100 samples: the mean is sure
    assert stats.drift({"optimizer_ms": [50.0, 52.0, 49.0, 51.0, 50.0] * 20}, many, "optimizer").change > 0.15
    assert stats.drift({"optimizer_ms": [50.0]}, slowed, "optimizer") is None  # one sample: no spread to judge by
    assert stats.drift(steady, {"forward_ms": [1.0, 2.0]}, "optimizer") is None


def e2e_record(dtype: str, ctx: int, forward: list[float], status: str = "ok") -> dict:
    rounds = [[i, i + 1] for i in range(len(forward))]
    return {"status": status, "config": {"size": "tiny", "ctx": ctx, "dtype": dtype, "batch_size": 4},
            "forward_ms": forward, "forward_ms_mean": statistics.fmean(forward) if forward else None,
            "pairing": {"group": f"ctx{ctx}", "rounds": rounds}}


def test_the_comparison_table_pairs_variants_and_keeps_failed_rows():
    records = [e2e_record("fp32", 16, [10.0] * 20), e2e_record("bf16", 16, [5.0] * 19 + [50.0]),
               e2e_record("fp32", 32, [20.0] * 20), e2e_record("bf16", 32, [], status="OOM")]
    text = stats.comparison_table(records, lambda r: r["config"]["dtype"],
                                  lambda r: {"size": r["config"]["size"], "ctx": r["config"]["ctx"]},
                                  {"fwd": ("forward",)}, calls="steps")
    header, _, first, second = text.splitlines()[:4]
    assert [c.strip() for c in header.strip("|").split("|")] == [
        "size", "ctx", "fwd ms: fp32", "fwd ms: bf16", "fwd speed-up: bf16", "notes"]
    # 20 paired rounds, one wild: the estimate and the interval stay at 2x; the mean (7.25 ms) says otherwise
    assert "| 2.00x (2.00-2.00x) " in first and "7.25" in first and "ratio of the means outside" in first
    assert "| OOM " in second and "x (" not in second
    assert stats.comparison_table(records[:1], lambda r: "one", lambda r: {}, {"fwd": ("forward",)}) is None


def test_run_settings_say_what_the_rows_share_once_per_run():
    records = [{"config": {"batch_size": 4, "dtype": d}, "environment": {"device": "cpu", "device_name": "x",
                                                                      "torch": "2", "threads": 2}}
               for d in ("fp32", "bf16")]
    fields = {"batch": "batch_size", "dtype": "dtype", "sizes from": stats.sizes_from, "absent": "nothing"}
    (line,) = stats.environment_lines(records, fields)
    assert line == ("device: x (cpu) | torch 2 | 2 threads | batch: 4 | dtype: fp32 and bf16 | "
                    "sizes from: handout 2026 (v26.1.1)")  # a field no record has ("absent") is left out
    merged = [{**r, stats.RUN_KEY: name} for r, name in zip(records, ("mon", "tue"))]
    assert [line.split(":")[0] for line in stats.environment_lines(merged, fields)] == ["mon", "tue"]
