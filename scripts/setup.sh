#!/usr/bin/env bash
# Create or update the project's virtual environment (.venv) with t3ar and every extra installed.
# Idempotent: re-installs only when pyproject.toml or requirements.lock changed. Needs Python 3.11 (the
# interpreter the lock was made with) and access to PyPI.
set -euo pipefail
cd "$(dirname "$0")/.."

py=${T3AR_PYTHON:-}
if [ -z "$py" ]; then
  for cand in python3.11 python3; do
    if command -v "$cand" >/dev/null && "$cand" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))'; then
      py=$cand; break
    fi
  done
fi
[ -n "$py" ] || { echo "setup: Python 3.11 is required (set T3AR_PYTHON=/path/to/python3.11)" >&2; exit 1; }

if [ ! -x .venv/bin/python ]; then
  echo "setup: creating .venv with $py" >&2
  "$py" -m venv .venv
fi
stamp=.venv/.t3ar-installed
want=$(cat pyproject.toml bench/pyproject.toml requirements.lock | sha256sum | cut -d' ' -f1)
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  echo "setup: installing t3ar[all,dev,milvus-server,mlflow] and t3ar-bench into .venv (first time: torch is large, a few minutes)" >&2
  log=.venv/pip-install.log
  # versions pinned by requirements.lock (scripts/lock.sh): the same packages on every machine and in CI
  # milvus-server: the real Milvus server that the tests marked milvus_server start (pyproject.toml)
  # mlflow: the MLflow client the API registers models with, and the tracking server the tests marked
  # mlflow_server start (pyproject.toml)
  # ./bench: the benchmarks (`t3ar bench`), a distribution of their own that the product's wheel does not ship
  # --no-compile, then compileall on every core: pip byte-compiles the installed modules one at a time (torch's
  # CUDA build alone is thousands of them); a fresh install here took 140 s + 45 s against 225 s on 2 cores. The
  # .pyc files must exist: with PYTHONDONTWRITEBYTECODE set (as on this project's machines) nothing writes them
  # later, and every process would compile torch again on import.
  if ! .venv/bin/python -m pip install --disable-pip-version-check --no-compile -e ".[all,dev,milvus-server,mlflow]" -e ./bench -c requirements.lock \
      >"$log" 2>&1; then
    grep -v "^WARNING: Location" "$log" | tail -n 30 >&2
    echo "setup: pip install failed (full log: $log)" >&2
    exit 1
  fi
  # a few modules are for newer Pythons (torch's py312_intrinsics.py) and do not compile: pip skips them too
  .venv/bin/python -m compileall -q -j 0 "$(.venv/bin/python -c 'import sysconfig; print(sysconfig.get_path("purelib"))')" \
    >>"$log" 2>&1 || true
  echo "$want" > "$stamp"
fi

# mypy reads sources, not setuptools' package mapping: it finds services/ under its import name through this link
mkdir -p .cache/typecheck
ln -sfn ../../services .cache/typecheck/t3ar_services

# The console's browser tests (tests/e2e/test_console_browser.py) drive Debian's chromium through Playwright,
# never a browser a tool downloads itself. CI runs as root on a clean machine: install it there; elsewhere say how.
if ! command -v chromium >/dev/null 2>&1; then
  apt=""
  if [ "$(id -u)" = 0 ]; then apt="apt-get"; elif command -v sudo >/dev/null && sudo -n true 2>/dev/null; then apt="sudo -n apt-get"; fi
  if [ -n "$apt" ] && command -v apt-get >/dev/null; then
    echo "setup: installing chromium (apt-get) for the console's browser tests" >&2
    if ! ($apt update -qq && DEBIAN_FRONTEND=noninteractive $apt install -y -qq chromium) >.venv/apt-chromium.log 2>&1; then
      echo "setup: could not install chromium (log: .venv/apt-chromium.log); the browser tests will skip" >&2
    fi
  else
    echo "setup: no chromium: the console's browser tests will skip (install it: sudo apt-get install chromium)" >&2
  fi
fi
