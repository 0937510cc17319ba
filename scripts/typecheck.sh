#!/usr/bin/env bash
# mypy over the `orl` import package as it installs: the top-level folders are its subpackages
# (pyproject.toml's package-dir maps pipeline/ to orl.pipeline, and so on), which mypy cannot follow
# from the source tree. So this links that layout under .typecheck/orl and checks it there;
# mypy's messages are mapped back to the files in the repository.
set -euo pipefail
cd "$(dirname "$0")/.."
tree=.typecheck
rm -rf "$tree"
mkdir -p "$tree/orl"
for entry in orl/*; do
    ln -s "$PWD/$entry" "$tree/orl/"
done
# the subpackage folders, as pyproject.toml's package-dir names them ("orl.pipeline" = "pipeline", ...)
packages=$(.venv/bin/python -c 'import tomllib; d = tomllib.load(open("pyproject.toml", "rb"))["tool"]["setuptools"]["package-dir"]; print(" ".join(v for k, v in d.items() if k != "orl"))')
for package in $packages; do
    ln -s "$PWD/$package" "$tree/orl/$package"
done
status=0
MYPYPATH="$tree" .venv/bin/mypy --config-file pyproject.toml "$tree/orl" "$@" >"$tree/report.txt" 2>&1 || status=$?
sed -E -e "s#^$tree/orl/(${packages// /|})/#\1/#" -e "s#^$tree/orl/#orl/#" "$tree/report.txt"
exit "$status"
