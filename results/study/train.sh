#!/usr/bin/env bash
# #47 study runs, exactly as results/study/PREREGISTRATION.md (91d110c) lists them: tiny-long at
# RoPE base 1e5, released regime (bf16) and FP32 twins, two runs side by side on one thread each,
# resumable (rerun to continue). evalkit from a clean clone at /work/study/evalkit (PYTHONPATH).
set -u
cd /work/study
export OMP_NUM_THREADS=1 PYTHONPATH=/work/study/evalkit
BF16="--set dtype=bf16_full --set rope_precision=bf16 --set grad_accum_dtype=bf16 --set micro_batch=1"
FP32="--set dtype=fp32 --set micro_batch=1"
train() {  # paradigm precision seed
  local out=runs/$1-$2-seed$3 settings; [ $2 = bf16 ] && settings=$BF16 || settings=$FP32
  [ -f $out/done ] && return
  local resume=""; ls -d $out/step-* >/dev/null 2>&1 && resume="--resume"
  [ -z "$resume" ] && rm -rf $out
  local start=$(date +%s)
  /work/venv/bin/python -m evalkit.cli train --config tiny-long --paradigm $1 --set seed=$3 \
    --set model.rope_theta=100000 $settings --out $out $resume > $out.log 2>&1 \
    && echo "$(( $(date +%s) - start ))" > $out/done
}
mkdir -p runs
# in order: the H1 pairs first, then the FP32 twins, then intra_doc
for s in 1 2 3 4 5; do train full bf16 $s & train anchor bf16 $s & wait; done
for s in 1 2 3 4 5; do train full fp32 $s & train anchor fp32 $s & wait; done
train intra_doc bf16 1 & train intra_doc bf16 2 & wait
train intra_doc bf16 3
