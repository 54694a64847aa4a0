#!/usr/bin/env bash
# Makes .gpujobs/jobs/<name>/: a snapshot of <commit> (without the sample models and result tables, which the GPU
# machine's own tree supplies or the job writes) plus the job's script and time limit, so several jobs, each pinned to
# its own commit, can run in one GPU session (benchmarks/gpu_jobs/run.sh).
# Usage, from the repository root: benchmarks/gpu_jobs/snapshot.sh NAME COMMIT JOB.sh TIMEOUT_S [EXTRA_DIR]
set -euo pipefail
[ $# -ge 4 ] || { echo "usage: $0 NAME COMMIT JOB.sh TIMEOUT_S [EXTRA_DIR]" >&2; exit 2; }
name=$1 commit=$2 job=$3 timeout_s=$4 extra=${5:-}
dir=.gpujobs/jobs/$name
rm -rf "$dir"; mkdir -p "$dir"
git archive "$commit" -- . ':(exclude)models/samples' ':(exclude)benchmarks/results' | tar -x -C "$dir"
cp "$job" "$dir/job.sh"; echo "$timeout_s" > "$dir/timeout"
[ -z "$extra" ] || cp -r "$extra" "$dir/extra"
echo "$dir: $(git rev-parse --short "$commit"), ${timeout_s} s, $(du -sh "$dir" | cut -f1)"
