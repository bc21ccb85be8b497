"""The statistics of timings: summaries of raw samples, the order in which compared variants take their timed steps
(A B B A ...), paired speed-ups with a confidence interval, and the drift test on a control phase. torch-free:
report.py renders comparisons from saved records with it.

Why paired ratios: on a shared machine the speed of the machine drifts (other jobs, clocks, temperature) by far
more than the difference between two variants. When variant A's steps all run before B's, the drift lands on one
side of the ratio (bench_e2e once reported a 0.15x and, two minutes later, a 9.03x "speed-up" of torch.compile).
The sweep therefore times the variants of a comparison in alternating *rounds*: round r holds one block of steps of
every variant, in forward order in even rounds and reversed in odd ones (A B | B A | A B ...), so a drift that is
roughly linear over two rounds falls on both sides alike. Each round gives one ratio of the variants' block means,
measured under nearly the same conditions.

Why not their mean: on a loaded machine most rounds agree and a few do not, by a lot. A background process that
wakes during one variant's block and not the other's makes that round's ratio 5-17x where the others lie near 1.7
(bench_noise.py, docs/running.md): in one run, rounds of 10x and 17x put the geometric mean (the first estimator
here, with a Student-t interval) at 2.42x where the estimate below says 1.91x; five runs spread +-38% with it. The
speed-up is therefore the Hodges-Lehmann estimate of the per-round log-ratios (the median of their pairwise means,
the Walsh averages), with the Wilcoxon signed-rank interval (two order statistics of the same Walsh averages, the
exact null distribution up to EXACT_SIGNED_RANK_N rounds): distribution-free, so a few wild rounds move the estimate
little and reach an end of the interval only when their Walsh averages outnumber its depth k (one wild round at 10
rounds, three at 20), while with well-behaved rounds it is nearly as tight as the t interval (95% of its efficiency
under normality). Logs, because a ratio is symmetric there (A/B and B/A have the same spread). With fewer than
MIN_ROUNDS_FOR_INTERVAL rounds there is no 95% interval at all (with 5 rounds, all signs alike still happen by
chance 2/32 of the time).

torch.utils.benchmark (blocked autorange, median and IQR), triton.testing.do_bench (quantiles) and pyperf
(calibrated loops, stability warnings) summarise one function at a time; none of them pairs two variants' samples,
so the pairing and the interval are written here (no scipy: the signed-rank distribution below).
"""
from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import Any

CONFIDENCE = 0.95  # the speed-up's interval: two-sided, 95%
MIN_ROUNDS_FOR_INTERVAL = 6  # the fewest rounds whose signed-rank interval reaches 95% (signed_rank_depth)
EXACT_SIGNED_RANK_N = 50  # the exact null distribution up to this many rounds, the normal approximation beyond
MAX_ROUNDS = 500  # more rounds (--steps 5000 of a fast step) are merged in neighbouring groups: 125k Walsh averages
DRIFT_MIN_CHANGE = 0.05  # a control phase that moved by less than 5% is not called drift, whatever its spread


# ---- summaries of raw samples ----


def summarize(samples: list[float]) -> dict[str, float]:
    """Mean, sample standard deviation (n-1), median, min, max and coefficient of variation of `samples`.
    One sample has no standard deviation: std and cv are None, never a made-up 0."""
    if not samples:
        return {}
    mean = statistics.fmean(samples)
    std = statistics.stdev(samples) if len(samples) > 1 else None
    return {"mean": mean, "std": std, "median": statistics.median(samples), "min": min(samples),
            "max": max(samples), "cv": std / mean if std is not None and mean else None, "n": len(samples)}


# ---- the order of an interleaved comparison ----


def round_order(variants: int, round_index: int) -> list[int]:
    """Which variant runs when in round `round_index`: 0, 1, ..., n-1 in even rounds and the reverse in odd ones,
    so two variants give A B | B A | A B ... and three A B C | C B A | ...; every round holds each variant once."""
    order = list(range(variants))
    return order if round_index % 2 == 0 else order[::-1]


def block_sizes(steps: int, block: int) -> list[int]:
    """`steps` timed steps per variant taken in blocks of `block` consecutive steps: the size of each round's
    block (the last one may be shorter)."""
    if steps < 1 or block < 1:
        raise ValueError(f"steps and block must be positive, got {steps} and {block}")
    return [min(block, steps - start) for start in range(0, steps, block)]


def steps_per_block(step_s: float | None, steps: int, min_block_s: float,
                    min_rounds: int = MIN_ROUNDS_FOR_INTERVAL) -> int:
    """How many consecutive steps one variant takes before the next variant's turn: enough that a block lasts at
    least `min_block_s` (a switch between variants costs cold caches and another graph, and a CUDA synchronisation
    ~10 us: spread over a block, both stay small), but never so many that fewer than `min_rounds` rounds (paired
    ratios) remain. `step_s` is a warm-up step's time; None (no warm-up) gives blocks of one step."""
    if step_s is None or step_s <= 0:
        return 1
    wanted = math.ceil(min_block_s / step_s)
    return max(1, min(wanted, steps // min_rounds))


# ---- the Wilcoxon signed-rank interval (scipy is not a dependency) ----


def signed_rank_counts(n: int) -> list[int]:
    """The null distribution of the Wilcoxon signed-rank statistic T for n observations, as counts: counts[t] is
    the number of the 2**n sign patterns of the ranks 1..n whose positive ranks sum to t (each rank's sign a fair
    coin when the median is zero). A subset-sum count, built one rank at a time."""
    counts = [1] + [0] * (n * (n + 1) // 2)
    for rank in range(1, n + 1):
        for total in range(rank * (rank + 1) // 2, rank - 1, -1):
            counts[total] += counts[total - rank]
    return counts


def signed_rank_depth(n: int, confidence: float = CONFIDENCE) -> int | None:
    """How deep into the n(n+1)/2 sorted Walsh averages the `confidence` interval's ends lie: the interval runs
    from the k-th smallest to the k-th largest, for the largest k with P(T <= k - 1) <= (1 - confidence) / 2. None
    when even the widest (k = 1: the smallest and the largest) covers less, as with n < 6 at 95% (2 / 2**5 > 5%).
    Exact up to EXACT_SIGNED_RANK_N observations (as R's wilcox.test), then the normal approximation."""
    tail = (1.0 - confidence) / 2.0
    if n > EXACT_SIGNED_RANK_N:
        sd = math.sqrt(n * (n + 1) * (2 * n + 1) / 24.0)
        z = statistics.NormalDist().inv_cdf(1.0 - tail)
        return max(1, math.floor(n * (n + 1) / 4.0 - z * sd + 0.5))  # P(T <= k - 1 + 0.5): continuity-corrected
    counts, below, k = signed_rank_counts(n), 0, 0
    while (below + counts[k]) / 2 ** n <= tail:  # P(T <= k) still within the tail: the depth can be k + 1
        below += counts[k]
        k += 1
    return k or None


def walsh_averages(values: list[float]) -> list[float]:
    """Every (x_i + x_j) / 2 with i <= j, sorted: the Hodges-Lehmann estimate is their median, the signed-rank
    interval two of their order statistics."""
    return sorted((values[i] + values[j]) / 2.0 for i in range(len(values)) for j in range(i, len(values)))


# ---- paired ratios ----


@dataclass(frozen=True)
class PairedRatio:
    """A speed-up from paired rounds (baseline time / variant time, so above 1 is faster): the Hodges-Lehmann
    estimate over the per-round ratios and its `confidence` signed-rank interval (paired_ratio); low/high are None
    with fewer than MIN_ROUNDS_FOR_INTERVAL rounds."""

    ratio: float
    low: float | None
    high: float | None
    rounds: int
    confidence: float = CONFIDENCE

    @property
    def resolved(self) -> bool | None:
        """True when the interval lies wholly above or below 1 (the variants differ), False when it contains 1
        (the ratio is not resolved), None without an interval."""
        if self.low is None:
            return None
        return self.low > 1.0 or self.high < 1.0

    def interval_text(self) -> str | None:
        """'1.85-2.01x', or None without an interval."""
        return None if self.low is None else f"{self.low:.2f}-{self.high:.2f}x"


def paired_ratio(baseline: list[float], variant: list[float], confidence: float = CONFIDENCE) -> PairedRatio:
    """The speed-up of `variant` over `baseline` from per-round times (the same rounds, in order): with the
    log-ratios l_r = log(baseline_r / variant_r), the Hodges-Lehmann estimate (the median of the Walsh averages
    (l_i + l_j) / 2, i <= j) and the Wilcoxon signed-rank interval (signed_rank_depth: the k-th smallest and largest
    Walsh averages), taken back with exp."""
    if len(baseline) != len(variant) or not baseline:
        raise ValueError(f"need the same non-zero number of rounds, got {len(baseline)} and {len(variant)}")
    if len(baseline) > MAX_ROUNDS:  # n(n+1)/2 Walsh averages: merge neighbouring rounds, which stay paired
        group = math.ceil(len(baseline) / MAX_ROUNDS)
        baseline, variant = ([sum(times[i:i + group]) for i in range(0, len(times), group)]
                             for times in (baseline, variant))
    walsh = walsh_averages([math.log(b / v) for b, v in zip(baseline, variant)])
    centre = math.exp(statistics.median(walsh))
    depth = signed_rank_depth(len(baseline), confidence)
    if depth is None:
        return PairedRatio(centre, None, None, len(baseline), confidence)
    return PairedRatio(centre, math.exp(walsh[depth - 1]), math.exp(walsh[-depth]), len(baseline), confidence)


def round_times(record: dict[str, Any], phases: tuple[str, ...]) -> list[float] | None:
    """Per round of a record's pairing, the summed mean time of `phases` over the round's samples (ms); None when
    the record was not measured in rounds (an older run). `pairing["rounds"]` holds each round's [start, stop) in
    the `<phase>_ms` lists; `rounds_by_phase` overrides it per phase where the phases' samples are not aligned
    (bench_attention under do_bench, which decides its own counts)."""
    pairing = record.get("pairing")
    if not pairing or not all(f"{p}_ms" in record for p in phases):
        return None
    bounds = {p: pairing.get("rounds_by_phase", {}).get(p, pairing["rounds"]) for p in phases}
    return [sum(statistics.fmean(record[f"{p}_ms"][slice(*bounds[p][r])]) for p in phases)
            for r in range(len(pairing["rounds"]))]


def paired(baseline: dict[str, Any], variant: dict[str, Any]) -> bool:
    """Whether two records were measured as a pair: the same comparison group, the same number of rounds."""
    a, b = baseline.get("pairing"), variant.get("pairing")
    return bool(a and b and a["group"] == b["group"] and len(a["rounds"]) == len(b["rounds"]))


def speedup(baseline: dict[str, Any], variant: dict[str, Any], phases: tuple[str, ...]) -> PairedRatio:
    """The speed-up of `variant` over `baseline` over the summed `phases`: paired by round when the two were
    measured as a pair (paired_ratio), else the ratio of their means with no interval (rounds=0: unpaired)."""
    if paired(baseline, variant):
        return paired_ratio(round_times(baseline, phases), round_times(variant, phases))
    return PairedRatio(ratio_of_means(baseline, variant, phases), None, None, 0)


def ratio_of_means(baseline: dict[str, Any], variant: dict[str, Any], phases: tuple[str, ...]) -> float:
    """The baseline's summed mean time of `phases` over the variant's: what a reader computes from the table."""
    return sum(baseline[f"{p}_ms_mean"] for p in phases) / sum(variant[f"{p}_ms_mean"] for p in phases)


def means_outside(found: PairedRatio, baseline: dict[str, Any], variant: dict[str, Any],
                  phases: tuple[str, ...]) -> float | None:
    """The ratio of the two rows' means when it lies outside the paired speed-up's interval, else None. The table
    shows means and the speed-up is paired and median-based, so the two can disagree: when they do, a few slow
    steps (a recompile, a descheduled thread: see the rows' max) pull a mean, and the reader should be told
    rather than left to divide the columns and find another number."""
    if found.low is None:
        return None
    ratio = ratio_of_means(baseline, variant, phases)
    return None if found.low <= ratio <= found.high else ratio


def speedup_note(baseline: str, steps: str) -> str:
    """What a speed-up column means, said under every comparison table (bench_e2e's, bench_attention's)."""
    return (f"Speed-up = {baseline}'s time / the variant's (above 1: faster): for variants measured together, the "
            f"Hodges-Lehmann estimate over the per-round ratios of their interleaved {steps} (A B B A ...) with a "
            "95% Wilcoxon signed-rank interval (stats.py; not resolved when it contains 1), so it can differ from "
            "the ratio of the mean columns (notes say when it lies outside the interval); for rows measured apart, "
            "the ratio of the means.")


def interval_notes(unresolved: list[str], few_rounds: dict[str, tuple[int, str]], pulled: list[str],
                   calls: str) -> list[str]:
    """A comparison row's notes on its paired speed-ups: those whose interval contains 1 (`unresolved`), the
    variants with too few rounds for one (name -> (rounds, the option that gives more)), and those whose ratio of
    means lies outside it (`pulled`, "<speed-up> <ratio>x"; `calls`: "steps" or "calls", what a mean is over)."""
    notes = [f"not resolved (the interval contains 1): {', '.join(unresolved)}"] if unresolved else []
    notes += [f"{name}: {n} rounds, too few for a 95% interval ({knob} {MIN_ROUNDS_FOR_INTERVAL} or more)"
              for name, (n, knob) in few_rounds.items()]
    if pulled:
        notes.append(f"ratio of the means outside the interval (a few slow {calls} pull a mean): {', '.join(pulled)}")
    return notes


# ---- drift: a phase both variants run identically ----


@dataclass(frozen=True)
class Drift:
    """A control phase (the same work in both variants) that changed between them by more than its own spread."""

    phase: str
    change: float  # the variant's mean / the baseline's mean - 1

    def text(self) -> str:
        return f"drift: {self.phase} changed by {self.change:+.0%}"


def drift(baseline: dict[str, Any], variant: dict[str, Any], phase: str) -> Drift | None:
    """Drift between two records on a control `phase`: the difference of its means is more than twice its own
    spread, the standard error of that difference (Welch: sqrt(s_a^2/n_a + s_b^2/n_b)), and at least
    DRIFT_MIN_CHANGE of the baseline's mean. Since both variants run that phase identically, such a difference says
    the machine changed between them (or what ran before the phase did), and it lands in every other phase too. None
    when within the spread, or when a record lacks the phase or a spread (fewer than two samples)."""
    a, b = baseline.get(f"{phase}_ms"), variant.get(f"{phase}_ms")
    if not a or not b or len(a) < 2 or len(b) < 2:
        return None
    mean_a, mean_b = statistics.fmean(a), statistics.fmean(b)
    spread = math.sqrt(statistics.variance(a) / len(a) + statistics.variance(b) / len(b))
    if abs(mean_b - mean_a) > max(2 * spread, DRIFT_MIN_CHANGE * mean_a):
        return Drift(phase, mean_b / mean_a - 1.0)
    return None
