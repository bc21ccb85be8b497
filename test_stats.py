"""stats.py: summaries, the order of interleaved rounds, paired speed-ups with their interval from known samples,
and the drift test. torch-free, so these run without it."""
import math
import statistics

import pytest

import stats


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
    assert stats.steps_per_block(0.0001, 20, 0.005) == 5  # 50 wanted, but at least 4 rounds must remain
    assert stats.steps_per_block(None, 10, 0.005) == 1  # no warm-up step to size it by
    with pytest.raises(ValueError):
        stats.block_sizes(0, 1)


@pytest.mark.parametrize("df, expected", [(1, 12.7062), (2, 4.3027), (4, 2.7764), (9, 2.2622), (30, 2.0423)])
def test_t_quantile_matches_the_tables(df, expected):
    assert stats.t_quantile(0.975, df) == pytest.approx(expected, abs=1e-4)
    assert stats.t_quantile(0.025, df) == pytest.approx(-expected, abs=1e-4)


def test_paired_ratio_and_its_interval_from_known_samples():
    baseline, variant = [10.0, 12.0, 11.0, 13.0], [5.0, 5.0, 5.5, 6.5]
    logs = [math.log(2.0), math.log(2.4), math.log(2.0), math.log(2.0)]
    centre, sd = statistics.fmean(logs), statistics.stdev(logs)
    half = 3.1824 * sd / 2  # t(0.975, 3 degrees of freedom) x sd / sqrt(4)
    found = stats.paired_ratio(baseline, variant)
    assert found.ratio == pytest.approx(math.exp(centre))  # the geometric mean of 2, 2.4, 2, 2
    assert (found.low, found.high) == (pytest.approx(math.exp(centre - half), rel=1e-4),
                                       pytest.approx(math.exp(centre + half), rel=1e-4))
    assert found.rounds == 4 and found.resolved is True and found.interval_text() == (
        f"{math.exp(centre - half):.2f}-{math.exp(centre + half):.2f}x")
    # the same ratio every round: no spread, a point interval
    exact = stats.paired_ratio([4.0, 8.0, 6.0], [2.0, 4.0, 3.0])
    assert exact.ratio == pytest.approx(2.0) and exact.low == pytest.approx(2.0) and exact.high == pytest.approx(2.0)
    # ratios on both sides of 1: not resolved
    mixed = stats.paired_ratio([10.0, 10.0, 10.0], [9.0, 11.0, 10.5])
    assert mixed.low < 1 < mixed.high and mixed.resolved is False
    # one round: a ratio, no interval
    single = stats.paired_ratio([10.0], [4.0])
    assert single.ratio == pytest.approx(2.5) and single.low is None and single.resolved is None
    with pytest.raises(ValueError):
        stats.paired_ratio([1.0, 2.0], [1.0])


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
    assert paired.ratio == pytest.approx(2.0) and paired.rounds == 2 and paired.low == pytest.approx(2.0)
    # measured apart (different groups): the ratio of the means, and no interval
    apart = stats.speedup(base, {**other, "pairing": {"group": "h", "rounds": [[0, 2], [2, 4]]}}, ("forward",))
    assert apart.rounds == 0 and apart.low is None and apart.ratio == pytest.approx(15.0 / 7.5)
    assert stats.speedup(record([3.0], [1.0]), record([1.0], [1.0]), ("forward",)).ratio == pytest.approx(3.0)


def test_drift_is_a_control_phase_moving_by_more_than_its_spread():
    steady = {"optimizer_ms": [50.0, 52.0, 49.0, 51.0, 50.0]}
    slowed = {"optimizer_ms": [80.0, 83.0, 79.0, 81.0, 82.0]}  # +61%: far beyond a spread of ~1 ms
    found = stats.drift(steady, slowed, "optimizer")
    assert found.phase == "optimizer" and found.change == pytest.approx(81.0 / 50.4 - 1)
    assert found.text() == "drift: optimizer changed by +61%"
    assert stats.drift(steady, {"optimizer_ms": [51.0, 50.0, 52.0, 49.5, 50.5]}, "optimizer") is None
    noisy = {"optimizer_ms": [30.0, 90.0, 40.0, 80.0, 60.0]}  # moved 19%, but within twice its standard error (11 ms)
    assert stats.drift(steady, noisy, "optimizer") is None
    # +3%: beyond twice its standard error (1 ms) but under DRIFT_MIN_CHANGE (5%)
    assert stats.drift(steady, {"optimizer_ms": [52.0, 52.0, 52.0, 52.0]}, "optimizer") is None
    many = {"optimizer_ms": [30.0, 90.0, 40.0, 80.0, 60.0] * 20}  # the same noise, 100 samples: the mean is sure
    assert stats.drift({"optimizer_ms": [50.0, 52.0, 49.0, 51.0, 50.0] * 20}, many, "optimizer").change > 0.15
    assert stats.drift({"optimizer_ms": [50.0]}, slowed, "optimizer") is None  # one sample: no spread to judge by
    assert stats.drift(steady, {"forward_ms": [1.0, 2.0]}, "optimizer") is None
