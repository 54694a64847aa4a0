#!/usr/bin/env bash
# GPU side: runs each job folder named in $JOBS (made by snapshot.sh) in turn, with the wheels in .whl installed once
# and each snapshot importable as trt_fusedattn; every job writes into $RES, and all of them end up in
# $OUT/results.tar.gz (unpack with collect.sh). A job's time limit is cut so that the whole run ends within $BUDGET s.
# Usage, from the repository root: JOBS=".gpujobs/jobs/a .gpujobs/jobs/b" OUT=dir [BUDGET=575] benchmarks/gpu_jobs/run.sh
set -u
ROOT=$PWD T_START=$(date +%s) BUDGET=${BUDGET:-575}
: "${JOBS:?name the job folders in JOBS}" "${OUT:?name the output folder in OUT}"
mkdir -p /tmp/results
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
fi
nvidia-smi --query-gpu=name,clocks.max.sm,memory.total --format=csv > /tmp/results/gpu.txt 2>&1
for d in $JOBS; do
  d=${d%/}; name=$(basename "$d"); RES=/tmp/results/$name; mkdir -p "$RES"
  [ -e "$d/models/samples" ] || ln -sfn "$ROOT/models/samples" "$d/models/samples"
  # the installed package maps plugins/ and rewrites/ under trt_fusedattn; links give a snapshot the same layout
  ln -sfn ../plugins "$d/trt_fusedattn/plugins"; ln -sfn ../rewrites "$d/trt_fusedattn/rewrites"
  t=$(cat "$d/timeout" 2>/dev/null || echo 250)
  left=$(( BUDGET - ($(date +%s) - T_START) - 12 )); [ "$t" -gt "$left" ] && t=$left
  start=$(date +%s)
  (cd "$d" && export RES PYTHONUNBUFFERED=1 PYTHONPATH="$PWD:/tmp/site" && timeout -k 10 "$t" bash job.sh) > "$RES/log.txt" 2>&1
  echo "$name rc=$? wall=$(( $(date +%s) - start ))s limit=$t" | tee -a /tmp/results/summary.txt
done
tar czf "$OUT/results.tar.gz" -C /tmp/results .
for d in $JOBS; do n=$(basename "${d%/}"); echo "== $n"; tail -c 1800 "/tmp/results/$n/log.txt"; done
cat /tmp/results/gpu.txt /tmp/results/summary.txt
