#!/usr/bin/env bash
# The pipeline, replay, capture and trainer benchmarks of two revisions, alternated in one run on one machine
# (issue 18's "not slower" check). Usage: benchmarks/compare_revisions.sh BEFORE_REV [ROUNDS]
# BEFORE_REV is checked out as a git worktree under /tmp that uses this checkout's .venv; the
# current working tree is the "after" side. Prints each benchmark's table rows, labelled.
# Each side imports its own code: the editable install maps `orl` to this checkout's folders, and
# a side's own orl/ folder (the application layer alone) would shadow its subpackages. So each side
# runs from a tree of links to its checkout in which orl/ is laid out as the package installs
# (pyproject.toml's package-dir); Python finds it on sys.path before the editable install's mapping.
set -euo pipefail
cd "$(dirname "$0")/.."
before_rev=$1
rounds=${2:-2}
before_dir=/tmp/orl-compare-$(git rev-parse --short "$before_rev")
[ -d "$before_dir" ] || git worktree add -q --detach "$before_dir" "$before_rev"
[ -e "$before_dir/.venv" ] || ln -s "$PWD/.venv" "$before_dir/.venv"
# link_tree DIR: DIR/.orl-tree links every entry of DIR, with orl/ laid out as DIR's pyproject.toml
# installs it (for a revision before the one import package, orl/ is DIR's own)
link_tree() {
  local dir=$1
  rm -rf "$dir/.orl-tree" && mkdir -p "$dir/.orl-tree"
  (cd "$dir" && .venv/bin/python - <<'PY'
import tomllib
from pathlib import Path
tree = Path(".orl-tree")
mapping = tomllib.load(open("pyproject.toml", "rb")).get("tool", {}).get("setuptools", {}).get("package-dir", {})
for entry in Path(".").iterdir():
    if entry.name not in (".orl-tree", ".git") and not (mapping and entry.name == "orl"):
        (tree / entry.name).symlink_to(entry.resolve() if entry.name != ".venv" else entry.absolute())
if mapping:
    (tree / "orl").mkdir()
    for entry in Path("orl").iterdir():
        (tree / "orl" / entry.name).symlink_to(entry.resolve())
    for package, folder in mapping.items():
        if package != "orl":
            (tree / "orl" / package.split(".", 1)[1]).symlink_to(Path(folder).resolve())
PY
  )
}
link_tree "$before_dir"
link_tree "$PWD"
benches=(
  "bench_pipeline embedded --sessions 2000 --turns 5 --rate 1000 --repeat 1"
  "bench_pipeline embedded --one-process --sessions 2000 --turns 5 --rate 1000 --repeat 1"
  "bench_pipeline faust --sessions 200 --turns 5 --rate 200 --repeat 1"
  "bench_replay_audit --turns 20000 --lookups 20 --workers 2"
  "bench_capture --requests 1000 --concurrency 1,16 --repeat 1 --transport asgi"
  "bench_trainer --kinds lora --steps 2"
)
lscpu | grep -E "Model name|^CPU\(s\)"
for round in $(seq "$rounds"); do
  for bench in "${benches[@]}"; do
    for side in before after; do
      dir=$PWD; [ "$side" = before ] && dir=$before_dir
      echo "== round $round, $side ($( [ "$side" = before ] && echo "$before_rev" || echo working tree)): $bench; load $(cut -d' ' -f1-3 /proc/loadavg)"
      (cd "$dir/.orl-tree" && timeout 1200 .venv/bin/python -m benchmarks.$bench 2>&1 | grep -E '^\|' | grep -v -E '^\| (runtime|---)' || true)
    done
  done
done
