#!/usr/bin/env bash
# When the fp32 part ends, seeds 4-5 of the bf16 part go to a second process (folder bf16b); the
# first stops before it would start them.
cd /work/study
while pgrep -f "eval2k.sh fp32" > /dev/null; do sleep 10; done
./eval2k.sh bf16b full-bf16-seed4 anchor-bf16-seed4 full-bf16-seed5 anchor-bf16-seed5 > e2k-bf16b.out 2>&1 &
while ! grep -q "full-bf16-seed4 step 550" e2k-bf16.out; do sleep 5; done
pkill -f "eval2k.sh bf16 " ; sleep 1; pkill -f "ruler-trained-2k/bf16$"
echo "stopped the first bf16 process at seed 4" >> e2k-bf16.out
