#!/usr/bin/env bash
# The test command: set everything up, lint, type-check, then run the whole test suite.
# Extra arguments go to pytest (e.g. `bash scripts/test.sh -m "not slow"`).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
echo "== ruff" >&2
.venv/bin/ruff check .
echo "== mypy" >&2
.venv/bin/mypy  # the packages t3ar and t3ar_services (pyproject.toml)
echo "== import contract (lint-imports)" >&2
.venv/bin/lint-imports --no-cache  # [tool.importlinter] in pyproject.toml
echo "== containers (hadolint, compose schema)" >&2
bash scripts/check_containers.sh
echo "== pytest" >&2
exec .venv/bin/python -m pytest "$@"
