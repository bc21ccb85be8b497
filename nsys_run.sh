#!/usr/bin/env bash
# Nsight Systems profiles of bench_e2e.py's measured steps, turned into markdown kernel tables.
#
# Answers the study's profiling questions on a GPU: which kernels dominate the forward pass and how often they
# run per step, how the matmul share changes from inference to a training step, softmax vs the attention matmuls.
#
#   bash nsys_run.sh medium 256                      # one configuration: a training step (forward, backward, AdamW)
#   bash nsys_run.sh medium 256 forward              # forward only; also forward-backward
#   bash nsys_run.sh --size small medium --context-length 256 512 1024 --mode forward train   # 12 reports + summary
#   bash nsys_run.sh                                 # the handout's nsys_profile plan (below); --dry-run lists it
#   bash nsys_run.sh small 512 train -- --dtype bf16 --steps 5    # anything after -- goes to bench_e2e.py
#   bash nsys_run.sh --backtrace small 128           # Python backtraces for CUDA calls (slower run)
#   bash nsys_run.sh --handout 2025 xl 256           # sizes from the Spring 2025 handout (default: 2026)
#   bash nsys_run.sh --pytorch=autograd-nvtx --cuda-memory-usage=true xl 128   # memory_profiling (f), 2026
#
# One report per configuration, each from its own `nsys profile` run, in the order size, context (ascending),
# mode: results/nsys/<size>_ctx<ctx>_<mode>[_<dtype>][_pytorch][_cudamem][_h2025].nsys-rep, with beside it the
# SQLite export, the `nsys stats` CSVs (<report>_<name>.csv) and their log (<report>.stats.log), bench_e2e's
# record (<report>_e2e.jsonl), the arguments it was made with (<report>.args) and the tables (<report>.md).
# Only the measured steps are captured: the capture range is bench_e2e's "measure" NVTX range, so warm-up never
# pollutes the statistics. Open a report in the Nsight Systems GUI: nsys-ui <report>.nsys-rep.
#
# An existing report made with the same arguments is kept and reused (its tables re-made if missing); one made
# with other arguments is kept, not replaced, and that configuration fails; --force profiles again. After an
# out-of-memory error, the larger contexts of that size and mode are skipped (--no-skip runs them). With more
# than one configuration, kernel_tables.py --summary then prints one table across all of them (forward pass:
# Nsight vs stopwatch, its top kernel and calls per forward pass; matmul share forward-only vs training step;
# softmax vs the attention matmuls, time and FLOPs), saved as results/nsys/summary-<time>.{md,jsonl}.
#
# With no SIZE and no --size/--context-length/--mode, the handout's nsys_profile plan: 2025 = every size of its
# Table 1 x contexts 128 256 512 1024; 2026 ("two sizes of your choice x three power-of-two contexts > 128, the
# largest the longest that fits") = small medium x 256 512 1024; modes forward and train. An axis not given
# takes that default. For 2026, find the longest context that fits first and name your three.
#
# Needs Nsight Systems 2023.4 or newer (tested with 2023.4.4): the script checks up front that `nsys stats`
# knows the reports it reads (older versions name them differently), and that `nsys profile --help` knows the
# pass-through flags given, and says which version it found.
#
# Options (before --):
#   SIZE CTX [MODE]            one configuration (MODE: forward, forward-backward or train; default train)
#   --size S [S ...]           sizes of the handout's Table 1 (or tiny, or all)
#   --context-length C [C ...] context lengths
#   --mode M [M ...]           forward, forward-backward, train (default with these flags: forward train)
#   --force                    profile again even where a report exists, replacing it
#   --no-skip                  after an OOM, still profile the larger contexts of that size and mode
#   --dry-run                  list the configurations and what would happen to each; profile nothing
#   --backtrace                collect Python + CUDA backtraces for CUDA API calls (--python-backtrace=cuda
#                              --cudabacktrace=all); off by default since it slows the run noticeably
#   --pytorch=VALUES           passed to nsys profile (autograd-nvtx, autograd-shapes-nvtx, functions-trace, ...:
#                              PyTorch's own NVTX labels); adds _pytorch to the report name. Not in nsys 2023.4
#   --cuda-memory-usage=true   passed to nsys profile: GPU memory usage over time; adds _cudamem to the name
#   --results-dir DIR          results root (default: results)
#   --handout 2026|2025        which handout's Table 1 the sizes come from (default: $CS336_HANDOUT, else 2026);
#                              a 2025 report's name ends in _h2025, since 2025's xl is another model
# Environment: NSYS = the nsys binary (default: nsys on PATH); PYTHON = the interpreter (default: python3);
#              CS336_HANDOUT = the handout when --handout is not given.
# Exit status: 0 when every configuration has its tables; 2 for a usage error or a missing or too old nsys;
# otherwise that of the first configuration that failed: the profiled run's own status when it fails, 1 when
# it stopped at an OOM, nsys wrote no report or `nsys stats` no trace CSV, or an existing report was kept.
set -uo pipefail

usage() {
    sed -n '2,/^set -uo/p' "$0" | sed '$d; s/^# \{0,1\}//'
}

die_usage() {
    echo "nsys_run.sh: error: $* (see --help)" >&2
    exit 2
}

HERE="$(cd "$(dirname "$0")" && pwd)"
PYTHON="${PYTHON:-python3}"
RESULTS_DIR="results"
HANDOUT="${CS336_HANDOUT:-2026}"
BACKTRACE=()
PYTORCH=""        # --pytorch=VALUES for nsys profile
CUDA_MEMORY=0     # --cuda-memory-usage=true for nsys profile
FORCE=0
NO_SKIP=0
DRY_RUN=0
POSITIONAL=()
SIZES=()
CONTEXTS=()
MODES=()
while (($#)); do
    case "$1" in
        -h|--help) usage; exit 0 ;;
        --backtrace|--python-backtrace) BACKTRACE=(--cudabacktrace=all --python-backtrace=cuda); shift ;;
        --results-dir) (($# >= 2)) || die_usage "--results-dir needs a folder"; RESULTS_DIR="$2"; shift 2 ;;
        --results-dir=*) RESULTS_DIR="${1#*=}"; shift ;;
        --handout) (($# >= 2)) || die_usage "--handout needs 2026 or 2025"; HANDOUT="$2"; shift 2 ;;
        --handout=*) HANDOUT="${1#*=}"; shift ;;
        --size|--context-length|--mode)  # a list: the values up to the next option
            flag="$1"; shift; values=()
            while (($#)) && [[ "$1" != -* ]]; do values+=("$1"); shift; done
            ((${#values[@]})) || die_usage "$flag needs at least one value"
            case "$flag" in
                --size) SIZES+=("${values[@]}") ;;
                --context-length) CONTEXTS+=("${values[@]}") ;;
                --mode) MODES+=("${values[@]}") ;;
            esac ;;
        --force) FORCE=1; shift ;;
        --no-skip) NO_SKIP=1; shift ;;
        --dry-run) DRY_RUN=1; shift ;;
        --pytorch=*)
            PYTORCH="${1#*=}"
            [[ -n "$PYTORCH" ]] || die_usage "--pytorch needs a value, e.g. --pytorch=autograd-nvtx"
            shift ;;
        --pytorch) (($# >= 2)) && [[ "$2" != -* ]] || die_usage "--pytorch needs a value, e.g. --pytorch=autograd-nvtx"
            PYTORCH="$2"; shift 2 ;;
        --cuda-memory-usage|--cuda-memory-usage=true) CUDA_MEMORY=1; shift ;;
        --cuda-memory-usage=false) CUDA_MEMORY=0; shift ;;  # nsys's default
        --cuda-memory-usage=*) die_usage "--cuda-memory-usage must be true or false, got '${1#*=}'" ;;
        --) shift; break ;;
        -*) die_usage "unknown option $1" ;;
        *) POSITIONAL+=("$1"); shift ;;
    esac
done
EXTRA=("$@")

case "$HANDOUT" in
    2026|2025) ;;
    *) die_usage "the handout (--handout or CS336_HANDOUT) must be 2026 or 2025, got '$HANDOUT'" ;;
esac
if ((${#POSITIONAL[@]})); then
    ((${#SIZES[@]} + ${#CONTEXTS[@]} + ${#MODES[@]} == 0)) ||
        die_usage "give SIZE CTX [MODE] or --size/--context-length/--mode, not both"
    ((${#POSITIONAL[@]} >= 2 && ${#POSITIONAL[@]} <= 3)) ||
        die_usage "usage: bash nsys_run.sh [options] SIZE CTX [MODE] [-- bench_e2e.py arguments]"
    SIZES=("${POSITIONAL[0]}")
    CONTEXTS=("${POSITIONAL[1]}")
    MODES=("${POSITIONAL[2]:-train}")
fi
# the handout's nsys_profile plan for the axes not given (see the header)
if ((${#SIZES[@]} == 0)); then
    if [[ "$HANDOUT" == 2025 ]]; then SIZES=(all); else SIZES=(small medium); fi
fi
if ((${#CONTEXTS[@]} == 0)); then
    if [[ "$HANDOUT" == 2025 ]]; then CONTEXTS=(128 256 512 1024); else CONTEXTS=(256 512 1024); fi
fi
((${#MODES[@]})) || MODES=(forward train)

for size in "${SIZES[@]}"; do
    # a size becomes part of a report's file name: nothing that could leave the results folder
    [[ "$size" =~ ^[A-Za-z0-9][A-Za-z0-9._-]*$ ]] ||
        die_usage "SIZE must be a preset name such as tiny or 2.7B, got '$size'"
done
for ctx in "${CONTEXTS[@]}"; do
    [[ "$ctx" =~ ^[1-9][0-9]*$ ]] || die_usage "CTX must be a positive integer, got '$ctx'"
done
for mode in "${MODES[@]}"; do
    case "$mode" in
        forward|forward-backward|train) ;;
        *) die_usage "MODE must be forward, forward-backward or train, got '$mode'" ;;
    esac
done

# One configuration per report: bench_e2e's own sweep flags would profile only its first configuration.
DTYPE=""
for ((i = 0; i < ${#EXTRA[@]}; i++)); do
    case "${EXTRA[i]}" in
        --size|--size=*|--context-length|--context-length=*|--mode|--mode=*)
            die_usage "give sizes, contexts and modes before -- (SIZE CTX [MODE] or --size ...), not" \
                "${EXTRA[i]%%=*} after it" ;;
        --handout|--handout=*) die_usage "give --handout before --, not after it (it also names the report)" ;;
        --dtype=*) DTYPE="${EXTRA[i]#*=}" ;;
    esac
    case "${EXTRA[i]}" in
        --dtype|--compile|--attn|--optimizer|--warmup)
            [[ "${EXTRA[i]}" == --dtype ]] && DTYPE="${EXTRA[i + 1]:-}"
            second="${EXTRA[i + 2]:-}"
            [[ -n "${EXTRA[i + 1]:-}" && "${EXTRA[i + 1]}" != -* && -n "$second" && "$second" != -* ]] &&
                die_usage "profile one ${EXTRA[i]} at a time" ;;
    esac
done
case "$DTYPE" in
    ""|fp32|bf16|fp16) ;;
    *) die_usage "--dtype must be fp32, bf16 or fp16, got '$DTYPE'" ;;
esac
SUFFIX=""
[[ -n "$DTYPE" && "$DTYPE" != "fp32" ]] && SUFFIX="_$DTYPE"
# nsys flags passed through, checked against this nsys's --help below; they change what the report holds (and
# the run's overhead), so they name it too: such a report never replaces nor stands in for a plain one
PASS_THROUGH=()
[[ -n "$PYTORCH" ]] && { PASS_THROUGH+=("--pytorch=$PYTORCH"); SUFFIX+="_pytorch"; }
((CUDA_MEMORY)) && { PASS_THROUGH+=(--cuda-memory-usage=true); SUFFIX+="_cudamem"; }
[[ "$HANDOUT" != 2026 ]] && SUFFIX+="_h$HANDOUT"

# ---- the plan: size, then context ascending (so that an OOM skips the larger ones), then mode ----
if [[ " ${SIZES[*]} " == *" all "* ]]; then  # the handout's Table 1, from the presets themselves
    expanded="$("$PYTHON" -c 'import sys
sys.path.insert(0, sys.argv[1])
import model_config
try:
    print(*model_config.expand_sizes(sys.argv[3:], sys.argv[2]))
except model_config.ConfigError as exc:
    sys.exit(f"nsys_run.sh: error: {exc}")' "$HERE" "$HANDOUT" "${SIZES[@]}")" || exit 2
    read -r -a SIZES <<<"$expanded"
fi
mapfile -t SIZES < <(printf '%s\n' "${SIZES[@]}" | awk '!seen[$0]++')
mapfile -t CONTEXTS < <(printf '%s\n' "${CONTEXTS[@]}" | sort -n -u)
mapfile -t MODES < <(printf '%s\n' "${MODES[@]}" | awk '!seen[$0]++')
OUT_DIR="$RESULTS_DIR/nsys"
PLAN_SIZE=() PLAN_CTX=() PLAN_MODE=() PLAN_REPORT=()
for size in "${SIZES[@]}"; do
    for ctx in "${CONTEXTS[@]}"; do
        for mode in "${MODES[@]}"; do
            PLAN_SIZE+=("$size") PLAN_CTX+=("$ctx") PLAN_MODE+=("$mode")
            PLAN_REPORT+=("$OUT_DIR/${size}_ctx${ctx}_${mode}${SUFFIX}")
        done
    done
done
MULTI=$((${#PLAN_REPORT[@]} > 1))

# torch's NVTX ranges are unregistered strings, which an NVTX capture range only matches with this variable set
# in the profiled process; --env-var hands it to the process nsys launches.
export NSYS_NVTX_PROFILER_REGISTER_ONLY=0
NSYS_OPTIONS=(--trace=cuda,nvtx,osrt --capture-range=nvtx --nvtx-capture=measure --capture-range-end=stop
              --env-var=NSYS_NVTX_PROFILER_REGISTER_ONLY=0 --force-overwrite=true "${BACKTRACE[@]}"
              "${PASS_THROUGH[@]}")
# --in-process: the measured steps, their NVTX ranges and their kernels all live in the process nsys launched.
app_args() {  # bench_e2e's arguments for one configuration: SIZE CTX MODE
    APP_ARGS=(--size "$1" --context-length "$2" --mode "$3" --nvtx --in-process "${EXTRA[@]}" --handout "$HANDOUT")
}
# what a report was made with, kept beside it as <report>.args: a report is reused only for the same line
args_line() {
    app_args "$@"
    printf '%q ' nsys profile "${NSYS_OPTIONS[@]}" -- bench_e2e.py "${APP_ARGS[@]}"
}
# what happens to a configuration's existing report: profile, reuse, tabulate (report without tables), kept
plan_action() {  # REPORT SIZE CTX MODE
    local report="$1"
    shift
    if ((FORCE)) || [[ ! -f "$report.nsys-rep" ]]; then echo profile
    elif [[ "$(cat "$report.args" 2>/dev/null)" != "$(args_line "$@")" ]]; then echo kept
    elif [[ -s "$report.md" && -f "${report}_e2e.jsonl" ]]; then echo reuse
    else echo tabulate
    fi
}

# ---- check the arguments with bench_e2e itself (sizes of the handout, bench_e2e options), building nothing ----
# (with the first mode: bench_e2e takes one; an argument only another mode refuses stops the loop at that mode)
if ((MULTI || DRY_RUN)); then
    check=("$PYTHON" "$HERE/bench_e2e.py" --size "${SIZES[@]}" --context-length "${CONTEXTS[@]}" --mode "${MODES[0]}"
           --in-process "${EXTRA[@]}" --handout "$HANDOUT" --dry-run)
    if ((DRY_RUN)); then
        echo "nsys_run.sh: the arguments, checked by bench_e2e.py --dry-run (its list: mode ${MODES[0]} only):"
        "${check[@]}" || exit 2
    else
        "${check[@]}" >/dev/null || exit 2
    fi
fi
if ((DRY_RUN)); then
    echo
    echo "nsys_run.sh: dry run: ${#PLAN_REPORT[@]} configuration(s), one nsys profile each, in this order:"
    for i in "${!PLAN_REPORT[@]}"; do
        case "$(plan_action "${PLAN_REPORT[i]}" "${PLAN_SIZE[i]}" "${PLAN_CTX[i]}" "${PLAN_MODE[i]}")" in
            profile) action="profile" ;;
            reuse) action="reuse the existing report" ;;
            tabulate) action="make the tables of the existing report" ;;
            kept) action="keep the existing report, made with other arguments: fails (--force replaces it)" ;;
        esac
        ((FORCE)) && [[ -f "${PLAN_REPORT[i]}.nsys-rep" ]] && action="profile again, replacing the report (--force)"
        printf '  %d. %s ctx=%s %s -> %s: %s\n' $((i + 1)) "${PLAN_SIZE[i]}" "${PLAN_CTX[i]}" "${PLAN_MODE[i]}" \
            "${PLAN_REPORT[i]}" "$action"
    done
    ((NO_SKIP)) || echo "after an OOM, the larger contexts of that size and mode are skipped (--no-skip runs them)"
    app_args "${PLAN_SIZE[0]}" "${PLAN_CTX[0]}" "${PLAN_MODE[0]}"
    echo "each: nsys profile ${NSYS_OPTIONS[*]} --output=<report> $PYTHON bench_e2e.py ${APP_ARGS[*]} ..."
    ((MULTI)) && echo "then: python3 kernel_tables.py --summary <the reports> (results/nsys/summary-<time>.md)"
    echo "nothing was profiled or written (drop --dry-run to run them)"
    exit 0
fi

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
    python bench_e2e.py --size ${SIZES[0]} --context-length ${CONTEXTS[0]} --mode ${MODES[0]} --profile --handout $HANDOUT ${EXTRA[*]}
EOF
    exit 2
fi

# ---- check that this nsys has the stats reports the tables are read from, and the flags passed through ----
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
if ((${#PASS_THROUGH[@]})); then
    PROFILE_HELP="$("$NSYS_BIN" profile --help 2>&1)"
    for flag in "${PASS_THROUGH[@]}"; do
        name="${flag%%=*}"
        grep -Eq "(^|[[:space:],])${name}=" <<<"$PROFILE_HELP" ||
            die_usage "${NSYS_VERSION:-this nsys} ($NSYS_BIN) does not know $name (not in its nsys profile" \
                "--help); it needs a newer Nsight Systems"
    done
fi

# ---- profile, export, tabulate: one configuration ----
E2E_DIR="$(mktemp -d)" || exit 1
trap 'rm -rf "$E2E_DIR"' EXIT
trap 'echo "nsys_run.sh: interrupted; finished reports are kept" >&2; exit 130' INT TERM

record_status() {  # the status of the last record of a bench_e2e JSONL file ("" when there is none)
    "$PYTHON" -c 'import json, sys
lines = [line for line in open(sys.argv[1]) if line.strip()]
print(json.loads(lines[-1]).get("status", "") if lines else "")' "$1" 2>/dev/null
}

# Sets OUTCOME (ok, reused, OOM, kept, failed) and, for the summary, FAILURE (why it failed); returns the
# configuration's exit status.
profile_one() {  # SIZE CTX MODE REPORT
    local size="$1" ctx="$2" mode="$3" report="$4" status said
    local action record="$E2E_DIR/$size-$ctx-$mode/e2e/e2e.jsonl"
    action="$(plan_action "$report" "$size" "$ctx" "$mode")"
    OUTCOME=failed
    FAILURE=""
    if [[ "$action" == kept ]]; then
        echo "nsys_run.sh: error: $report.nsys-rep exists, made with other arguments than these (see $report.args," \
             "if any); it is kept: --force profiles this configuration again, replacing it" >&2
        OUTCOME=kept
        return 1
    fi
    if [[ "$action" == reuse ]]; then
        echo "nsys_run.sh: reusing $report.nsys-rep, made with the same arguments (--force profiles it again)" >&2
        cat "$report.md"
        OUTCOME=reused
        return 0
    fi
    if [[ "$action" == profile ]]; then
        # --force: this configuration's files go first, so that none of them can outlive the new run
        rm -f "$report.nsys-rep" "$report.sqlite" "$report.stats.log" "$report.md" "$report.args" \
              "${report}_e2e.jsonl"
        for name in "${REPORTS[@]}"; do rm -f "${report}_${name}.csv"; done
        app_args "$size" "$ctx" "$mode"
        mkdir -p "$E2E_DIR/$size-$ctx-$mode" || return 1
        local app=("$PYTHON" "$HERE/bench_e2e.py" "${APP_ARGS[@]}" --results-dir "$E2E_DIR/$size-$ctx-$mode" --out e2e)
        echo "nsys_run.sh: profiling ${app[*]}" >&2
        args_line "$size" "$ctx" "$mode" >"$report.args" || return 1
        "$NSYS_BIN" profile "${NSYS_OPTIONS[@]}" --output="$report" "${app[@]}"
        status=$?
        # the profiled run's own record, kept beside the report, also when it failed (it says why)
        [[ -f "$record" ]] && { cp "$record" "${report}_e2e.jsonl" || return 1; }
        [[ "$(record_status "$record")" == OOM ]] && OUTCOME=OOM
        if ((status != 0)); then
            echo "nsys_run.sh: the profiled run failed with exit status $status" >&2
            FAILURE="failed: the profiled run's exit status was $status"
            ((status == 2)) && APP_REFUSED=1  # bench_e2e's usage error: every configuration would fail alike
            return "$status"
        fi
        if [[ ! -f "$report.nsys-rep" ]]; then
            # bench_e2e exits 0 when its configuration fails (a failure is a row): its record says why
            said="$(record_status "$record")"
            [[ -n "$said" ]] && said="the profiled run recorded \"status\": \"$said\""
            echo "nsys_run.sh: nsys wrote no $report.nsys-rep: ${said:-the 'measure' range never started}" >&2
            [[ -n "$said" ]] || FAILURE="failed: nsys wrote no report (the measure range never started)"
            return 1
        fi
    else
        echo "nsys_run.sh: $report.nsys-rep exists, made with the same arguments: making its tables" >&2
        [[ "$(record_status "${report}_e2e.jsonl")" == OOM ]] && OUTCOME=OOM
    fi

    # --force-export: a stale SQLite file beside the report is never reused (nsys would otherwise only warn).
    local report_args=() name csv level stats_failed=0
    for name in "${REPORTS[@]}"; do
        report_args+=(--report "$name")
        rm -f "${report}_${name}.csv"  # a report this run fails to write must not be read from an earlier run
    done
    "$NSYS_BIN" stats --force-export=true --force-overwrite=true --format csv --output "$report" "${report_args[@]}" \
        "$report.nsys-rep" >"$report.stats.log" 2>&1
    status=$?
    if ((status != 0)); then
        cat "$report.stats.log" >&2
        echo "nsys_run.sh: nsys stats failed with exit status $status" >&2
        FAILURE="failed: nsys stats exited with status $status (see $report.stats.log)"
        return "$status"
    fi
    # nsys stats exits 0 even when a report is unknown or fails (no CSV then), and writes an empty CSV for a report
    # without data (the CUDA reports of a run without GPU work): say which, with what nsys said about it.
    for name in "${REPORTS[@]}"; do
        csv="${report}_${name}.csv"
        [[ -s "$csv" ]] && continue
        # the log's lines about this report, without the "Processing [...] with [...] to [...]... " preamble
        said="$(awk -v r="$name" 'index($0, r) { sub(/^Processing .*\.\.\. */, ""); if (length($0)) print }' \
                "$report.stats.log")"
        if [[ -f "$csv" ]]; then
            echo "nsys_run.sh: note: $name is empty: ${said:-no data}" >&2
        else
            case "$name" in  # the traces are what the tables are made of; the summaries only accompany them
                cuda_gpu_trace|cuda_api_trace|nvtx_pushpop_trace) level=error; stats_failed=1 ;;
                *) level=warning ;;
            esac
            echo "nsys_run.sh: $level: nsys stats wrote no $csv (log: $report.stats.log):" >&2
            echo "${said:-$(tail -n 5 "$report.stats.log")}" | sed 's/^/    /' >&2
        fi
    done
    if ((stats_failed)); then
        FAILURE="failed: nsys stats wrote no trace CSV (see $report.stats.log)"
        return 1
    fi
    "$PYTHON" "$HERE/kernel_tables.py" "$report.nsys-rep" --e2e-jsonl "${report}_e2e.jsonl" --md "$report.md"
    status=$?
    ((status == 0)) || return "$status"
    echo "report: $report.nsys-rep (open it with nsys-ui, the Nsight Systems GUI)"
    OUTCOME=ok
    return 0
}

# ---- every configuration, then the summary ----
mkdir -p "$OUT_DIR" || exit 1
EXIT_STATUS=0
APP_REFUSED=0
SUMMARY_STATUS=()
declare -A OOM_AT=()  # size|mode -> the smallest context that ran out of memory
for i in "${!PLAN_REPORT[@]}"; do
    size="${PLAN_SIZE[i]}" ctx="${PLAN_CTX[i]}" mode="${PLAN_MODE[i]}" report="${PLAN_REPORT[i]}"
    group="$size|$mode"
    if ((!NO_SKIP)) && [[ -n "${OOM_AT[$group]:-}" ]]; then
        reason="skipped: OOM at context_length=${OOM_AT[$group]}"
        echo "nsys_run.sh: $size ctx=$ctx $mode: $reason (--no-skip profiles it anyway)" >&2
        SUMMARY_STATUS+=(--status "$report=$reason")
        continue
    fi
    ((MULTI)) && echo "nsys_run.sh: configuration $((i + 1))/${#PLAN_REPORT[@]}: $size ctx=$ctx $mode" >&2
    profile_one "$size" "$ctx" "$mode" "$report"
    status=$?
    ((status != 0 && EXIT_STATUS == 0)) && EXIT_STATUS=$status
    case "$OUTCOME" in
        OOM) OOM_AT[$group]="$ctx" ;;
        kept) SUMMARY_STATUS+=(--status "$report=kept: made with other arguments (--force replaces it)") ;;
        failed) [[ -n "$FAILURE" ]] && SUMMARY_STATUS+=(--status "$report=$FAILURE") ;;  # else its record says why
    esac
    if ((APP_REFUSED && MULTI)); then
        echo "nsys_run.sh: stopping: the profiled run refused its arguments (exit status 2)" >&2
        break
    fi
done
if ((MULTI)); then
    "$PYTHON" "$HERE/kernel_tables.py" --summary "${PLAN_REPORT[@]}" "${SUMMARY_STATUS[@]}" \
        --results-dir "$RESULTS_DIR" || { status=$?; ((EXIT_STATUS)) || EXIT_STATUS=$status; }
fi
exit "$EXIT_STATUS"
