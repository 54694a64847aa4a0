#!/usr/bin/env bash
# Unpacks a GPU run's results.tar.gz (run.sh) into RESULTS_DIR/<job>/ and removes those jobs' snapshots.
# Usage, from the repository root: benchmarks/gpu_jobs/collect.sh results.tar.gz RESULTS_DIR
set -euo pipefail
[ $# -eq 2 ] || { echo "usage: $0 results.tar.gz RESULTS_DIR" >&2; exit 2; }
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
tar xzf "$1" -C "$tmp"; mkdir -p "$2"
for d in "$tmp"/*/; do
  name=$(basename "$d"); rm -rf "${2:?}/$name"; mv "$d" "$2/$name"; rm -rf ".gpujobs/jobs/$name"
  echo "$name -> $2/$name"
done
cat "$tmp/summary.txt" "$tmp/gpu.txt" 2>/dev/null | tee -a "$2/summaries.txt"
