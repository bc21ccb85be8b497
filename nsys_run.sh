#!/usr/bin/env bash
# Nsight Systems profile of bench_e2e.py's measured steps, turned into markdown kernel tables.
#
# Answers the study's profiling questions on a GPU: which kernels dominate the forward pass and how often they
# run per step, how the matmul share changes from inference to a training step, softmax vs the attention matmuls.
#
#   bash nsys_run.sh medium 256                      # a training step (forward, backward, AdamW)
#   bash nsys_run.sh medium 256 forward              # forward only; also forward-backward
#   bash nsys_run.sh small 512 train -- --dtype bf16 --steps 5    # anything after -- goes to bench_e2e.py
#   bash nsys_run.sh --backtrace small 128           # Python backtraces for CUDA calls (slower run)
#   bash nsys_run.sh --handout 2025 xl 256           # sizes from the Spring 2025 handout (default: 2026)
#
# Writes results/nsys/<size>_ctx<ctx>_<mode>[_<dtype>][_h2025].nsys-rep, replacing only that report, with
# beside it the SQLite export, the `nsys stats` CSVs (<report>_<name>.csv) and their log (<report>.stats.log),
# bench_e2e's record (<report>_e2e.jsonl) and the tables (<report>.md). Only the measured steps are captured: the capture
# range is bench_e2e's "measure" NVTX range, so warm-up never pollutes the statistics. Open the report in the
# Nsight Systems GUI: nsys-ui <report>.
#
# Needs Nsight Systems 2023.4 or newer (tested with 2023.4.4): the script checks up front that `nsys stats`
# knows the reports it reads (older versions name them differently) and says which version it found.
#
# Options (before --): --backtrace  collect Python + CUDA backtraces for CUDA API calls (--python-backtrace=cuda
#                                   --cudabacktrace=all); off by default since it slows the run noticeably
#                      --results-dir DIR   results root (default: results)
#                      --handout 2026|2025 which handout's Table 1 SIZE comes from (default: $CS336_HANDOUT, else
#                                   2026); a 2025 report's name ends in _h2025, since 2025's xl is another model
# Environment: NSYS = the nsys binary (default: nsys on PATH); PYTHON = the interpreter (default: python3);
#              CS336_HANDOUT = the handout when --handout is not given.
# Exit status: 0; 2 for a usage error or a missing or too old nsys; the profiled run's own status when it
# fails; 1 when nsys wrote no report or `nsys stats` no trace CSV.
set -uo pipefail

usage() {
    sed -n '2,/^set -uo/p' "$0" | sed '$d; s/^# \{0,1\}//'
}

die_usage() {
    echo "nsys_run.sh: error: $1 (see --help)" >&2
    exit 2
}

HERE="$(cd "$(dirname "$0")" && pwd)"
PYTHON="${PYTHON:-python3}"
RESULTS_DIR="results"
HANDOUT="${CS336_HANDOUT:-2026}"
BACKTRACE=()
POSITIONAL=()
while (($#)); do
    case "$1" in
        -h|--help) usage; exit 0 ;;
        --backtrace|--python-backtrace) BACKTRACE=(--cudabacktrace=all --python-backtrace=cuda); shift ;;
        --results-dir) (($# >= 2)) || die_usage "--results-dir needs a folder"; RESULTS_DIR="$2"; shift 2 ;;
        --results-dir=*) RESULTS_DIR="${1#*=}"; shift ;;
        --handout) (($# >= 2)) || die_usage "--handout needs 2026 or 2025"; HANDOUT="$2"; shift 2 ;;
        --handout=*) HANDOUT="${1#*=}"; shift ;;
        --) shift; break ;;
        -*) die_usage "unknown option $1" ;;
        *) POSITIONAL+=("$1"); shift ;;
    esac
done
EXTRA=("$@")

((${#POSITIONAL[@]} >= 2 && ${#POSITIONAL[@]} <= 3)) || die_usage "usage: bash nsys_run.sh [--backtrace] SIZE CTX [MODE] [-- bench_e2e.py arguments]"
SIZE="${POSITIONAL[0]}"
CTX="${POSITIONAL[1]}"
MODE="${POSITIONAL[2]:-train}"
# SIZE and the dtype become part of the report's file name: nothing that could leave the results folder
[[ "$SIZE" =~ ^[A-Za-z0-9][A-Za-z0-9._-]*$ ]] ||
    die_usage "SIZE must be a preset name such as tiny or 2.7B, got '$SIZE'"
[[ "$CTX" =~ ^[1-9][0-9]*$ ]] || die_usage "CTX must be a positive integer, got '$CTX'"
case "$MODE" in
    forward|forward-backward|train) ;;
    *) die_usage "MODE must be forward, forward-backward or train, got '$MODE'" ;;
esac
case "$HANDOUT" in
    2026|2025) ;;
    *) die_usage "the handout (--handout or CS336_HANDOUT) must be 2026 or 2025, got '$HANDOUT'" ;;
esac

# One configuration per report: the sweep flags of bench_e2e would profile only the first configuration.
DTYPE=""
for ((i = 0; i < ${#EXTRA[@]}; i++)); do
    case "${EXTRA[i]}" in
        --size|--size=*|--context-length|--context-length=*|--mode|--mode=*)
            die_usage "give SIZE, CTX and MODE as positional arguments, not ${EXTRA[i]%%=*}" ;;
        --handout|--handout=*) die_usage "give --handout before --, not after it (it also names the report)" ;;
        --dtype=*) DTYPE="${EXTRA[i]#*=}" ;;
        --dtype)
            DTYPE="${EXTRA[i + 1]:-}"
            next="${EXTRA[i + 2]:-}"
            [[ -n "$next" && "$next" != -* ]] && die_usage "profile one --dtype at a time" ;;
    esac
done
case "$DTYPE" in
    ""|fp32|bf16|fp16) ;;
    *) die_usage "--dtype must be fp32, bf16 or fp16, got '$DTYPE'" ;;
esac
SUFFIX=""
[[ -n "$DTYPE" && "$DTYPE" != "fp32" ]] && SUFFIX="_$DTYPE"
[[ "$HANDOUT" != 2026 ]] && SUFFIX+="_h$HANDOUT"

# ---- find nsys ----
NSYS_BIN="${NSYS:-}"
if [[ -n "$NSYS_BIN" ]]; then
    [[ -x "$NSYS_BIN" || -n "$(command -v "$NSYS_BIN" 2>/dev/null)" ]] || NSYS_BIN=""
    MISSING="NSYS=${NSYS} is not an executable nsys binary"
else
    NSYS_BIN="$(command -v nsys 2>/dev/null || true)"
    MISSING="nsys (Nsight Systems) is not on PATH"
fi
if [[ -z "$NSYS_BIN" ]]; then
    cat >&2 <<EOF
nsys_run.sh: error: $MISSING.
Install Nsight Systems (https://developer.nvidia.com/nsight-systems; it also ships with the CUDA toolkit, e.g.
/usr/local/cuda/bin/nsys, and with NVIDIA's apt repository: apt-get install nsight-systems-<version>), then put it
on PATH or run NSYS=/path/to/nsys bash nsys_run.sh ...
Without nsys, torch.profiler gives the same tables:
    python bench_e2e.py --size $SIZE --context-length $CTX --mode $MODE --profile --handout $HANDOUT ${EXTRA[*]}
EOF
    exit 2
fi

# ---- check that this nsys has the stats reports the tables are read from ----
# The three traces feed kernel_tables.py; cuda_gpu_kern_sum is its cross-check; nvtx_kern_sum is for people.
REPORTS=(cuda_gpu_trace cuda_api_trace nvtx_pushpop_trace cuda_gpu_kern_sum nvtx_kern_sum)
NSYS_VERSION="$("$NSYS_BIN" --version 2>/dev/null | head -n 1)"
KNOWN_REPORTS="$("$NSYS_BIN" stats --help-reports 2>&1)"
UNKNOWN=()
for report in "${REPORTS[@]}"; do
    grep -Eq "^[[:space:]]*${report}([[:space:]]|\[|$)" <<<"$KNOWN_REPORTS" || UNKNOWN+=("$report")
done
if ((${#UNKNOWN[@]})); then
    echo "nsys_run.sh: error: ${NSYS_VERSION:-this nsys} ($NSYS_BIN) has no stats report ${UNKNOWN[*]}; install" \
         "Nsight Systems 2023.4 or newer (tested with 2023.4.4)" >&2
    exit 2
fi

# ---- profile ----
OUT_DIR="$RESULTS_DIR/nsys"
mkdir -p "$OUT_DIR" || exit 1
REPORT="$OUT_DIR/${SIZE}_ctx${CTX}_${MODE}${SUFFIX}"
E2E_DIR="$(mktemp -d)" || exit 1
trap 'rm -rf "$E2E_DIR"' EXIT

# torch's NVTX ranges are unregistered strings, which an NVTX capture range only matches with this variable set
# in the profiled process; --env-var hands it to the process nsys launches.
export NSYS_NVTX_PROFILER_REGISTER_ONLY=0
# --in-process: the measured steps, their NVTX ranges and their kernels all live in the process nsys launched.
# --results-dir last, so bench_e2e's record lands where this script reads it.
APP=("$PYTHON" "$HERE/bench_e2e.py" --size "$SIZE" --context-length "$CTX" --mode "$MODE" --nvtx --in-process
     "${EXTRA[@]}" --handout "$HANDOUT" --results-dir "$E2E_DIR" --out e2e)
echo "nsys_run.sh: profiling ${APP[*]}" >&2
"$NSYS_BIN" profile --trace=cuda,nvtx,osrt \
    --capture-range=nvtx --nvtx-capture=measure --capture-range-end=stop \
    --env-var=NSYS_NVTX_PROFILER_REGISTER_ONLY=0 \
    --force-overwrite=true --output="$REPORT" "${BACKTRACE[@]}" \
    "${APP[@]}"
status=$?
if ((status != 0)); then
    echo "nsys_run.sh: the profiled run failed with exit status $status" >&2
    exit "$status"
fi
if [[ ! -f "$REPORT.nsys-rep" ]]; then
    # bench_e2e exits 0 when its configuration fails (a failure is a row): its record says why nothing was measured
    said="$(grep -o '"status": "[^"]*"' "$E2E_DIR/e2e/e2e.jsonl" 2>/dev/null | tail -n 1)"
    echo "nsys_run.sh: nsys wrote no $REPORT.nsys-rep: ${said:-the 'measure' range never started}" >&2
    exit 1
fi
cp "$E2E_DIR/e2e/e2e.jsonl" "${REPORT}_e2e.jsonl" || exit 1

# ---- statistics and tables ----
# --force-export: a stale SQLite file beside the report is never reused (nsys would otherwise only warn).
REPORT_ARGS=()
for report in "${REPORTS[@]}"; do
    REPORT_ARGS+=(--report "$report")
    rm -f "${REPORT}_${report}.csv"  # a report this run fails to write must not be read from an earlier run
done
"$NSYS_BIN" stats --force-export=true --force-overwrite=true --format csv --output "$REPORT" "${REPORT_ARGS[@]}" \
    "$REPORT.nsys-rep" >"$REPORT.stats.log" 2>&1
status=$?
if ((status != 0)); then
    cat "$REPORT.stats.log" >&2
    echo "nsys_run.sh: nsys stats failed with exit status $status" >&2
    exit "$status"
fi
# nsys stats exits 0 even when a report is unknown or fails (no CSV then), and writes an empty CSV for a report
# without data (the CUDA reports of a run without GPU work): say which, with what nsys said about it.
STATS_FAILED=0
for report in "${REPORTS[@]}"; do
    csv="${REPORT}_${report}.csv"
    [[ -s "$csv" ]] && continue
    # the log's lines about this report, without the "Processing [...] with [...] to [...]... " preamble
    said="$(awk -v r="$report" 'index($0, r) { sub(/^Processing .*\.\.\. */, ""); if (length($0)) print }' \
            "$REPORT.stats.log")"
    if [[ -f "$csv" ]]; then
        echo "nsys_run.sh: note: $report is empty: ${said:-no data}" >&2
    else
        case "$report" in  # the traces are what the tables are made of; the summaries only accompany them
            cuda_gpu_trace|cuda_api_trace|nvtx_pushpop_trace) level=error; STATS_FAILED=1 ;;
            *) level=warning ;;
        esac
        echo "nsys_run.sh: $level: nsys stats wrote no $csv (log: $REPORT.stats.log):" >&2
        echo "${said:-$(tail -n 5 "$REPORT.stats.log")}" | sed 's/^/    /' >&2
    fi
done
((STATS_FAILED)) && exit 1
"$PYTHON" "$HERE/kernel_tables.py" "$REPORT.nsys-rep" --e2e-jsonl "${REPORT}_e2e.jsonl" --md "$REPORT.md"
status=$?
((status == 0)) && echo "report: $REPORT.nsys-rep (open it with nsys-ui, the Nsight Systems GUI)"
exit "$status"
