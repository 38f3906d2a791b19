#!/usr/bin/env bash
# #47 recipe pilot evaluation: RULER of each run at 1K and 2K (10 built-in tasks x 50 samples) and
# at 4K (x 10: is it off the floor?), the last 2 checkpoints; one process per run, one thread each;
# evalkit from the clean clone at /work/pilot-clone.
set -eu
cd /work/pilot2k-theta
export OMP_NUM_THREADS=1 PYTHONPATH=/work/pilot-clone
TASKS=niah_single_1,niah_single_2,niah_single_3,niah_multikey_1,niah_multikey_2,niah_multikey_3,niah_multivalue,niah_multiquery,vt,fwe
one() {
  local run=runs/tiny-long2k-theta1e5-$1-seed1
  /work/venv/bin/python -m evalkit.cli ruler --ckpts $run --lengths 1k,2k --samples 50 --last 2 --tasks $TASKS --out ruler-$1 > eval-$1.log 2>&1
  /work/venv/bin/python -m evalkit.cli ruler --ckpts $run --lengths 4k --samples 10 --last 2 --tasks $TASKS --out ruler4k-$1 >> eval-$1.log 2>&1
}
one full & one anchor & wait
