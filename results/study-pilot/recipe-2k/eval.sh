#!/usr/bin/env bash
# #47 recipe pilot evaluation: RULER of each 2K-trained run at 1K and 2K (10 built-in tasks x 50
# samples) and at 4K (x 25: is it off the floor?), the last 2 checkpoints; one process per run, one thread each.
set -eu
cd /work/pilot2k
export OMP_NUM_THREADS=1
TASKS=niah_single_1,niah_single_2,niah_single_3,niah_multikey_1,niah_multikey_2,niah_multikey_3,niah_multivalue,niah_multiquery,vt,fwe
one() {
  /work/venv/bin/evalkit ruler --ckpts runs/tiny-long2k-$1-seed1 --lengths 1k,2k --samples 50 --last 2 --tasks $TASKS --out ruler-$1 > eval-$1.log 2>&1
  /work/venv/bin/evalkit ruler --ckpts runs/tiny-long2k-$1-seed1 --lengths 4k --samples 25 --last 2 --tasks $TASKS --out ruler4k-$1 >> eval-$1.log 2>&1
}
one full & one anchor & wait
