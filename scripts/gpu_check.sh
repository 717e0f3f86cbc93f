#!/usr/bin/env bash
# The one prepared GPU call that measures the learner (docs/learner-gpu.md, "The GPU check"): stages 0-10 in at most
# 8 minutes, each under its own time limit, results in $OUT (one JSON line per stage, raw logs, a table).
#   bash scripts/gpu_check.sh                  # on the GPU machine, .whl/ carried along (scripts/gpu_wheels.sh)
#   DRY=1 bash scripts/gpu_check.sh            # on CPU: the same stages with a tiny model (make gpu-check DRY=1)
# PYTHON picks the interpreter (default python3); arguments go to scripts/gpu_check.py (--budget-s, --only, --out).
set -euo pipefail
cd "$(dirname "$0")/.."
exec "${PYTHON:-python3}" scripts/gpu_check.py "$@"
