#!/usr/bin/env bash
# The pipeline, replay and capture benchmarks of two revisions, alternated in one run on one machine
# (issue 18's "not slower" check). Usage: benchmarks/compare_revisions.sh BEFORE_REV [ROUNDS]
# BEFORE_REV is checked out as a git worktree under /tmp that uses this checkout's .venv; the
# current working tree is the "after" side. Prints each benchmark's table rows, labelled.
set -euo pipefail
cd "$(dirname "$0")/.."
before_rev=$1
rounds=${2:-2}
before_dir=/tmp/orl-compare-$(git rev-parse --short "$before_rev")
[ -d "$before_dir" ] || git worktree add -q --detach "$before_dir" "$before_rev"
[ -e "$before_dir/.venv" ] || ln -s "$PWD/.venv" "$before_dir/.venv"
benches=(
  "bench_pipeline embedded --sessions 2000 --turns 5 --rate 1000 --repeat 1"
  "bench_pipeline embedded --one-process --sessions 2000 --turns 5 --rate 1000 --repeat 1"
  "bench_pipeline faust --sessions 200 --turns 5 --rate 200 --repeat 1"
  "bench_replay_audit --turns 20000 --lookups 20 --workers 2"
  "bench_capture --requests 1000 --concurrency 1,16 --repeat 1 --transport asgi"
)
lscpu | grep -E "Model name|^CPU\(s\)"
for round in $(seq "$rounds"); do
  for bench in "${benches[@]}"; do
    for side in before after; do
      dir=$PWD; [ "$side" = before ] && dir=$before_dir
      echo "== round $round, $side ($( [ "$side" = before ] && echo "$before_rev" || echo working tree)): $bench; load $(cut -d' ' -f1-3 /proc/loadavg)"
      (cd "$dir" && timeout 1200 .venv/bin/python -m benchmarks.$bench 2>&1 | grep -E '^\|' | grep -v -E '^\| (runtime|---)' || true)
    done
  done
done
