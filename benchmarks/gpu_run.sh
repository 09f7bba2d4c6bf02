#!/bin/bash
# One prepared run on your GPU machine (from the repo root of a copy of the working tree),
# sized to a time budget: the kernel benchmark and the training steps on the GPU (chapter 8's
# CUDA records), then as many cells of chapter 4's long grid (the Fiber Bundle arms first: made
# on a GPU, they stay valid whatever the CPU kernels become) and of chapter 5's as the time left
# allows. Everything it made comes back as one file, $OUT/results.tgz (the results store's new
# records; extract it in the repo root here, check with `python -m attention_atlas results list`,
# commit).
#
#   here:             bash benchmarks/gpu_prepare.sh   # wheels (.whl/) and data (.devdata/)
#   your GPU machine: bash benchmarks/gpu_run.sh       # in the copy, with .whl/ and .devdata/
#
# Knobs (environment): OUT (where its logs and results.tgz go, default artifacts/gpu-out),
# BUDGET_S (seconds for the whole script, default 540), WORKERS (cells at once on the GPU,
# default 4), CPU_WORKERS and GPU_MATROIDAL_WORKERS (chapter 5's cells at once on the CPU,
# default 8, and on the GPU, default 2; MATROIDAL_SEEDS, MATROIDAL_GPU_SEEDS their seeds),
# LENGTHS (the benchmark's lengths), DEVICE (default cuda), PYTHON (default python3),
# NO_WHEELS=1 (use the installed packages), STEPS_ONLY=1 (kernels only). A rehearsal on a CPU: DEVICE=cpu NO_WHEELS=1 PYTHON=.venv/bin/python LENGTHS="256" BUDGET_S=120 \
#   SMOKE=1 bash benchmarks/gpu_run.sh   (smoke grids into a scratch store)
set -uo pipefail
cd "$(dirname "$0")/.."
root=$PWD
OUT=${OUT:-$root/artifacts/gpu-out}
mkdir -p "$OUT"
PY=${PYTHON:-python3}
if [ -d .whl ] && [ -z "${NO_WHEELS:-}" ]; then
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/site .whl/*.whl || { echo "gpu_run: installing .whl/ failed" >&2; exit 1; }
    export PYTHONPATH=/tmp/site:$root/src
else
    export PYTHONPATH=$root/src
fi
export ATTENTION_ATLAS_DATA=${ATTENTION_ATLAS_DATA:-$root/.devdata} PYTHONUNBUFFERED=1
# the copy there has no .git, or a stale one (seen: a commit 16 behind, so "dirty"): the
# records' commit is what gpu_prepare.sh read here
if [ -f .devdata/git-state ]; then
    read -r ATTENTION_ATLAS_GIT_COMMIT ATTENTION_ATLAS_GIT_DIRTY < .devdata/git-state
    export ATTENTION_ATLAS_GIT_COMMIT ATTENTION_ATLAS_GIT_DIRTY
fi
DEVICE=${DEVICE:-cuda}
WORKERS=${WORKERS:-4}
CPU_WORKERS=${CPU_WORKERS:-8}
GPU_MATROIDAL_WORKERS=${GPU_MATROIDAL_WORKERS:-2}
LENGTHS=${LENGTHS:-256 512 1024 2048 4096 8192 16384}
BUDGET=${BUDGET_S:-540}
if [ -n "${SMOKE:-}" ]; then  # a rehearsal: smoke grids, a scratch results store, one
    export ATTENTION_ATLAS_RESULTS=$OUT/store  # variant's training step at the book shape
    PRESET=smoke MATROIDAL_SEEDS="0 1 2 3 4" MATROIDAL_GPU_SEEDS=5 TRAIN_SHAPES=book TRAIN_VARIANTS=cofactor TRAIN_REPS=1 TRAIN_MIN_LEFT=60
else
    # chapter 5's long grid is complete at seeds 17 to 19: the CPU on down from 16, the GPU up from 0
    PRESET=long MATROIDAL_SEEDS=${MATROIDAL_SEEDS:-"16 15 14 13 12 11 10"} TRAIN_SHAPES="book long"
    MATROIDAL_GPU_SEEDS=${MATROIDAL_GPU_SEEDS:-"0 1 2 3 4 5 6 7"} TRAIN_VARIANTS="" TRAIN_REPS=5 TRAIN_MIN_LEFT=240
fi
store=${ATTENTION_ATLAS_RESULTS:-$root/results}
t0=$(date +%s)
left() { echo $((BUDGET - ($(date +%s) - t0))); }

"$PY" - <<'EOF' | tee "$OUT/env.txt"
import torch
gpu = torch.cuda.get_device_name() if torch.cuda.is_available() else "no GPU"
print(f"torch {torch.__version__}, {gpu}")
EOF
# 1. the kernels against SDPA (chapter 8): results/bench/<device>/kernels-float32.json
#    (stored after each length; a kernel whose next length would pass 3 s a call stops there: on
#    the first H200 run the Fiber Bundle kernel's lengths took most of the budget)
timeout $(($(left) / 3)) "$PY" -m attention_atlas bench --lengths $LENGTHS --device "$DEVICE" \
    --max-call-s 3 --store > "$OUT/bench.txt" 2>&1 \
    || echo "gpu_run: the benchmark stopped ($?)" >> "$OUT/bench.txt"
tail -30 "$OUT/bench.txt"
# 1b. training steps against dot at chapter 4's two shapes (chapter 8): train-<shape>.json
for shape in $TRAIN_SHAPES; do
    [ "$(left)" -gt "$TRAIN_MIN_LEFT" ] || break  # the sweeps keep most of the time
    timeout 90 "$PY" -m attention_atlas bench --train $TRAIN_VARIANTS --shape $shape \
        --device "$DEVICE" --reps "$TRAIN_REPS" --store >> "$OUT/bench-train.txt" 2>&1 \
        || echo "gpu_run: bench --train $shape stopped ($?)" >> "$OUT/bench-train.txt"
done
grep -E "^(training|variant|[a-z_]+ +[0-9])|gpu_run" "$OUT/bench-train.txt" | tail -20
# 1c. where the two costliest steps go, by operator (the host's launches and waits included)
if [ "$(left)" -gt "$TRAIN_MIN_LEFT" ]; then
    timeout 45 "$PY" benchmarks/profile_step.py riemannian fiber_bundle --shape "${TRAIN_SHAPES##* }" \
        --device "$DEVICE" --steps 2 --top 15 > "$OUT/profile.txt" 2>&1
    grep "^==" "$OUT/profile.txt" | cut -c1-300
fi
# 2. the long grids' cells at once: chapter 4's Fiber Bundle arms on the GPU (WORKERS cells at
#    a time: few enough that each runs at its own launch-bound speed and finishes inside the
#    budget), chapter 5's on the GPU too (GPU_MATROIDAL_WORKERS, seeds from 0 up: small models,
#    a few milliseconds a step) and on the spare CPU cores (CPU_WORKERS, the GPU hidden, seeds
#    from 16 down), one seed of every configuration at a time; the two chapter 5 runners never
#    share a seed. A finished cell is a record; a stopped one leaves none (the next run resumes)
fbt="fbt fbt_reg-none fbt_noise fbt_reg-l2 fbt_alpha-0 fbt_rank-1 fbt_rank-8 fbt_kappa-0.1 fbt_kappa-10"
[ -n "${SMOKE:-}" ] && fbt="fbt fbt_reg-none"  # the smoke grid has fewer arms
matroidal_seeds() {  # LOG WORKERS WHERE SEED...: chapter 5's grid, one seed at a time
    local log=$1 workers=$2 where=$3
    shift 3
    for seed in "$@"; do
        [ "$(left)" -gt 60 ] || break
        timeout $(($(left) - 45)) "$PY" -m attention_atlas sweep matroidal --seeds "$seed" --join \
            --preset "$PRESET" --workers "$workers" --no-progress >> "$log" 2>&1
        echo "gpu_run: sweep matroidal ($where) seed $seed ended ($?)" >> "$log"
    done
}
if [ -z "${STEPS_ONLY:-}" ] && [ "$(left)" -gt 90 ]; then
    stop=$(($(left) - 45))
    (export CUDA_VISIBLE_DEVICES=""
     matroidal_seeds "$OUT/sweep-cpu.txt" "$CPU_WORKERS" CPU $MATROIDAL_SEEDS) &
    (matroidal_seeds "$OUT/sweep-gpu.txt" "$GPU_MATROIDAL_WORKERS" GPU $MATROIDAL_GPU_SEEDS) &
    timeout $stop "$PY" -m attention_atlas sweep fiber-bundle --only $fbt --seeds 0 1 2 3 4 \
        --preset "$PRESET" --workers "$WORKERS" --no-progress >> "$OUT/sweep.txt" 2>&1
    echo "gpu_run: sweep fiber-bundle ended ($?)" >> "$OUT/sweep.txt"
    wait
    for part in gpu cpu; do
        [ -f "$OUT/sweep-$part.txt" ] && cat "$OUT/sweep-$part.txt" >> "$OUT/sweep.txt"
        rm -f "$OUT/sweep-$part.txt"
    done
    grep -E "^\[sweep\]|gpu_run" "$OUT/sweep.txt" | tail -30
fi
# 3. everything the store gained, as one file
(cd "$store/.." && tar czf "$OUT/results.tgz" --exclude='*.lock' --exclude='.*.tmp' --exclude='.checkpoints' \
    "$(basename "$store")") && ls -la "$OUT/results.tgz"
