#!/usr/bin/env bash
# The README's first command: set everything up, then run the main job through the real stack.
#
#   1. set up .venv (scripts/setup.sh; skipped with T3AR_DEMO_SETUP=0)
#   2. build the emoji style-shift data (Google = source style, Twitter = target style) and the auxiliary pool with
#      the data kit: 600 unlabelled OpenClipart images plus the kit's labelled emoji styles outside Twitter's and
#      Google's artwork families (openmoji, openmoji-black, fluent3d: the method benchmark's rule), their class
#      folders the same class names as the source model's; packages are downloaded once into the cache, here,
#      before any job
#   3. train a source model on Google emoji (or reuse .cache/demo/source.pt when source.json shows it was
#      trained on the same data, code, library versions, thread count and CPU ISA)
#   4. `t3ar up` on a fresh state dir: Redis + retriever (empty pool) + API + one worker on 127.0.0.1
#   5. ingest the pool (the emoji styles with their labels), submit a Twitter target subset (its labels are used
#      for evaluation only) with an acceptance holdout (labelled Twitter images outside the target, never trained
#      on) to T3AR with the pool's labels as data (the mixed-pool benchmark's labelled arm: the paper preset,
#      pool_labels.weight 1, the retrieval ranking below), follow the job, download the holdout winner's checkpoint
#   6. print the acceptance table, accuracy on all Twitter emoji before -> after, the pool items used, the job's
#      neighbour quality and, beside them, the mixed-pool benchmark's aggregate (docs/benchmarks/mixed-pool.json;
#      a line says when it has not been run); stop the stack (scripts/demo_report.py prints it)
#
# Environment: T3AR_DEMO_DIR (default .cache/demo), T3AR_CACHE_DIR (downloaded packages, default .cache/packages),
# T3AR_DEMO_EPOCHS (adaptation epochs, default 2), T3AR_DEMO_FRACTION (share of Twitter submitted, default 0.3),
# T3AR_DEMO_HOLDOUT (labelled holdout images per class, default 1; 0 = no holdout),
# OMP_NUM_THREADS (torch threads per process, default 1), T3AR_DEMO_DEVICE (default cpu; auto = CUDA when present),
# T3AR_DEMO_RANKING (the job's retrieval.ranking: index | class-conditional | base-rerank; default: the choice of
# the mixed-pool benchmark, `choice.ranking` of docs/benchmarks/mixed-pool.json, else index),
# T3AR_DEMO_SETUP (default 1; 0 = skip scripts/setup.sh, for a .venv already set up, e.g. shared by worktrees).
#
# --mlflow: the stack starts MLflow's tracking server too (`t3ar up --mlflow`); the job asks for the alias
# `challenger`, and the demo waits for its registration and prints the version it registered (docs/serving.md).
#
# Reproducibility: the printed accuracies are the same in every run on one machine with the same settings.
# They change with OMP_NUM_THREADS and with the CPU's instruction set (oneDNN/MKL kernels: AVX2 vs AVX-512
# give different weight gradients), with the device (CUDA trains with AMP), with the torch/timm/Pillow/numpy
# versions (unpinned ones come from PyPI at set-up), with the openclipart-png version apt serves and with the
# retrieval ranking (which docs/benchmarks/mixed-pool.json may change).
set -euo pipefail
MLFLOW=0
for arg in "$@"; do
  case "$arg" in
    --mlflow) MLFLOW=1 ;;
    *) echo "usage: bash scripts/demo.sh [--mlflow]" >&2; exit 2 ;;
  esac
done
# One torch thread per process: on a small CPU shared with other work, two threads that wait for each other
# at every op were 6x slower (measured here under load: 206 s vs 34 s per adaptation epoch). It also leaves
# the second core to the retriever and the API.
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
# Every torch process of the demo uses that count: the CLI commands through OMP_NUM_THREADS, the stack's worker
# through T3AR_WORKER_TORCH_THREADS (a value inherited from the caller's shell would otherwise win there).
export MKL_NUM_THREADS=$OMP_NUM_THREADS T3AR_WORKER_TORCH_THREADS=$OMP_NUM_THREADS
DEVICE=${T3AR_DEMO_DEVICE:-cpu}
export T3AR_WORKER_DEVICE=$DEVICE
cd "$(dirname "$0")/.."
start=$(date +%s)
step() { printf '\n== [%4ss] %s\n' "$(( $(date +%s) - start ))" "$*" >&2; }

if [ "${T3AR_DEMO_SETUP:-1}" = 0 ]; then
  step "setup skipped (T3AR_DEMO_SETUP=0): using .venv as it is"
else
  step "setup (.venv)"
  bash scripts/setup.sh
fi
T=.venv/bin/t3ar
PY=.venv/bin/python
D=${T3AR_DEMO_DIR:-.cache/demo}
CACHE=${T3AR_CACHE_DIR:-.cache/packages}
EPOCHS=${T3AR_DEMO_EPOCHS:-2}
FRACTION=${T3AR_DEMO_FRACTION:-0.3}
HOLDOUT=${T3AR_DEMO_HOLDOUT:-1}
mkdir -p "$D"

step "emoji data: google (source), twitter (target), 64 px"
"$T" data emoji --out "$D/emoji" --styles google,twitter --cache "$CACHE"

step "auxiliary pool: 600 OpenClipart images"
"$T" data pool --out "$D/pool" --sources openclipart --max-items 600 --cache "$CACHE"

step "labelled pool: the kit's emoji styles outside Twitter's and Google's artwork families, with their classes"
POOL_STYLES=$("$PY" scripts/demo_report.py pool-styles twitter google)
# A kit of its own: the Google/Twitter kit keeps the emoji present in all its styles, so adding styles to it would
# change the source model's data.
"$T" data emoji --out "$D/emoji-pool" --styles "$POOL_STYLES" --cache "$CACHE"
# the job's retrieval ranking: T3AR_DEMO_RANKING, else the mixed-pool benchmark's validation choice, else index
RANKING=$("$PY" scripts/demo_report.py ranking)

step "source model on Google emoji"
TRAIN_ARGS=(--epochs 8 --val-fraction 0.1 --seed 0 --device "$DEVICE")
# source.pt is reused only if it was trained on the same data, code, library versions, threads and CPU ISA.
"$PY" -m t3ar.fingerprint "$D/emoji/google" "${TRAIN_ARGS[@]}" >"$D/source.json.new"
if [ -f "$D/source.pt" ] && cmp -s "$D/source.json" "$D/source.json.new"; then
  echo "reusing $D/source.pt (same data, code, libraries, threads and CPU as when it was trained)" >&2
  rm -f "$D/source.json.new"
else
  [ -f "$D/source.pt" ] && echo "retraining: $D/source.pt was made with other inputs (see $D/source.json)" >&2
  rm -f "$D/source.pt" "$D/source.json"
  "$T" train-source --data "$D/emoji/google" --out "$D/source.pt" "${TRAIN_ARGS[@]}"
  mv "$D/source.json.new" "$D/source.json"
fi

step "target: a stratified ${FRACTION} of Twitter emoji (labels.csv for evaluation only); holdout: ${HOLDOUT} per class"
"$PY" - "$D/emoji/twitter" "$D/target" "$FRACTION" "$D/holdout" "$HOLDOUT" <<'EOF'
import random, shutil, sys
from pathlib import Path
from t3ar.data.datasets import read_labelled, stratified_subsample
src, dst, frac, hold_dir, per_class = Path(sys.argv[1]), Path(sys.argv[2]), float(sys.argv[3]), Path(sys.argv[4]), int(sys.argv[5])
ds = read_labelled(src)
keep = stratified_subsample(ds.labels, len(ds), frac, seed=0)
# the acceptance holdout: per class, seeded, from the images outside the submitted target (never trained on; a
# file with the same bytes as a target image, a few emoji share their image, would be refused by the API)
import hashlib
digest = lambda i: hashlib.sha256(Path(ds.paths[i]).read_bytes()).hexdigest()
in_target = {digest(i) for i in keep}
rest = {}
for i in sorted(set(range(len(ds))) - set(keep)):
    if digest(i) not in in_target:
        rest.setdefault(ds.labels[i], []).append(i)
hold = [i for y in sorted(rest) for i in random.Random(f"demo-holdout:{y}").sample(rest[y], min(per_class, len(rest[y])))]

def write(indices, out):
    shutil.rmtree(out, ignore_errors=True)
    rows = ["path,label"]
    for i in indices:
        rel = Path("images") / ds.ids[i]
        (out / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(ds.paths[i], out / rel)
        rows.append(f"{rel.as_posix()},{ds.classes[ds.labels[i]]}")
    (out / "labels.csv").write_text("\n".join(rows) + "\n")

write(keep, dst)
print(f"{len(keep)} of {len(ds)} twitter images in {dst}", file=sys.stderr)
shutil.rmtree(hold_dir, ignore_errors=True)
if per_class > 0:
    write(hold, hold_dir)
    print(f"{len(hold)} labelled holdout images ({per_class} per class, outside the target) in {hold_dir}",
          file=sys.stderr)
EOF
HOLDOUT_ARGS=()
if [ "$HOLDOUT" -gt 0 ]; then HOLDOUT_ARGS=(--holdout "$D/holdout"); fi

UP_ARGS=()
REGISTER_ARGS=()
if [ "$MLFLOW" = 1 ]; then UP_ARGS=(--mlflow); REGISTER_ARGS=(--register-alias challenger); fi

step "t3ar up ${UP_ARGS[*]} (logs: $D/stack/logs, $D/up.log)"
# A fresh stack every run: a pool left from an earlier run (another pool kit, another code version) would
# add its items to this run's neighbours.
rm -rf "$D/stack"
"$T" up --data-dir "$D/stack" --api-port 0 --retriever-port 0 --workers 1 "${UP_ARGS[@]}" >"$D/up.log" 2>&1 &
up_pid=$!
trap 'kill -TERM "$up_pid" 2>/dev/null; wait "$up_pid" 2>/dev/null || true' EXIT
for _ in $(seq 1 600); do
  [ -f "$D/stack/stack.json" ] && break
  kill -0 "$up_pid" 2>/dev/null || { cat "$D/up.log" >&2; exit 1; }
  sleep 0.5
done
[ -f "$D/stack/stack.json" ] || { echo "the stack did not come up; see $D/up.log" >&2; exit 1; }
eval "$("$PY" -c "import json,sys; print(json.load(open(sys.argv[1]))['exports'])" "$D/stack/stack.json")"
sed -n '1,6p' "$D/up.log" >&2

step "ingest the pool into the retriever: openclipart (unlabelled), then ${POOL_STYLES} (labelled: class folders)"
# One request in flight: batches are committed in file order, so near-duplicate skipping keeps the same images
# in every run (with two in flight, which copy of a near-identical pair is kept depends on timing).
rm -f "$D"/ingest-*.json
"$T" pool ingest "$D/pool" --source openclipart --in-flight 1 --json >"$D/ingest-0-openclipart.json"
n=1
for style in ${POOL_STYLES//,/ }; do
  "$T" pool ingest "$D/emoji-pool/$style" --source "$style" --labels folders --in-flight 1 --json \
    >"$D/ingest-$n-$style.json"
  n=$((n + 1))
done

step "submit the target to T3AR with the pool's labels (ranking ${RANKING}; holdout: source, bn-adapt and t3ar are scored on it)"
# the mixed-pool benchmark's labelled arm (t3ar-labels): AdaptConfig's defaults (the paper preset), the labelled
# neighbours as data at weight 1, k = 5, the ranking chosen above
JOB_CONFIG="{\"retrieval\": {\"k\": 5, \"ranking\": \"$RANKING\"}, \"pool_labels\": {\"weight\": 1}}"
"$T" submit "$D/target" --model "$D/source.pt" --method t3ar --preset paper --mode test --config "$JOB_CONFIG" \
  --epochs "$EPOCHS" --batch-size 32 "${HOLDOUT_ARGS[@]}" "${REGISTER_ARGS[@]}" --out "$D/adapted.pt" \
  --json >"$D/job.json"

if [ "$MLFLOW" = 1 ]; then
  step "MLflow: the job's registration (off the job's path: it finished already)"
  "$PY" - "$D/job.json" >"$D/registration.json" <<'EOF'
import json, os, sys, time
from t3ar.clients.api import ApiClient
job_id = json.load(open(sys.argv[1]))["id"]
with ApiClient(os.environ["T3AR_API_URL"], os.environ.get("T3AR_API_TOKEN")) as api:
    for _ in range(1200):
        reg = api.job(job_id).registration
        if reg is not None and reg.state in ("done", "failed", "skipped"):
            break
        time.sleep(0.5)
print(reg.model_dump_json() if reg is not None else "null")
EOF
fi

step "accuracy on all Twitter emoji (the submitted subset and the rest)"
"$T" evaluate --model "$D/source.pt" --data "$D/emoji/twitter" --device "$DEVICE" --json >"$D/before.json"
"$T" evaluate --model "$D/adapted.pt" --data "$D/emoji/twitter" --device "$DEVICE" --json >"$D/after.json"
"$PY" scripts/demo_report.py report "$D" "$start" "$DEVICE" --ranking "$RANKING" --shift twitter \
  --fraction "$FRACTION"
step "stopping the stack"
