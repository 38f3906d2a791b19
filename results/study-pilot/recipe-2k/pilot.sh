#!/usr/bin/env bash
# #47 recipe pilot: configs/tiny-long continued at 2K tokens (400 steps) in the released regime,
# seed 1 x {full, anchor}, the two runs side by side on one thread each; resumable.
set -u
cd /work/pilot2k
export OMP_NUM_THREADS=1
train() {
  local p=$1 s=$2 out=runs/tiny-long2k-$1-seed$2
  [ -f $out/done ] && return
  local resume=""; ls -d $out/step-* >/dev/null 2>&1 && resume="--resume"
  [ -z "$resume" ] && rm -rf $out
  local start=$(date +%s)
  /work/venv/bin/evalkit train --config tiny-long --paradigm $p --set seed=$s --set seq_len=2048 --set max_steps=400 \
    --set dtype=bf16_full --set rope_precision=bf16 --set grad_accum_dtype=bf16 --set micro_batch=1 \
    --out $out $resume > $out.log 2>&1 && echo "$(( $(date +%s) - start ))" > $out/done
}
mkdir -p runs
train full 1 & train anchor 1 & wait
