#!/usr/bin/env bash
# #47 study, the evaluation the issue asks beyond the pre-registration: RULER at 2L = 2K on the same
# 3 tasks, 100 samples, last 2 checkpoints, served as trained. Arguments: OUT-SUBFOLDER RUN...
# One torch thread a process; evalkit from a clean clone of main (PYTHONPATH); resumable.
set -u
cd /work/study/wd
export OMP_NUM_THREADS=1 PYTHONPATH=/work/study/evalkit-eval2
EVALKIT="/work/venv/bin/python -m evalkit.cli"
part=$1; shift
for run in "$@"; do
  $EVALKIT ruler --ckpts ../runs/$run --last 2 --lengths 2k --tasks niah_multikey_1,niah_multiquery,niah_multivalue \
    --samples 100 --engine-arg serving=trained --out /work/study/results/ruler-trained-2k/$part || exit 1
done
