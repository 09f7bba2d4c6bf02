#!/bin/bash
# Prepare the run on your GPU machine (benchmarks/gpu_run.sh), here, from the repo root: the
# Python packages the library needs that the GPU machine's Python lacks, as wheels for its
# Python 3.12 (.whl/), and the data the long grids read (.devdata/: char-PTB, about 12 MB).
# Both folders are git-ignored; copy them to the GPU machine with the working tree.
#
#   bash benchmarks/gpu_prepare.sh [DATA_DIR]     # DATA_DIR: default $ATTENTION_ATLAS_DATA
#
# The wheels are for a GPU machine that has torch, numpy, scipy, pandas, scikit-learn, tqdm and
# pyyaml but not plotly and pydantic (with their own needs), and no network; one with the
# project's environment (make venv) needs none of this but the data (NO_WHEELS=1 there).
set -euo pipefail
cd "$(dirname "$0")/.."
data=${1:-${ATTENTION_ATLAS_DATA:-}}
if [ -z "$data" ] || [ ! -f "$data/ptb-char/ptb.char.train.txt" ]; then
    echo "gpu_prepare: expected a data folder holding ptb-char/ (argument or \$ATTENTION_ATLAS_DATA), got '${data}'" >&2
    exit 2
fi
rm -rf .devdata && mkdir -p .devdata && cp -r "$data/ptb-char" .devdata/
mkdir -p .whl
py=${PYTHON:-.venv/bin/python}
# the versions of the lock (requirements.lock) where it names them
pinned() { for n in "$@"; do grep -iE "^${n//-/[-_]}==" requirements.lock | head -1 || echo "$n"; done; }
rm -f .whl/*.whl
"$py" -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 \
    --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 -d .whl \
    $(pinned plotly narwhals pydantic annotated-types typing-inspection typing-extensions) pydantic-core
# pydantic pins pydantic-core exactly: keep the one it names
want=$(unzip -p .whl/pydantic-2*.whl '*/METADATA' | sed -n 's/^Requires-Dist: pydantic-core==\([0-9.]*\).*/\1/p')
if [ -n "$want" ] && ! ls .whl/pydantic_core-"$want"-* >/dev/null 2>&1; then
    rm -f .whl/pydantic_core-*
    "$py" -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 \
        --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
        --platform manylinux2014_x86_64 -d .whl "pydantic-core==$want"
fi
# the commit the records made there will name (a copy of the working tree has no .git): HEAD, and
# whether src/, pyproject.toml or requirements.lock differ from it (git_state's rule)
dirty=0
[ -n "$(git status --porcelain -- src pyproject.toml requirements.lock)" ] && dirty=1
echo "$(git rev-parse HEAD) $dirty" > .devdata/git-state
du -sh .whl .devdata
