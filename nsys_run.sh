#!/usr/bin/env bash
# Nsight Systems profiles of bench_e2e.py's measured steps, as kernel tables: runner.py's nsys_run_main does it all.
#
#   bash nsys_run.sh medium 256                      # one configuration: a training step
#   bash nsys_run.sh --size small medium --context-length 256 512 1024 --mode forward train
#   bash nsys_run.sh --dry-run                       # the handout's plan, listed
#   bash nsys_run.sh --help                          # every option, the environment, the exit statuses
#
# PYTHON = the interpreter (default: python3); NSYS = the nsys binary (default: nsys on PATH). docs/nsys_run.md.
set -u
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)" || exit 1
python="${PYTHON:-python3}"
if ! command -v "$python" >/dev/null 2>&1; then
    echo "nsys_run.sh: error: PYTHON=$python is not a Python interpreter: set PYTHON to one" >&2
    exit 2
fi
exec "$python" "$here/runner.py" "$@"
