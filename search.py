"""The longest size that fits (bench_e2e's --context-length max): sizes doubling from a start until the first
out-of-memory error, then a bisection between the last size that ran and the first that ran out, to a stated
resolution and within a budget of probes; and the answer of a search, from its probes' records alone. torch-free:
the sweep plans the probes with it and report.py re-renders a saved search's answer with it.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from results import FINISHED, is_oom_status

SEARCH_START = 128  # the first probe; the study's contexts are powers of two from 128
RESOLUTION = 64  # the bisection's default step: the answer is a multiple of it (kernels like multiples of 64)
PROBE_BUDGET = 8  # bisection probes at most per search (from 64 to 65536 takes 10: 2^10 between)


def doubling_sizes(start: int, cap: int) -> list[int]:
    """start, 2 start, 4 start, ... up to the largest <= cap."""
    out = [start]
    while out[-1] * 2 <= cap:
        out.append(out[-1] * 2)
    return out


@dataclass
class Bisection:
    """Between `fits` (the longest size that ran) and `fails` (the shortest that ran out of memory): each probe
    tries the middle multiple of `resolution` strictly between them, until none is left (the limit is then known to
    within `resolution`) or `budget` probes have been spent."""

    fits: int
    fails: int
    resolution: int = RESOLUTION
    budget: int = PROBE_BUDGET
    probes: int = 0

    def next_size(self) -> int | None:
        """The next size to try, or None when the bisection is done (resolution reached or budget spent)."""
        low = self.fits // self.resolution + 1  # in units of resolution: the multiples strictly inside
        high = -(-self.fails // self.resolution) - 1
        if low > high or self.probes >= self.budget:
            return None
        return (low + high) // 2 * self.resolution

    def record(self, size: int, fits: bool) -> None:
        """A probe's outcome: it ran (the lower bound moves up) or ran out of memory (the upper bound moves down)."""
        self.probes += 1
        if fits:
            self.fits = max(self.fits, size)
        else:
            self.fails = min(self.fails, size)

    @property
    def resolved(self) -> bool:
        """Whether no multiple of the resolution is left between the bounds."""
        return self.fits // self.resolution + 1 > -(-self.fails // self.resolution) - 1


def answer(probes: list[dict[str, Any]], cap: int, resolution: int | None = None,
           budget: int | None = None) -> dict[str, Any]:
    """The answer of one search from its probes (each {"context_length", "status"}, in any order): the longest
    context that ran, the longest power of two that ran, the shortest that ran out of memory, whether the answer is
    conclusive, and the answer in words. `resolution` and `budget` are the bisection's (None: a search recorded
    before bisection existed: doubling only)."""
    probes = sorted(probes, key=lambda p: p["context_length"])
    fits = [p["context_length"] for p in probes if p["status"] in FINISHED]
    ooms = [p["context_length"] for p in probes if is_oom_status(p["status"])]
    others = [p for p in probes if p["status"] not in FINISHED and not is_oom_status(p["status"])]
    longest = max(fits) if fits else None
    powers = [n for n in fits if n & (n - 1) == 0]
    first_oom = min(ooms) if ooms else None
    out = {"longest_context": longest, "longest_power_of_two": max(powers) if powers else None,
           "first_oom": first_oom, "resolution": resolution, "conclusive": False}
    failed = others[0] if others else None
    if failed is not None and (first_oom is None or failed["context_length"] < first_oom):
        ctx, status = failed["context_length"], failed["status"]
        if status.startswith(("timeout", "process-group timeout")):
            out["answer"] = f"the longest within the time limit: {ctx} timed out, whether it fits is unknown"
        else:
            out["answer"] = f"inconclusive: {ctx} failed with an error, not an OOM (see its row)"
        if first_oom is not None and longest is not None:  # a bisection probe failed otherwise: bounds stand
            out["answer"] += f"; the limit lies between {longest} and {first_oom}"
        return out
    if first_oom is None:
        ended = longest is not None and longest >= doubling_sizes(SEARCH_START, cap)[-1]
        out["answer"] = (f"at least this: the search stops at --max-context {cap}" if ended
                         else "incomplete: the search was interrupted")
        return out
    if longest is None:
        out.update(conclusive=True, answer=f"none: OOM already at {first_oom}")
        return out
    out["conclusive"] = True
    if resolution is None:  # a search recorded before bisection: doubling only
        out["answer"] = f"the longest that fits: {first_oom} runs out of memory"
        return out
    if first_oom - longest <= resolution:
        out["answer"] = (f"the longest that fits, to within {resolution}: {first_oom} runs out of memory "
                         f"(the longest power of two: {out['longest_power_of_two']})")
        return out
    out["conclusive"] = False
    bisection_probes = sum(1 for p in probes if p["context_length"] & (p["context_length"] - 1))
    if budget is not None and bisection_probes >= budget:
        out["answer"] = (f"between {longest} and {first_oom}: the bisection spent its budget of {budget} probes "
                         "(--search-probes)")
    else:
        out["answer"] = f"between {longest} and {first_oom}: the bisection was interrupted"
    return out
