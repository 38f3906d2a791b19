#!/usr/bin/env bash
# #47 study evaluations as results/study/PREREGISTRATION.md lists them: every run's last 2
# checkpoints (550, 600), RULER at 512 and 1K on niah_multikey_1, niah_multiquery, niah_multivalue,
# 100 samples per task and length; perplexity at 512, 1K and 2K; hf engine. Arguments: SERVING RUN...
# Resumable (rerun to continue: finished answers are read back). One torch thread a process.
# evalkit from a clean clone of main at /work/study/evalkit-eval (PYTHONPATH); run from an empty
# directory so that nothing in the working directory shadows the package.
set -u
cd /work/study/wd
export OMP_NUM_THREADS=1 PYTHONPATH=/work/study/evalkit-eval
EVALKIT="/work/venv/bin/python -m evalkit.cli"
OUT=${OUT:-/work/study/results}
TASKS=niah_multikey_1,niah_multiquery,niah_multivalue
serving=$1; shift
for run in "$@"; do
  $EVALKIT ruler --ckpts ../runs/$run --last 2 --lengths 512,1k --tasks $TASKS --samples 100 \
    --engine-arg serving=$serving --out $OUT/ruler-$serving || exit 1
  $EVALKIT ppl --ckpts ../runs/$run --last 2 --lengths 512,1k,2k \
    --engine-arg serving=$serving --out $OUT/ppl-$serving || exit 1
done
