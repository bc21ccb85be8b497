"""Reading a CUDA caching-allocator snapshot without a GPU: the allocated-memory timeline rebuilt from the trace
and its peak, the largest allocations with the line of the user's own code that made them (this project's, or,
for anyone's snapshot, the code under the most common source root of its Python frames), what was live at the
peak, and a timeline PNG. Used by mem_profile.py (`--snapshot`, `--analyze`).

The snapshot is the dict torch.cuda.memory._snapshot() returns (the pickle pytorch.org/memory_viz loads); field
names as in torch/cuda/memory.py (`_snapshot` docstring) and torch/csrc/cuda/memory_snapshot.cpp:

    {"segments": [{"device", "address", "total_size",
                   "blocks": [{"address", "size", "requested_size",
                               "state": "active_allocated" | "active_pending_free" | "inactive", "frames"}]}],
     "device_traces": [[{"action": "alloc" | "free_requested" | "free_completed" | "segment_alloc"
                                   | "segment_free" | "segment_map" | "segment_unmap" | "oom" | "snapshot",
                         "addr", "size", "stream", "time_us",
                         "frames": [{"filename", "line", "name"}, ...]}],   # innermost frame first
                       ...]}                                               # one trace list per device

Trace sizes are requested bytes (the allocator records an alloc with the caller's size), the quantity of
torch.cuda.memory_stats()["requested_bytes.all.peak"]; torch.cuda.memory_allocated counts the allocator's blocks
instead (rounded up to 512 B, and a large block may keep up to 1 MiB of unsplit tail), which for large models
with AdamW state sits 2-3% above. The rebuilt level drops at free_requested, as memory_allocated does;
free_completed follows once other streams are done with the block. With
PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True, reserved memory grows and shrinks by segment_map and
segment_unmap (pages mapped into one growing segment) instead of segment_alloc and segment_free.
"""
from __future__ import annotations

import functools
import pickle
import re
from collections import Counter
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any, Iterable

PROJECT_ROOT = Path(__file__).resolve().parent
BEFORE_RECORDING = "(allocated before recording: weights, optimizer state, ...)"
PHASE_COLORS = {"forward": "tab:blue", "backward": "tab:orange", "optimizer": "tab:green"}
SEGMENT_ACTIONS = ("segment_alloc", "segment_free", "segment_map", "segment_unmap")


def load_snapshot(path: str | Path) -> dict[str, Any]:
    """A snapshot pickle as written by torch.cuda.memory._dump_snapshot (or pickle.dump of _snapshot())."""
    with open(path, "rb") as f:
        snapshot = pickle.load(f)
    if not isinstance(snapshot, dict) or "device_traces" not in snapshot:
        raise ValueError(f"{path} is not a CUDA memory snapshot (no 'device_traces'; record with "
                         "torch.cuda.memory._record_memory_history first)")
    traces, segments = snapshot["device_traces"], snapshot.get("segments", [])
    if not (isinstance(traces, list) and all(isinstance(t, list) for t in traces) and isinstance(segments, list)):
        raise ValueError(f"{path} is not a CUDA memory snapshot ('device_traces' must be a list of lists and "
                         "'segments' a list)")
    return snapshot


def device_trace(snapshot: dict[str, Any], device: int | None = None) -> tuple[int, list[dict[str, Any]]]:
    """(device index, its trace entries). device=None: the first device with a non-empty trace."""
    traces = snapshot.get("device_traces") or [[]]
    if device is None:
        device = next((i for i, trace in enumerate(traces) if trace), 0)
    if not 0 <= device < len(traces):
        raise ValueError(f"the snapshot has traces for devices 0..{len(traces) - 1}, not {device}")
    return device, traces[device]


def held_at_snapshot(snapshot: dict[str, Any], device: int) -> tuple[int, int] | None:
    """(allocated bytes, reserved bytes) on `device` when the snapshot was taken, from its segments; None when
    the snapshot has no segments. Allocated counts requested sizes, like the trace."""
    segments = [s for s in snapshot.get("segments", []) if s.get("device", device) == device]
    if not segments:
        return None
    allocated = sum(b.get("requested_size", b["size"]) for s in segments for b in s.get("blocks", [])
                    if b.get("state") == "active_allocated")
    return allocated, sum(s["total_size"] for s in segments)


# ---- replaying the trace ----


class _Replay:
    """Applies trace entries one at a time, keeping the live allocations (addr -> alloc entry). A free of an
    address never allocated in the trace is a block allocated before recording began: it lowers the level
    (the baseline accounts for it) and is counted once, whether both free events or only one were recorded."""

    def __init__(self) -> None:
        self.live: dict[int, dict[str, Any]] = {}
        self.pending_free: set[int] = set()  # free_requested seen, free_completed not yet
        self.freed_before_recording_bytes = 0

    def step(self, entry: dict[str, Any]) -> tuple[int, int]:
        """(change of allocated bytes, change of reserved bytes) caused by one entry."""
        action, addr, size = entry["action"], entry.get("addr"), entry.get("size", 0)
        if action == "alloc":
            self.pending_free.discard(addr)
            self.live[addr] = entry
            return size, 0
        if action == "free_requested":
            self.pending_free.add(addr)
            return -self._release(addr, size), 0
        if action == "free_completed":
            if addr in self.pending_free:  # already counted at free_requested
                self.pending_free.discard(addr)
                return 0, 0
            return -self._release(addr, size), 0
        if action in ("segment_alloc", "segment_map"):  # map: pages added to an expandable segment
            return 0, size
        if action in ("segment_free", "segment_unmap"):
            return 0, -size
        return 0, 0  # oom, snapshot, ...: no change

    def _release(self, addr: int, size: int) -> int:
        entry = self.live.pop(addr, None)
        if entry is None:
            self.freed_before_recording_bytes += size
            return size
        return entry["size"]


@dataclass
class Timeline:
    """Allocated and reserved bytes after every trace entry of one device."""

    device: int
    times_us: list[float] | None  # per entry (host clock, microseconds since the epoch); None if not recorded
    allocated_bytes: list[int]
    reserved_bytes: list[int]  # empty when the snapshot has neither segments nor segment events
    baseline_bytes: int  # allocated when recording began
    baseline_reserved_bytes: int  # reserved when recording began (0 when unknown)
    freed_before_recording_bytes: int
    peak_bytes: int
    peak_index: int  # entry after which the peak is first reached; -1 = at the start

    def x_axis(self) -> tuple[list[float], str]:
        """(x values, label): milliseconds since the first entry, or the entry number without timestamps."""
        if self.times_us:
            t0 = self.times_us[0]
            return [(t - t0) / 1e3 for t in self.times_us], "time since recording began (ms, host clock)"
        return list(range(len(self.allocated_bytes))), "allocator event #"


def rebuild_timeline(snapshot: dict[str, Any], device: int | None = None) -> Timeline:
    """Replay the trace from the level at which recording began: what the segments held at snapshot time
    minus the trace's net change, and never less than what the trace frees of blocks it did not allocate (so
    the curve cannot go negative, even for a snapshot without segments or a trace whose start was dropped)."""
    device, trace = device_trace(snapshot, device)
    replay = _Replay()
    allocated, reserved, level, held = [], [], 0, 0
    for entry in trace:
        d_alloc, d_reserved = replay.step(entry)
        level += d_alloc
        held += d_reserved
        allocated.append(level)
        reserved.append(held)
    at_snapshot = held_at_snapshot(snapshot, device)
    end_alloc, end_reserved = at_snapshot if at_snapshot else (0, 0)
    # every block freed without being allocated in the trace was there when recording began
    base_alloc = max(end_alloc - level, replay.freed_before_recording_bytes)
    allocated = [a + base_alloc for a in allocated]
    base_reserved = 0
    if at_snapshot or any(e["action"] in SEGMENT_ACTIONS for e in trace):
        base_reserved = max(end_reserved - held, -min(reserved, default=0), base_alloc)
        reserved = [r + base_reserved for r in reserved]
    else:  # nothing says what the allocator held
        reserved = []
    peak_index = max(range(len(allocated)), key=allocated.__getitem__, default=-1)
    peak = allocated[peak_index] if peak_index >= 0 else base_alloc
    if peak <= base_alloc:
        peak_index, peak = -1, base_alloc
    times = [e["time_us"] for e in trace] if trace and all("time_us" in e for e in trace) else None
    return Timeline(device, times, allocated, reserved, base_alloc, base_reserved,
                    replay.freed_before_recording_bytes, peak, peak_index)


# ---- who allocated what ----

# Python frames that are nobody's own code: installed packages (torch itself, numpy, ...) and the standard
# library (/usr/lib/python3.11/..., a venv's lib/python3.12/...), wherever they sit, even inside a project folder
# (a .venv beside the code).
_LIBRARY = re.compile(r"/(site|dist)-packages/|/lib/python3\.\d+/|^<")
# Frames of a C++ stack that say nothing about who asked for the memory: unwinding, the snapshot's own recorder,
# the caching allocator, tensor creation, dispatch and TensorIterator plumbing.
_CPP_NOISE = re.compile(r"unwind|CapturedTraceback|gather_with_cpp|CachingAllocator|Allocator::|empty_|_empty|"
                        r"TensorImpl|TensorBase|TensorIterator|create_out|set_output|wrap_kernel_functor|"
                        r"c10::impl::|c10::Dispatcher|boxed|redispatch|^\?\?$|^$")
_AUTOGRAD_NODE = re.compile(r"torch::autograd::(?:generated::)?(\w+)::apply\(")
_ATEN_OP = re.compile(r"at::_ops::(\w+)::call\(")
_CREATION_OP = re.compile(r"(new_)?(empty|zeros)(_|$)")
NEAR_ALL = 0.9  # code_root descends into a folder that holds at least this share of the own frames below it


def is_library_file(filename: str) -> bool:
    return not filename.endswith(".py") or bool(_LIBRARY.search(filename))


def code_root(snapshot: dict[str, Any], device: int | None = None) -> PurePosixPath | None:
    """The most common source root of the snapshot's own Python frames (every frame of every allocation, library
    files left out): from '/', descend into the folder that holds nearly all (NEAR_ALL) of the frames below, and
    stop where they part: a student's /home/u/assignment2-systems, whose cs336_basics/ and cs336_systems/ share
    its frames, or this project's folder. None when the snapshot has no such frame. A snapshot is often read on
    another machine than the one that recorded it: paths are compared as text, never looked up here."""
    _, trace = device_trace(snapshot, device)
    files: Counter = Counter()
    for entry in trace:
        if entry.get("action") == "alloc":
            files.update(f["filename"] for f in entry.get("frames", []) if not is_library_file(f["filename"]))
    parts = [(PurePosixPath(name).parts, n) for name, n in files.items() if PurePosixPath(name).is_absolute()]
    node: tuple[str, ...] = ()
    while True:
        below = [(p, n) for p, n in parts if p[:len(node)] == node]
        folders = Counter({p[len(node)]: 0 for p, _ in below if len(p) > len(node) + 1})
        for p, n in below:
            if len(p) > len(node) + 1:
                folders[p[len(node)]] += n
        if not folders:
            break
        folder, count = folders.most_common(1)[0]
        if count < NEAR_ALL * sum(n for _, n in below):
            break
        node += (folder,)
    return PurePosixPath(*node) if len(node) > 1 else None


@functools.lru_cache(maxsize=4096)
def _project_file(filename: str, root: PurePosixPath | Path) -> str | None:
    """`filename` relative to `root` if it is a Python file of the user's own under it, else None. Compared as
    text first (a snapshot from another machine), then resolved (this project's own runs, through symlinks).
    Cached: a trace repeats the same few files in millions of frames."""
    if is_library_file(filename):
        return None
    path = PurePosixPath(filename)
    if path.is_relative_to(PurePosixPath(root)):
        return str(path.relative_to(PurePosixPath(root)))
    resolved = Path(filename).resolve()
    return str(resolved.relative_to(root)) if resolved.is_relative_to(root) else None


def cpp_site(frames: list[dict[str, Any]]) -> str:
    """A stack without a Python frame (autograd's backward threads, C++ callers), named by its first meaningful
    C++ frame: the autograd node that allocated ('DivBackward0') and its operator ('div_Tensor'), else the
    operator, else the first frame that is not allocator, dispatch or unwinding plumbing."""
    names = [frame.get("name", "") for frame in frames]
    node = next((m.group(1) for name in names if (m := _AUTOGRAD_NODE.search(name))), None)
    ops = [m.group(1) for name in names if (m := _ATEN_OP.search(name))]
    # the operator that asked for the memory, not the empty() it made it with
    op = next((op for op in ops if not _CREATION_OP.match(op)), ops[0] if ops else None)
    if node:
        return f"{node}{f' > {op}' if op else ''} (no Python frame: autograd's C++ backward)"
    if op:
        return f"{op} (no Python frame: C++ operator)"
    meaningful = next((name for name in names if not _CPP_NOISE.search(name)), None)
    if meaningful:
        return f"{re.sub(r'[(<].*', '', meaningful)} (no Python frame: C++)"
    return "(no Python frame: C++ allocator frames only)"


def allocation_site(frames: Iterable[dict[str, Any]], root: Path | PurePosixPath = PROJECT_ROOT) -> str:
    """'file.py:line function' of the innermost frame in the user's own code (under `root`: this project's folder,
    or a snapshot's code_root); else of the innermost Python frame; else the first meaningful C++ frame
    (cpp_site)."""
    frames = list(frames)
    for frame in frames:
        relative = _project_file(frame["filename"], root)
        if relative:
            return f"{relative}:{frame['line']} {frame['name']}"
    for frame in frames:
        if frame["filename"].endswith(".py"):
            return f"{Path(frame['filename']).name}:{frame['line']} {frame['name']} (outside the project)"
    return cpp_site(frames)


def phase_spans(marks: list[tuple[str, float]]) -> list[tuple[str, float, float]]:
    """[(phase, start_us, end_us)] from runner.run_step's on_phase marks [(name, time_us), ..., ("end", t)]."""
    return [(name, start, end) for (name, start), (_, end) in zip(marks, marks[1:]) if name != "end"]


def phase_at(time_us: float | None, spans: list[tuple[str, float, float]]) -> str:
    if time_us is None:
        return ""
    return next((name for name, start, end in spans if start <= time_us < end), "(between phases)")


def _top_sites(counter: Counter, limit: int = 2) -> str:
    text = "; ".join(f"{site} (x{n})" for site, n in counter.most_common(limit))
    return text + (f"; +{len(counter) - limit} more" if len(counter) > limit else "")


def largest_allocations(snapshot: dict[str, Any], top: int = 10, device: int | None = None,
                        spans: list[tuple[str, float, float]] | None = None,
                        root: Path | PurePosixPath = PROJECT_ROOT) -> list[dict[str, Any]]:
    """The `top` largest allocation sizes in the trace: how many allocations of each size, the sites (first
    project frame) that made them and the step phases they fell in, largest first."""
    _, trace = device_trace(snapshot, device)
    by_size: dict[int, dict[str, Counter]] = {}
    for entry in trace:
        if entry["action"] != "alloc":
            continue
        group = by_size.setdefault(entry["size"], {"sites": Counter(), "phases": Counter()})
        group["sites"][allocation_site(entry.get("frames", []), root)] += 1
        if spans:
            group["phases"][phase_at(entry.get("time_us"), spans)] += 1
    rows = []
    for size in sorted(by_size, reverse=True)[:top]:
        group = by_size[size]
        count = sum(group["sites"].values())
        rows.append({"size_bytes": size, "count": count, "total_bytes": size * count,
                     "sites": _top_sites(group["sites"]),
                     "phases": ", ".join(f"{p} x{n}" for p, n in group["phases"].most_common())})
    return rows


def live_at_peak(snapshot: dict[str, Any], timeline: Timeline, top: int = 10,
                 root: Path | PurePosixPath = PROJECT_ROOT) -> list[dict[str, Any]]:
    """What made up the peak: bytes live at the peak grouped by allocation site, largest first (`top` sites),
    with the blocks allocated before recording as one row. Shares are of the peak."""
    _, trace = device_trace(snapshot, timeline.device)
    replay = _Replay()
    for entry in trace[: timeline.peak_index + 1]:
        replay.step(entry)
    sizes: Counter = Counter()
    counts: Counter = Counter()
    for entry in replay.live.values():
        site = allocation_site(entry.get("frames", []), root)
        sizes[site] += entry["size"]
        counts[site] += 1
    before = timeline.peak_bytes - sum(sizes.values())
    rows = [{"site": site, "count": counts[site], "bytes": n} for site, n in sizes.most_common(top)]
    rest = sum(sizes.values()) - sum(r["bytes"] for r in rows)
    if rest:
        rows.append({"site": f"(other sites: {len(sizes) - top})", "count": None, "bytes": rest})
    rows.insert(0, {"site": BEFORE_RECORDING, "count": None, "bytes": before})
    for row in rows:
        row["share"] = row["bytes"] / timeline.peak_bytes if timeline.peak_bytes else 0.0
    return rows


def peak_check(rebuilt_bytes: int, requested_peak_bytes: int | None, allocated_peak_bytes: int | None = None,
               tolerance: float = 0.01) -> dict[str, Any]:
    """Does the peak rebuilt from the trace agree with torch.cuda.memory_stats()["requested_bytes.all.peak"],
    its exact counterpart (both count requested sizes), within `tolerance`? They differ only when the trace lost
    events (--max-entries) or frees completed late on other streams. max_memory_allocated (rounded blocks, a few
    percent higher for large models) is reported beside it, not compared."""
    row: dict[str, Any] = {"rebuilt_peak_bytes": rebuilt_bytes, "requested_peak_bytes": requested_peak_bytes,
                           "max_memory_allocated_bytes": allocated_peak_bytes}
    if allocated_peak_bytes is not None:
        row["allocator_rounding_bytes"] = allocated_peak_bytes - rebuilt_bytes
    if requested_peak_bytes is None:
        row["status"] = "no requested_bytes.all.peak recorded with this snapshot"
        return row
    diff = requested_peak_bytes - rebuilt_bytes
    row["diff_bytes"] = diff
    row["diff_fraction"] = diff / requested_peak_bytes if requested_peak_bytes else 0.0
    if diff == 0:
        row["status"] = "ok (exact)"
    elif abs(row["diff_fraction"]) <= tolerance:
        row["status"] = f"ok (within {tolerance:.0%})"
    else:
        row["status"] = f"MISMATCH (more than {tolerance:.0%} apart)"
    return row


# ---- the timeline image ----


def render_timeline_png(timeline: Timeline, path: str | Path, title: str,
                        spans: list[tuple[str, float, float]] | None = None) -> Path:
    """Allocated (and reserved) memory over the recorded step as a PNG, phases shaded, the peak marked.
    Needs matplotlib (optional: nothing else in the project imports it); uses no global pyplot state."""
    try:
        from matplotlib.figure import Figure
    except ImportError as exc:
        raise ImportError("the timeline PNG needs matplotlib: pip install matplotlib") from exc
    unit, scale = ("GiB", 2**30) if timeline.peak_bytes >= 2**30 else ("MiB", 2**20)
    xs, xlabel = timeline.x_axis()
    start = xs[0] if xs else 0
    fig = Figure(figsize=(10, 4.5))
    ax = fig.add_subplot()
    ax.step([start] + xs, [b / scale for b in [timeline.baseline_bytes] + timeline.allocated_bytes],
            where="post", color="black", linewidth=1.2, label="allocated (active tensors)")
    if timeline.reserved_bytes:
        ax.step([start] + xs, [b / scale for b in [timeline.baseline_reserved_bytes] + timeline.reserved_bytes],
                where="post", color="gray", linestyle="--", linewidth=1, label="reserved (allocator segments)")
    if spans and timeline.times_us:
        t0 = timeline.times_us[0]
        for name, begin, end in spans:
            ax.axvspan((begin - t0) / 1e3, (end - t0) / 1e3, color=PHASE_COLORS.get(name, "tab:purple"),
                       alpha=0.15, label=name)
    peak_x = xs[timeline.peak_index] if timeline.peak_index >= 0 else start
    ax.plot([peak_x], [timeline.peak_bytes / scale], "o", color="tab:red")
    ax.annotate(f"peak {timeline.peak_bytes / scale:.2f} {unit}", (peak_x, timeline.peak_bytes / scale),
                textcoords="offset points", xytext=(6, 4), color="tab:red")
    ax.set_xlabel(xlabel)
    ax.set_ylabel(f"{unit} (2^{30 if unit == 'GiB' else 20} bytes)")
    ax.set_ylim(0, max([timeline.peak_bytes, 1] + timeline.reserved_bytes) / scale * 1.12)  # room for the label
    ax.set_title(title)
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.14), ncol=5, fontsize="small", frameon=False)
    ax.grid(alpha=0.3)
    fig.savefig(path, dpi=150, bbox_inches="tight")
    return Path(path)
