#!/usr/bin/env bash
# #47 pilot: 3 seeds x {full, anchor} of configs/tiny-long in the released regime; resumable.
set -u
cd /work/pilot
export OMP_NUM_THREADS=1
for s in 1 2 3; do for p in full anchor; do
  out=runs/tiny-long-$p-seed$s
  [ -f $out/done ] && continue
  resume=""; ls -d $out/step-* >/dev/null 2>&1 && resume="--resume"
  [ -z "$resume" ] && rm -rf $out  # killed before its first checkpoint: start it again
  start=$(date +%s)
  /work/venv/bin/evalkit train --config tiny-long --paradigm $p --set seed=$s \
    --set dtype=bf16_full --set rope_precision=bf16 --set grad_accum_dtype=bf16 --set micro_batch=1 \
    --out $out $resume > $out.log 2>&1 && echo "$(( $(date +%s) - start ))" > $out/done
done; done
