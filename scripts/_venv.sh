# Sourced by the run-* scripts: create .venv (once) with a CPU torch and flashcheck[dev] installed editable.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ] || [ ! -f .venv/.flashcheck-ready ] || [ pyproject.toml -nt .venv/.flashcheck-ready ]; then
  echo "[flashcheck] setting up .venv (first run only)..." >&2
  [ -x .venv/bin/python ] || "$PY" -m venv .venv
  # torch first, pinned: a CPU build on these machines; a bare 'torch' requirement could pull a multi-GB CUDA build
  .venv/bin/python -c "import torch" 2>/dev/null || .venv/bin/pip install -q "torch==${FLASHCHECK_TORCH:-2.13.0}"
  .venv/bin/pip install -q -e ".[dev]"
  touch .venv/.flashcheck-ready
fi
export PATH="$PWD/.venv/bin:$PATH"
