#!/usr/bin/env bash
# Fetch, here (the network is needed), the wheels of the project's pure-Python dependencies that the GPU machine's
# image lacks — pydantic, pydantic-settings, the redis client and what they depend on — for CPython 3.12 on x86_64
# Linux, into .whl/ (git-ignored). Carry .whl/ to the GPU machine with the tree; scripts/gpu_check.sh installs them
# there (unpacked into a temporary directory on PYTHONPATH; no pip needed). Versions: those of the interpreter that runs this
# (PYTHON, default python3; use the project's .venv/bin/python so the GPU runs what CI tests).
#   bash scripts/gpu_wheels.sh [more requirements...]
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
mapfile -t requirements < <("$PY" scripts/gpu_check.py --wheel-requirements)
rm -rf .whl
"$PY" -m pip download -q --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  --platform any -d .whl "${requirements[@]}" "$@"
ls .whl
du -sh .whl
