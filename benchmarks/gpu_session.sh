#!/usr/bin/env bash
# The GPU checks of the launcher and studies issues, stage by stage, on a machine with CUDA.
#
#   DATA=../shared/data OUT=outputs/gpu bash benchmarks/gpu_session.sh smoke grid vit
#
# Stages (each logs to $OUT/logs/<step>.log and prints its last lines; a failed step does not stop the rest):
#   smoke    GPU facts, the CUDA-only tests and the stacked/launcher tests on CUDA, one compiled bf16 ViT
#            epoch, a stacked multirun, a small double-descent sweep through the vitsweep sweeper + report
#   grid     benchmarks/grid.py on the full MNIST training set (16 CNNs, 5 epochs): basic launcher (one run after
#            another) against the vectorized launcher (stacked members; grid4: with 4 processes sharing the GPU)
#   profile  benchmarks/step_profile.py on CUDA (where a step's time goes, against the measured matmul peak)
#   vit      benchmarks/throughput.py: the default CIFAR-10 ViT with bf16 + torch.compile, and the time of
#            one 50-epoch patch-4 run of the seed report's recipe on CIFAR-10-shaped data
# A .whl/ folder of wheels beside the checkout (Hydra, Optuna, ... for a machine without them) is installed
# into /tmp/site first. Everything under $OUT/logs is also packed into $OUT/logs.tar.gz after each step.
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-outputs/gpu}
DATA=$(realpath "${DATA:-../shared/data}")
W=${WORK:-/tmp/vitsweep_gpu}
mkdir -p "$OUT/logs" "$W"
if [ -d .whl ] && ! python3 -c "import hydra, optuna" 2>/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=/tmp/site
fi
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 HYDRA_FULL_ERROR=1
MNIST=(dataset=mnist "dataset.root=$DATA/mnist.npz")

step() {  # step NAME SECONDS CMD...: run CMD with a time limit, log it, print its tail
  local name=$1 limit=$2
  shift 2
  local t0=$SECONDS
  echo "== $name: $*"
  timeout "$limit" "$@" >"$OUT/logs/$name.log" 2>&1
  local rc=$?
  echo "== $name: rc $rc in $((SECONDS - t0)) s"
  tail -n "${TAIL:-6}" "$OUT/logs/$name.log" | cut -c1-400
  tar -czf "$OUT/logs.tar.gz" -C "$OUT" logs 2>/dev/null
}

smoke() {
  nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv
  python3 -c "import torch, sys; print('python', sys.version.split()[0], 'torch', torch.__version__,
torch.cuda.get_device_name(0), torch.cuda.get_device_properties(0).multi_processor_count, 'SMs')"
  nproc
  step tests 300 python3 -m pytest -p no:cacheprovider -x -q -n 8 tests/test_speed_paths.py tests/test_stacked.py \
    tests/test_launcher.py tests/test_trainer.py tests/test_resume.py
  step vit_bf16_compile 300 python3 -m src.train "${MNIST[@]}" model.patch=4 dataset.image_size=32 \
    trainer.max_epochs=2 trainer.compile=true trainer.progress=false "hydra.run.dir=$W/vit_compile"
  step stacked_multirun 300 python3 -m src.train -m hydra/launcher=vectorized model=cnn model.width=2,4 \
    label_noise=none,p10 seed=0,1 "${MNIST[@]}" dataset.n_train=4096 trainer.max_epochs=3 trainer.progress=false \
    "hydra.sweep.dir=$W/stacked"
  step dd_sweep 300 python3 -m src.sweep double_descent_cnn "${MNIST[@]}" dataset.n_train=2048 \
    'model.width=choice(1,4)' hydra.sweeper.n_trials=18 hydra.sweeper.n_jobs=18 trainer.max_epochs=5 \
    trainer.progress=false "hydra.sweep.dir=$W/dd"
  step dd_report 120 python3 -m analysis.report "$W/dd" --out "$W/dd_report"
  cp "$W"/dd_report/*.md "$OUT/logs/" 2>/dev/null
  tar -czf "$OUT/logs.tar.gz" -C "$OUT" logs
}

# 16 runs of 5 epochs: 144 s basic + 94 s vectorized on an H200 (2026-11-28); grid.py's default 36-run, 10-epoch
# grid would take about 10 minutes on the basic launcher alone, more than a lease's call
GRID=(--device cuda --grid model=cnn model.width=1,2,4,8 label_noise=none,p20 seed=0,1 --epochs 5 --data "${MNIST[@]}")

grid() {
  TAIL=12 step grid_mnist_full 590 python3 benchmarks/grid.py "${GRID[@]}" --modes basic vectorized --out "$W/grid"
}

grid4() {  # the same grid, its vectorized mode with 4 worker processes sharing the GPU
  TAIL=12 step grid_mnist_full_4procs 400 python3 benchmarks/grid.py "${GRID[@]}" --modes vectorized \
    --extra hydra.launcher.n_procs=4 --out "$W/grid4"
}

vit() {
  TAIL=25 step vit_throughput 300 python3 benchmarks/throughput.py --steps 100 --warmup 5
  TAIL=25 step vit_throughput_patch2 300 python3 benchmarks/throughput.py --patch 2 --steps 50 --warmup 5
}

profile() {  # benchmarks/step_profile.py on CUDA: the default ViT (eager, then compiled) and the study CNN at C1 = 64
  mkdir -p "$OUT/logs/profile"
  TAIL=40 step profile_vit "${PROFILE_BOX:-120}" python3 benchmarks/step_profile.py --steps 30 --profile-steps 5 \
    --out "$OUT/logs/profile"
  [ "${PROFILE_COMPILED:-1}" = 1 ] && TAIL=8 step profile_vit_compiled "${PROFILE_BOX:-120}" python3 benchmarks/step_profile.py --steps 30 \
    --profile-steps 3 --compile on --top 5 --out "$OUT/logs/profile" --tag compiled
  TAIL=30 step profile_cnn64 "${PROFILE_BOX:-120}" python3 benchmarks/step_profile.py --model cnn --width 64 \
    --augment none --steps 30 --profile-steps 5 --out "$OUT/logs/profile" --tag width64
}

for stage in "$@"; do
  "$stage"
done
