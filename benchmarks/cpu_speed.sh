#!/usr/bin/env bash
# The CPU speed figures in one run, on a quiet machine: where the default ViT's step goes (benchmarks/step_profile.py),
# the tutorial trainer against vitsweep (benchmarks/throughput.py), the small study models' epochs against their
# FLOP limit (benchmarks/epoch_costs.py) and the launcher's efficiency (benchmarks/grid.py); with the `compiled` step,
# the default ViT's step and the small ViT's epoch again under trainer.compile=true.
#
#   bash benchmarks/cpu_speed.sh [STEPS...]              # all: vit throughput small grid
#   bash benchmarks/cpu_speed.sh vit compiled           # eager against torch.compile, the same steps
#   BEFORE=/path/to/older/checkout bash benchmarks/cpu_speed.sh vit throughput   # the same figures for older code too
#
# Output: printed, and the profiles as Markdown under $OUT (default docs/benchmarks/profile).
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-docs/benchmarks/profile}
PY=${PY:-python}
MNIST=${MNIST:-../shared/data/mnist.npz}
BEFORE=${BEFORE:-}
mkdir -p "$OUT"
# measure the precision and attention probes afresh: a machine's probe cache (src/probe_cache.py) keeps the first
# measurement of a shape, which may have been taken under load (the 2026-11-26 20:10 and 20:20 runs printed a cached
# probe: explicit 742 ms against sdpa 940 ms a block, measured while another process trained on the same cores)
export VITSWEEP_PROBE_CACHE=off
echo "# $(date -u '+%Y-%m-%d %H:%M UTC') | $(lscpu | sed -n 's/^Model name: *//p') | family $(lscpu | sed -n 's/^CPU family: *//p') model $(lscpu | sed -n 's/^Model: *//p') | $(nproc) cores | $(grep -o -w -m1 avx512_bf16 /proc/cpuinfo || echo 'no avx512_bf16') | load $(cut -d' ' -f1-3 /proc/loadavg)"
git log -1 --format='# code: %h %s' | cut -c1-150

vit() {  # the default ViT: profile of the step, after (this checkout) and before ($BEFORE)
  $PY benchmarks/step_profile.py --steps 10 --profile-steps 3 --out "$OUT" 2>&1 | grep -v "^USDT\|^ERROR:.*gpuGet"
  if [ -n "$BEFORE" ]; then  # this checkout's profiler (and the helpers it imports) on the older code
    cp benchmarks/step_profile.py benchmarks/throughput.py "$BEFORE/benchmarks/"
    (cd "$BEFORE" && $PY benchmarks/step_profile.py --steps 10 --profile-steps 3 2>&1 | grep -v "^USDT\|^ERROR:.*gpuGet") \
      | tee "$OUT/vit_cpu_before.md"
    git -C "$BEFORE" checkout -q -- benchmarks  # the older checkout's own throughput.py for its comparison below
  fi
}

throughput() {  # the tutorial-style trainer against vitsweep, same ViT, same steps, one process
  $PY benchmarks/throughput.py --steps 10 --warmup 2 2>&1 | grep -E "^#|speed-up|images/s|peak|FLOPs"
  [ -n "$BEFORE" ] && (cd "$BEFORE" && $PY benchmarks/throughput.py --steps 10 --warmup 2 2>&1 \
    | grep -E "speed-up|images/s" | sed 's/^/before: /')
}

small() {  # the small study models at n_train 2048, one thread (a sweep worker's share of 2 cores)
  echo "| run | precision | s/epoch | training steps | rest (evaluation, bookkeeping) | FLOP limit of the steps (s) | overhead ms/step | MFLOP/image | peak GFLOP/s |"
  echo "|---|---|---|---|---|---|---|---|---|"
  $PY benchmarks/epoch_costs.py --study double_descent_cnn --model cnn --width 4 --root "$MNIST"
  $PY benchmarks/epoch_costs.py --study double_descent_cnn --model cnn --width 32 --root "$MNIST" | grep -v "^<!--"
  $PY benchmarks/epoch_costs.py --study double_descent_vit --model vit --dim 32 --root "$MNIST" | grep -v "^<!--"
}

compiled() {  # torch.compile (inductor's C++ kernels): the default ViT's step and the small ViT's epoch. The first
  # compile of a shape takes up to minutes on 2 cores; the warm-up steps and the first epoch pay it, outside the timed figures
  $PY benchmarks/step_profile.py --compile on --steps 10 --profile-steps 3 --out "$OUT" --tag compiled 2>&1 \
    | grep -v "^USDT\|^ERROR:.*gpuGet\|^W[0-9]"
  $PY benchmarks/epoch_costs.py --study double_descent_vit --model vit --dim 32 --root "$MNIST" \
    --override trainer.compile=true 2>&1 | grep -v "^<!--\|^W[0-9]"
}

grid() {  # the launcher against Hydra's basic one: 18 small CNNs, 30 epochs on the embedded digits
  $PY benchmarks/grid.py --grid model=cnn model.width=1,2,4 label_noise=none,p10,p20 seed=0,1 --data dataset=digits \
    --epochs 30 --out "${GRID_OUT:-/tmp/vitsweep_grid}" 2>&1 | tail -8
  [ -n "$BEFORE" ] && (cd "$BEFORE" && $PY benchmarks/grid.py --grid model=cnn model.width=1,2,4 label_noise=none,p10,p20 \
    seed=0,1 --data dataset=digits --epochs 30 --modes vectorized --out "${GRID_OUT:-/tmp/vitsweep_grid}_before" 2>&1 \
    | tail -4 | sed 's/^/before: /')
}

for step in "${@:-vit throughput small grid}"; do
  for s in $step; do "$s"; done
done
