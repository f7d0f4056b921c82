#!/usr/bin/env bash
# The local side of a lent-GPU call that resumes a committed study run (`MODE=vit_main` of benchmarks/gpu_study.sh, or
# with ARM=fixed `MODE=vit_fixed`, the fixed-budget arm), so that a session with no memory of the last one does each
# step the same way:
#
#   bash benchmarks/gpu_records.sh prepare            # .whl/ and .gpudata/ for the call; the index shrunk under 64 MiB
#   (the `run` printed by prepare, on the lent GPU; a second call on the warm machine resumes it)
#   bash benchmarks/gpu_records.sh restore            # the index as it was (before any commit)
#   bash benchmarks/gpu_records.sh recopy FILES_AT "# call 5, ..."   # the call's records into the committed folder
#                                                     # (after restore; once per call, in order: each call's log)
#
# ARM=main (default: the convergence arm, records/main_gpu) or fixed (records/fixed_gpu: its first call starts the
# sweep, later ones resume it; its test takes the convergence arm's capped runs, --capped-from records/main_gpu).
# REC (default docs/studies/double_descent_vit/records/main_gpu or fixed_gpu) is the committed records folder;
# ${REC}_resume/ holds the checkpoints a later call resumes from. recopy replaces REC by the call's records (paths made relative to
# the repository again: the device's checkout is at /work/main and the sweep at /tmp/vitsweep_gpu/vit_main), appends
# the call's sweep log to REC/sweep.log under the given header line, keeps the checkpoints of every run whose trial
# is not complete (none left: the resume folder goes), stages both and prints the declared test on the records.
set -euo pipefail
cd "$(dirname "$0")/.."
ARM=${ARM:-main}
case $ARM in
main) N=vit_main STUDY=double_descent_vit CAPPED=() ;;
fixed) N=vit_fixed STUDY=double_descent_vit_fixed CAPPED=(--capped-from docs/studies/double_descent_vit/records/main_gpu) ;;
*) echo "ARM=$ARM: main (the convergence arm) or fixed (the fixed-budget arm)" >&2; exit 2 ;;
esac
REC=${REC:-docs/studies/double_descent_vit/records/${ARM}_gpu}
PY=${PY:-python3}
# records the call does not read, out of the index for its duration (the tree, .gpudata and .whl: about 50 MB)
BIG=(docs/studies/double_descent_cnn_cifar10 docs/studies/double_descent_cnn docs/studies/heads_depth
     docs/studies/double_descent_vit/records/main_bf16 docs/studies/double_descent_vit/records/main_bf16_resume)

EXCLUDE=$(git rev-parse --git-path info/exclude)

case "${1:-}" in
prepare)
  if ! ls .whl/optuna-*.whl .whl/hydra_core-*.whl .whl/antlr4*.whl >/dev/null 2>&1; then  # for the device's Python 3.12
    P=(--no-deps --only-binary=:all: --python-version 3.12 --implementation cp -d .whl)
    for plat in manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_17_x86_64 manylinux2014_x86_64 \
                manylinux1_x86_64; do P+=(--platform "$plat"); done
    $PY -m pip download -q "${P[@]}" hydra-core==1.3.2 omegaconf==2.3.0 "optuna>=5,<6" alembic sqlalchemy greenlet \
      colorlog mako
    $PY -m pip wheel -q --no-deps -w .whl antlr4-python3-runtime==4.9.3
  fi
  mkdir -p .gpudata
  [ -f .gpudata/mnist.npz ] || cp ../shared/data/mnist.npz .gpudata/  # the records' dataset.root
  rm -rf .gpudata/vit_main .gpudata/vit_fixed  # the other arm's too: a call carries at most 64 MiB
  if [ -d "$REC" ]; then cp -a "$REC" ".gpudata/$N"; else mkdir ".gpudata/$N"; fi  # no records yet: a first call
  if [ -f "${REC}_resume/checkpoints.tar.gz" ]; then tar xzf "${REC}_resume/checkpoints.tar.gz" -C .gpudata; fi
  # records older than config.json (before 2026-11-27): a finished run gets it from its own .hydra/config.yaml (the
  # config it ran under; the checkpoints' configs equal it but for the dataset path, which RESUME_AS makes the
  # device's), so its retry returns its summary instead of training again (src.trainer.finished_without_checkpoint)
  $PY - ".gpudata/$N" <<'EOF'
import json
import sys
from pathlib import Path

from omegaconf import OmegaConf

made, odd = 0, []
for summary in sorted(Path(sys.argv[1]).glob("*/summary.json")):
    run, s = summary.parent, json.loads(summary.read_text())
    if s.get("status") != "completed" or (run / "config.json").exists():
        continue
    cfg = OmegaConf.to_container(OmegaConf.load(run / ".hydra" / "config.yaml"), resolve=True)
    # Hydra rewrites .hydra/config.yaml at every start: a later start under another config that failed before training
    # would have left it beside this summary, so the summary's own facts must agree with it
    facts = {"seed": cfg["seed"], "base_lr": cfg["optimizer"]["lr"], "dataset": cfg["dataset"]["name"],
             "n_train": cfg["dataset"]["n_train"]}
    if any(s.get(k) != v for k, v in facts.items()):
        odd.append(run.name)
        continue
    (run / "config.json").write_text(json.dumps(cfg, indent=1) + "\n")
    made += 1
print(f"config.json made for {made} finished runs from their .hydra/config.yaml"
      + (f"; not for {odd}, whose summaries disagree with it (they train again)" if odd else ""))
EOF
  for d in "${BIG[@]}"; do
    git rm -r --cached -q --ignore-unmatch "$d"
    mkdir -p "$(dirname "$EXCLUDE")"
    grep -sqxF "/$d/" "$EXCLUDE" || echo "/$d/" >>"$EXCLUDE"
  done
  echo "tracked files: $(git ls-files -z | xargs -0 cat | wc -c | awk '{printf "%.0f MB", $1 / 1e6}')"
  echo "checkpoints: $(find ".gpudata/$N" -name checkpoint.pt | wc -l); .gpudata $(du -sh .gpudata | cut -f1)," \
    ".whl $(du -sh .whl | cut -f1); ${BIG[*]} are out of the index until \`restore\`"
  echo "run (carry [\".gpudata\", \".whl\"], timeout_s 600; if it does not finish, the same again on the warm machine):"
  RESUMING=""; [ -d "$REC" ] && RESUMING="RESUME=.gpudata/$N RESUME_AS=$REC "
  echo "  MODE=$N ${RESUMING}TESTS_BOX=0 PROCS=16 DEADLINE=450 TAIL=8" \
    "OUT=\$OUT DATA=.gpudata bash benchmarks/gpu_study.sh"
  ;;
restore)
  git reset -q -- "${BIG[@]}"
  for d in "${BIG[@]}"; do if [ -f "$EXCLUDE" ]; then sed -i "\#^/$d/\$#d" "$EXCLUDE"; fi; done
  git status --short | head
  ;;
recopy)
  AT=${2:?recopy FILES_AT HEADER: the files_at folder of the call}
  HEADER=${3:?recopy FILES_AT HEADER: the line that opens this call in sweep.log, starting with "# "}
  if ! git diff --cached --quiet -- "${BIG[@]}"; then echo "the index lacks ${BIG[*]}: run restore first" >&2; exit 1; fi
  T=$(mktemp -d)
  trap 'rm -rf "$T"' EXIT
  # everything is built in $T first; the committed folders change only once it all exists
  if [ -f "${REC}_resume/checkpoints.tar.gz" ]; then tar xzf "${REC}_resume/checkpoints.tar.gz" -C "$T"; fi
  tar xzf "$AT/records_${N}.tar.gz" -C "$T"  # the call's (its checkpoints, where they came back, over the old)
  if ls "$AT"/ckpt_"$N".tar.gz.* >/dev/null 2>&1; then cat "$AT"/ckpt_"$N".tar.gz.* | tar xzf - -C "$T"; fi
  tar xzf "$AT/logs.tar.gz" -C "$T"
  $PY -m analysis.records "$T/$N" "$T/records" --replace "/tmp/vitsweep_gpu/$N=$REC" \
    --replace "/work/main/=" | tail -n 1
  { git show "HEAD:$REC/sweep.log" 2>/dev/null || true; echo "$HEADER"  # a first call: no log yet
    sed -e "s#/tmp/vitsweep_gpu/$N#$REC#g" -e "s#/work/main/##g" "$T/logs/$N.log"; } >"$T/records/sweep.log"
  if grep -rlI -e "/tmp/vitsweep_gpu" -e "/work/main" "$T/records" | head -3 | grep .; then
    echo "machine paths left in the records above" >&2; exit 1
  fi
  # the runs a later call resumes: every run dir of the study but those with a complete trial (a retry keeps its
  # original's job number, so a job can hold a failed trial and a later complete one)
  $PY - "$T/$N" "$STUDY" >"$T/keep.txt" <<'EOF'
import sys
from pathlib import Path

import optuna

from hydra_plugins.vitsweep_sweeper.study import JOB_ATTR

root = Path(sys.argv[1])
optuna.logging.set_verbosity(optuna.logging.WARNING)
study = optuna.load_study(study_name=sys.argv[2], storage=f"sqlite:///{root / 'optuna.db'}")
complete = {t.system_attrs.get(JOB_ATTR, t.number) for t in study.trials if t.state.name == "COMPLETE"}
jobs = sorted(int(d.name) for d in root.iterdir() if d.name.isdigit())
missing = [j for j in jobs if j not in complete and not (root / str(j) / "checkpoint.pt").is_file()]
if missing:
    print(f"{len(missing)} unfinished runs have no checkpoint and start afresh: {missing}", file=sys.stderr)
for j in jobs:
    if j not in complete and (root / str(j) / "checkpoint.pt").is_file():
        print(f"{root.name}/{j}/checkpoint.pt")
EOF
  git rm -r -q -f --ignore-unmatch "$REC" "${REC}_resume"
  rm -rf "$REC" "${REC}_resume"
  mv "$T/records" "$REC"
  git add -f "$REC"
  if [ -s "$T/keep.txt" ]; then
    mkdir -p "${REC}_resume"
    tar -czf "${REC}_resume/checkpoints.tar.gz" -C "$T" -T "$T/keep.txt"
    git add -f "${REC}_resume"
  fi
  echo "records: $(ls "$REC"/*/summary.json | wc -l) runs; checkpoints kept for $(wc -l <"$T/keep.txt") unfinished"
  $PY -m analysis.design test "$REC" "${CAPPED[@]}" --pilot "$(dirname "$REC")/pilot_gpu" --effect 0.03 | tail -n 20
  ;;
*)
  sed -n '2,20p' "$0"
  exit 2
  ;;
esac
