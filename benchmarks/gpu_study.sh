#!/usr/bin/env bash
# One lent-GPU call for the CIFAR-10 CNN double descent: facts and the CUDA tests (gpu_session.sh's
# `tests` step), the pilot, the design rules applied to it (analysis.design), then the main run's two stop arms at
# what the rules chose, each step in a time box; records come back packed under $OUT.
#
#   OUT=/tmp/out DATA=.gpudata bash benchmarks/gpu_study.sh             # pilot, design rules, main
#   MODE=main PROCS=10 OUT=/tmp/out DATA=.gpudata bash benchmarks/gpu_study.sh   # the declared main (scale=main, 2 arms)
#   MODE=vit_main PROCS=16 OUT=/tmp/out DATA=.gpudata bash benchmarks/gpu_study.sh  # the ViT double descent's main run
#   MODE=vit_fixed ...  # its fixed-budget arm (scale cpu_fixed; `ARM=fixed bash benchmarks/gpu_records.sh prepare`)
#   MODE=vit_main RESUME=.gpudata/vit_main TESTS_BOX=0 ... # the same, resumed from an earlier call's runs
#   ... RESUME=.gpudata/vit_main RESUME_AS=docs/studies/double_descent_vit/records/main_gpu  # from committed records
#
# What a call sends is the checkout's tracked files plus what it carries, at most 64 MiB: the committed study
# records alone are over 70 MB, so before a call take the records it does not read out of the index for its
# duration and put them back after it: `bash benchmarks/gpu_records.sh prepare` (then `restore`) does that and builds
# .gpudata/ and .whl/ for MODE=vit_main; `... recopy FILES_AT HEADER` turns the call's records into the committed ones.
#
# DATA holds the subset archives the machine can take (python -m src.data.prefix ... --test-sample prefix, as the
# committed pilots were built): cifar10_8192_2000.npz and mnist_16384_2000.npz (the first 8192 / 16384 training and
# 2000 test images of ../shared/data/cifar10.npz / mnist.npz; MNIST's test prefix is harder than its whole split, so
# a new pilot should build its archive with the tool's default, a class-stratified test sample). A .whl/ folder of wheels (Hydra,
# Optuna, ...) is installed into /tmp/site first when the machine lacks them. A step stopped by its time box gets
# SIGTERM, so its runs checkpoint and the sweep resumes with the same command.
set -u
cd "$(dirname "$0")/.."
T0=$SECONDS
OUT=${OUT:-outputs/gpu}
DATA=$(realpath "${DATA:-.gpudata}")
W=${WORK:-/tmp/vitsweep_gpu}
DEADLINE=${DEADLINE:-550}   # seconds from start by which every step has ended and the records are packed
PROCS=${PROCS:-8}           # launcher worker processes sharing the GPU
LOG=$W/logs  # step logs and the design tables, packed into $OUT/logs.tar.gz (a call returns at most 8 files)
mkdir -p "$OUT" "$W" "$LOG"
# several worker processes share the GPU: without MPS the GPU time-slices between their contexts, and a small
# model's step (a sync or two) then waits out the others' slices (measured: 50-65 ms a step with 16 processes)
[ "${MPS:-1}" = 1 ] && nvidia-cuda-mps-control -d 2>/dev/null && echo "MPS daemon started"
if [ -d .whl ] && ! python3 -c "import hydra, optuna" 2>/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=/tmp/site
fi
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 HYDRA_FULL_ERROR=1
CIFAR=(dataset.root="$DATA/cifar10_8192_2000.npz")
GPU=(trainer.progress=false trainer.checkpoint_every=20 hydra.launcher.n_procs="$PROCS")
read -r -a EXTRA <<<"${EXTRA:-}"              # overrides for every sweep (a dry run on CPU: smaller data, fewer epochs)
read -r -a PILOT_EXTRA <<<"${PILOT_EXTRA:-}"  # overrides for the pilot only
MAIN_EPOCHS=${MAIN_EPOCHS:-300}

left() { echo $((DEADLINE - (SECONDS - T0))); }
# step NAME SECONDS CMD...: run CMD under a time box (SIGTERM, then SIGKILL KILL_GRACE s later: the launcher gives
# its workers 60 s to save, then the sweeper hands their trials back; 20 s once cut a stopping sweep off on an H100),
# log it, print its tail
step() {
  local name=$1 limit=$2
  shift 2
  [ "$limit" -gt "$(left)" ] && limit=$(left)
  if [ "$limit" -le 5 ]; then echo "== $name: skipped (no time left)"; return 99; fi
  local t0=$SECONDS
  echo "== $name (box ${limit}s): $*"
  timeout -k "${KILL_GRACE:-90}" "$limit" "$@" >"$LOG/$name.log" 2>&1
  local rc=$?
  echo "== $name: rc $rc in $((SECONDS - t0)) s"
  tail -n "${TAIL:-5}" "$LOG/$name.log" | cut -c1-300
  return $rc
}

nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
python3 -c "import torch, sys; print('python', sys.version.split()[0], 'torch', torch.__version__, torch.cuda.get_device_name(0))"
echo "cpus $(nproc)"

if [ "${MODE:-pilot}" = vit_main ] || [ "${MODE:-pilot}" = vit_fixed ]; then  # the ViT double descent's declared main
  # run (scale cpu: 96 runs, 20% noise; its convergence arm) or its fixed-budget arm (MODE=vit_fixed: scale cpu_fixed,
  # 72 runs of 500 epochs at dims 16-64, the rest of its grid being the convergence arm's capped runs,
  # records/main_gpu; the scale's header). Below, vit_main stands for either: the sweep dir, the files that come back.
  N=$MODE ARM=(scale=cpu) CAPPED=()
  if [ "$N" = vit_fixed ]; then
    ARM=(scale=cpu_fixed trainer.converge_epochs=null)
    CAPPED=(--capped-from docs/studies/double_descent_vit/records/main_gpu)
  fi
  # DATA must hold the full mnist.npz (cp ../shared/data/mnist.npz .gpudata/: the subsets are drawn from all 60,000
  # training images, so a prefix archive would give other runs); a second call on the warm machine resumes it, and
  # every run's checkpoint comes back in ckpt_${N}.tar.gz.* parts (cat them, untar into a sweep dir) for
  # a later call or session. The CUDA tests run beside it (TESTS_BOX seconds, 2 processes, each result named in
  # logs/tests.log; 0: none).
  # RESUME: a folder of the checkout holding an earlier call's sweep dir with its checkpoints (carried; made here with
  # `cat ckpt_${N}.tar.gz.* | tar xzf -` over `tar xzf records_${N}.tar.gz`): its paths are $W/$N's
  # RESUME_AS: RESUME is a committed records folder (the committed checkpoints untarred into it, if any: a run without
  # one starts afresh) whose paths are relative to the repository: its own (RESUME_AS, e.g.
  # docs/studies/double_descent_vit/records/main_gpu) and the dataset's (.gpudata/mnist.npz). Both become this
  # machine's, so the sweeper's recipe check sees the same study (the checkpoints name the dataset's absolute path:
  # the device's checkout has been at /work/main, as here). Only for records never rewritten before (a relative
  # .gpudata/mnist.npz); a second call on the warm machine keeps $W/$N as it is.
  if [ -n "${RESUME:-}" ] && [ -d "$RESUME" ] && [ ! -d "$W/$N" ]; then
    cp -a "$RESUME" "$W/$N" && echo "resuming $RESUME ($(ls "$RESUME"/*/summary.json | wc -l) runs)"
    [ -n "${RESUME_AS:-}" ] && python3 -m analysis.records "$W/$N" --in-place --replace "$RESUME_AS=$W/$N" \
      --replace ".gpudata/mnist.npz=$DATA/mnist.npz" | tail -n 1
  fi
  [ "${TESTS_BOX:-240}" -gt 0 ] && step tests "${TESTS_BOX:-240}" python3 -m pytest -p no:cacheprovider -v -rf -n 2 \
    tests/test_speed_paths.py tests/test_stacked.py &
  step $N $(( $(left) - 110 )) python3 -m src.sweep double_descent_vit "${ARM[@]}" dataset.root="$DATA/mnist.npz" \
    "${GPU[@]}" "${EXTRA[@]}" "hydra.sweep.dir=$W/$N"
  wait
  # every run's checkpoint, finished runs' too: a run whose trial is not complete (stacked members handed back by a
  # stop before 2026-11-27, when a group told its members only at its end) returns its result from its final
  # checkpoint when resumed, and without it trains again from scratch (11 dim-20 runs of 2026-11-27 04:47 whose final
  # checkpoints were not packed); gpu_records.sh recopy commits those of the runs whose trials are not complete
  rm -f "$OUT"/ckpt_${N}.tar.gz.*
  (cd "$W" && ls $N/*/checkpoint.pt 2>/dev/null) >"$LOG/resumable.txt"
  [ -s "$LOG/resumable.txt" ] && tar -czf - -C "$W" -T "$LOG/resumable.txt" $N/.launcher \
    | split -b 15M - "$OUT/ckpt_${N}.tar.gz."
  python3 -m analysis.design test "$W/$N" "${CAPPED[@]}" --pilot docs/studies/double_descent_vit/records/pilot_gpu \
    --effect 0.03 --out "$LOG/test_${N}.md" >/dev/null 2>>"$LOG/plan.err"
  ls "$W/$N"/*/summary.json 2>/dev/null | wc -l | xargs echo "$N summaries:"
  tar -czf "$OUT/records_${N}.tar.gz" -C "$W" --exclude='checkpoint*.pt' --exclude=.launcher $N 2>/dev/null
  tar -czf "$OUT/logs.tar.gz" -C "$W" logs
  echo "total $((SECONDS - T0)) s"
  exit 0
fi

if [ "${MODE:-pilot}" = main ]; then  # the declared main run alone (scale main), both stop arms at once
  # an earlier call's committed records (paths relative to the repository): copied to $W/main with their paths
  # made this machine's again (the storage's recipe names the dataset the run was started with), the sweep resumes
  SEED=docs/studies/double_descent_cnn_cifar10/records/main
  if [ -d "$SEED" ] && [ ! -d "$W/main" ]; then
    cp -a "$SEED" "$W/main" && python3 -m analysis.records "$W/main" --in-place --replace "$SEED=$W/main" \
      --replace ".gpudata/=$DATA/" && echo "resuming $SEED"
  fi
  for arm in main main_fixed; do  # the fixed arm: every run the full 300 epochs (the scale's header)
    extra=(); [ $arm = main_fixed ] && extra=(trainer.converge_epochs=null
      hydra.sweeper.study_name=double_descent_cnn_cifar10_main_fixed)
    step "$arm" $(( $(left) - 30 )) python3 -m src.sweep double_descent_cnn_cifar10 scale=main "${CIFAR[@]}" \
      "${GPU[@]}" "${extra[@]}" "${EXTRA[@]}" "hydra.sweep.dir=$W/$arm" &
  done
  wait
  for scale in main main_fixed; do
    python3 -m analysis.design test "$W/$scale" --pilot docs/studies/double_descent_cnn_cifar10/records/pilot_gpu \
      docs/studies/double_descent_cnn_cifar10/records/pilot_gpu_threshold --out "$LOG/test_$scale.md" >/dev/null 2>>"$LOG/plan.err"
    ls "$W/$scale"/*/summary.json 2>/dev/null | wc -l | xargs echo "$scale summaries:"
  done
  for d in main main_fixed; do
    tar -czf "$OUT/records_$d.tar.gz" -C "$W" --exclude='checkpoint*.pt' --exclude=.launcher "$d" 2>/dev/null
  done
  tar -czf "$OUT/logs.tar.gz" -C "$W" logs
  ls -la "$OUT"
  echo "total $((SECONDS - T0)) s"
  exit 0
fi

# the CUDA tests beside the pilots (their own 4 processes)
[ "${TESTS_BOX:-90}" -gt 0 ] && step tests "${TESTS_BOX:-90}" python3 -m pytest -p no:cacheprovider -v -rf -n 4 \
  tests/test_stacked.py tests/test_speed_paths.py &

# the pilots, at once: CIFAR-10 CNN (n_train 2048 and 8192, C1 2-32, lr 0.05/0.02/0.01), MNIST CNN (n_train 1024 and
# 4096, C1 1-16, the same ladder) and MNIST ViT (n_train 1024 and 4096, dims 8-64, weight decay 0.01 and 0); 20% noise,
# seeds 0-1, 300-epoch caps. The CIFAR-10 pilot has half the worker processes.
PILOT=$W/pilot
MNIST=(dataset.root="$DATA/mnist_16384_2000.npz")
step pilot "${PILOT_BOX:-260}" python3 -m src.sweep double_descent_cnn_cifar10 scale=pilot "${CIFAR[@]}" "${GPU[@]}" \
  "${EXTRA[@]}" "${PILOT_EXTRA[@]}" "hydra.sweep.dir=$PILOT" &
if [ "${MNIST_PILOTS:-1}" = 1 ]; then
  step pilot_mnist_cnn "${PILOT_BOX:-260}" python3 -m src.sweep double_descent_cnn scale=pilot "${MNIST[@]}" "${GPU[@]}" \
    hydra.launcher.n_procs=4 "hydra.sweep.dir=$W/pilot_mnist_cnn" &
  step pilot_mnist_vit "${PILOT_BOX:-260}" python3 -m src.sweep double_descent_vit scale=pilot "${MNIST[@]}" "${GPU[@]}" \
    hydra.launcher.n_procs=4 "hydra.sweep.dir=$W/pilot_mnist_vit" &
fi
wait
if ! ls "$PILOT"/*/summary.json >/dev/null 2>&1; then  # stacking broke on CUDA: one job a process
  GPU+=(hydra.launcher.stack=never hydra.launcher.n_procs=14)
  step pilot_unstacked "${PILOT_BOX:-260}" python3 -m src.sweep double_descent_cnn_cifar10 scale=pilot "${CIFAR[@]}" \
    "${GPU[@]}" "${EXTRA[@]}" "${PILOT_EXTRA[@]}" "hydra.sweep.dir=$PILOT"
fi
for p in pilot pilot_mnist_cnn pilot_mnist_vit; do
  [ -d "$W/$p" ] && python3 -m analysis.design plan "$W/$p" --out "$LOG/${p}_plan.md" >/dev/null 2>>"$LOG/plan.err"
done
sed -n '/lr rule/,$p' "$LOG/pilot_plan.md" | head -60
MAIN=$(python3 -m analysis.design plan "$PILOT" --target 6 2>>"$LOG/plan.err" | tail -n 1)
MAIN=${MAIN:-optimizer.lr=0.02 dataset.n_train=8192 model.width=choice(2,3,4,6,8,12,16,24,32) seed=choice(0,1,2)}
echo "== main run overrides: $MAIN"
read -r -a MAINARGS <<<"$MAIN"

# the main run, both stop arms at once (one sweep dir each), 0 and 20% noise
half=$(( $(left) - 35 ))
for arm in converge fixed; do
  extra=(); [ $arm = fixed ] && extra=(trainer.converge_epochs=null)
  step "main_$arm" "$half" python3 -m src.sweep double_descent_cnn_cifar10 "${CIFAR[@]}" "${GPU[@]}" "${MAINARGS[@]}" \
    "${extra[@]}" "${EXTRA[@]}" trainer.max_epochs="$MAIN_EPOCHS" 'label_noise=choice(none,p20)' \
    hydra.sweeper.n_trials=999 hydra.sweeper.n_jobs=999 \
    hydra.sweeper.study_name=dd_cifar10_main_$arm "hydra.sweep.dir=$W/main_$arm" &
done
wait
for arm in converge fixed; do
  python3 -m analysis.design test "$W/main_$arm" --pilot "$PILOT" --out "$LOG/test_$arm.md" >/dev/null 2>&1
  cat "$LOG/test_$arm.md" 2>/dev/null
done
# records without checkpoints (summaries, metrics, configs, Optuna storages): the analysis reads them as they are
for d in "$W"/*/; do  # one archive per sweep (a call returns files of at most 16 MiB)
  d=$(basename "$d"); [ "$d" = logs ] && continue
  tar -czf "$OUT/records_$d.tar.gz" -C "$W" --exclude='checkpoint*.pt' --exclude=.launcher "$d" 2>/dev/null
done
tar -czf "$OUT/logs.tar.gz" -C "$W" logs
ls -la "$OUT"
echo "total $((SECONDS - T0)) s"
