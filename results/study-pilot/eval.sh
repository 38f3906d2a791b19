#!/usr/bin/env bash
# #47 pilot evaluation: RULER at 1K (10 built-in tasks x 50 samples, last 2 checkpoints) of every finished pilot run.
set -eu
cd /work/pilot
runs=$(for d in runs/*/; do [ -f $d/done ] && echo ${d%/}; done)
[ -n "$runs" ] || exit 0
OMP_NUM_THREADS=1 /work/venv/bin/evalkit ruler --ckpts $runs --lengths 1k --samples 50 --last 2 \
  --tasks niah_single_1,niah_single_2,niah_single_3,niah_multikey_1,niah_multikey_2,niah_multikey_3,niah_multivalue,niah_multiquery,vt,fwe \
  --out /work/pilot/ruler-1k
