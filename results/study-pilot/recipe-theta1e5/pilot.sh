#!/usr/bin/env bash
# #47 recipe pilot: configs/tiny-long (1K tokens, 600 steps) in the released regime with the RoPE
# base raised at continuation (model.rope_theta=1e5: the paper changes only the base when it
# lengthens the context), seed 1 x {full, anchor}, side by side on one thread each; resumable.
set -u
cd /work/pilot-theta
export OMP_NUM_THREADS=1
train() {
  local p=$1 s=$2 out=runs/tiny-long-theta1e5-$1-seed$2
  [ -f $out/done ] && return
  local resume=""; ls -d $out/step-* >/dev/null 2>&1 && resume="--resume"
  [ -z "$resume" ] && rm -rf $out
  local start=$(date +%s)
  /work/venv/bin/evalkit train --config tiny-long --paradigm $p --set seed=$s --set model.rope_theta=100000 \
    --set dtype=bf16_full --set rope_precision=bf16 --set grad_accum_dtype=bf16 --set micro_batch=1 \
    --out $out $resume > $out.log 2>&1 && echo "$(( $(date +%s) - start ))" > $out/done
}
mkdir -p runs
train full 1 & train anchor 1 & wait
