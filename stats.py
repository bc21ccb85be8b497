"""The statistics of timings: summaries of raw samples, the order in which compared variants take their timed steps
(A B B A ...), paired speed-ups with a confidence interval, and the drift test on a control phase. torch-free:
report.py renders comparisons from saved records with it.

Why paired ratios: on a shared machine the speed of the machine drifts (other jobs, clocks, temperature) by far
more than the difference between two variants. When variant A's steps all run before B's, the drift lands on one
side of the ratio (bench_e2e once reported a 0.15x and, two minutes later, a 9.03x "speed-up" of torch.compile).
The sweep therefore times the variants of a comparison in alternating *rounds*: round r holds one block of steps of
every variant, in forward order in even rounds and reversed in odd ones (A B | B A | A B ...), so a drift that is
roughly linear over two rounds falls on both sides alike. Each round gives one ratio of the variants' block means,
measured under nearly the same conditions; the speed-up is the geometric mean of these per-round ratios, with a
Student-t interval on their logarithms (n = rounds, n - 1 degrees of freedom): a log-ratio is symmetric (A/B and B/A
have the same spread) and per-round ratios of times are closer to log-normal than normal. With one round there is
no interval; with fewer than MIN_ROUNDS_FOR_INTERVAL the interval is wide, as it should be.

torch.utils.benchmark (blocked autorange, median and IQR), triton.testing.do_bench (quantiles) and pyperf
(calibrated loops, stability warnings) summarise one function at a time; none of them pairs two variants' samples,
so the pairing and the interval are written here (no scipy: the t quantile below).
"""
from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import Any

CONFIDENCE = 0.95  # the speed-up's interval: two-sided, 95%
MIN_ROUNDS_FOR_INTERVAL = 2  # a t interval needs at least two per-round ratios (one degree of freedom)
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


def steps_per_block(step_s: float | None, steps: int, min_block_s: float, min_rounds: int = 4) -> int:
    """How many consecutive steps one variant takes before the next variant's turn: enough that a block lasts at
    least `min_block_s` (a switch between variants costs cold caches and another graph, and a CUDA synchronisation
    ~10 us: spread over a block, both stay small), but never so many that fewer than `min_rounds` rounds (paired
    ratios) remain. `step_s` is a warm-up step's time; None (no warm-up) gives blocks of one step."""
    if step_s is None or step_s <= 0:
        return 1
    wanted = math.ceil(min_block_s / step_s)
    return max(1, min(wanted, steps // min_rounds))


# ---- Student's t quantile (scipy is not a dependency) ----


def _incomplete_beta(a: float, b: float, x: float) -> float:
    """The regularised incomplete beta function I_x(a, b), by its continued fraction (modified Lentz; Numerical
    Recipes, 3rd ed., section 6.4), using the symmetry I_x(a, b) = 1 - I_{1-x}(b, a) where it converges faster."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    if x > (a + 1.0) / (a + b + 2.0):
        return 1.0 - _incomplete_beta(b, a, 1.0 - x)
    front = math.exp(math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log(1.0 - x)) / a
    tiny = 1e-300
    c, d = 1.0, 1.0 - (a + b) * x / (a + 1.0)
    d = 1.0 / (d if abs(d) > tiny else tiny)
    result = d
    for m in range(1, 300):
        for numerator in (m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m)),
                          -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1))):
            d = 1.0 + numerator * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + numerator / c
            c = c if abs(c) > tiny else tiny
            result *= c * d
        if abs(c * d - 1.0) < 1e-15:
            break
    return front * result


def t_cdf(t: float, df: int) -> float:
    """P(T <= t) for Student's t with `df` degrees of freedom."""
    tail = 0.5 * _incomplete_beta(df / 2.0, 0.5, df / (df + t * t))
    return 1.0 - tail if t >= 0 else tail


def t_quantile(p: float, df: int) -> float:
    """The t value below which a fraction `p` (0 < p < 1) of Student's t with `df` degrees of freedom lies, by
    bisection on t_cdf (to 1e-10)."""
    if not 0.0 < p < 1.0 or df < 1:
        raise ValueError(f"need 0 < p < 1 and df >= 1, got p={p}, df={df}")
    if p < 0.5:
        return -t_quantile(1.0 - p, df)
    low, high = 0.0, 1.0
    while t_cdf(high, df) < p:
        high *= 2.0
    while high - low > 1e-10:
        mid = (low + high) / 2.0
        low, high = (mid, high) if t_cdf(mid, df) < p else (low, mid)
    return (low + high) / 2.0


# ---- paired ratios ----


@dataclass(frozen=True)
class PairedRatio:
    """A speed-up from paired rounds: the geometric mean of the per-round ratios (baseline time / variant time, so
    above 1 is faster) and its `confidence` interval from a t on the log-ratios; low/high are None with one round."""

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
    """The speed-up of `variant` over `baseline` from per-round times (the same rounds, in order): ratio_r =
    baseline_r / variant_r; the geometric mean of the ratios and a t interval on their logs, mean(log r) +- t(n-1) *
    sd(log r) / sqrt(n), taken back with exp."""
    if len(baseline) != len(variant) or not baseline:
        raise ValueError(f"need the same non-zero number of rounds, got {len(baseline)} and {len(variant)}")
    logs = [math.log(b / v) for b, v in zip(baseline, variant)]
    centre = statistics.fmean(logs)
    if len(logs) < MIN_ROUNDS_FOR_INTERVAL:
        return PairedRatio(math.exp(centre), None, None, len(logs), confidence)
    half = t_quantile(0.5 + confidence / 2.0, len(logs) - 1) * statistics.stdev(logs) / math.sqrt(len(logs))
    return PairedRatio(math.exp(centre), math.exp(centre - half), math.exp(centre + half), len(logs), confidence)


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
    ratio = sum(baseline[f"{p}_ms_mean"] for p in phases) / sum(variant[f"{p}_ms_mean"] for p in phases)
    return PairedRatio(ratio, None, None, 0)


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
