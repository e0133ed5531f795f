#!/usr/bin/env bash
# Equal-time A/B from scratch on the one GPU: small 3+3 against deep-encoder 12+2, both at lr 7e-4.
set -u
export PYTHONUNBUFFERED=1
G=/tmp/gout2; mkdir -p $G
for spec in "s3x3 --encoder-layers 3 --decoder-layers 3" "ds12x2 --encoder-layers 12 --decoder-layers 2"; do
  set -- $spec; name=$1; shift
  (OUT=$G GPU_RUN_SITE=none GPU_RUN_LOGS=0 bash bench/gpu_run.sh train runs/pack-es.tar $name --config small "$@" --lr 7e-4 --warmup 800 --minutes 2.9 --valid-every 1000 > $G/$name.log 2>&1) &
done
wait
for f in $G/*.log; do cp $f "$OUT/"; grep -h "^model\|valid loss\|^done" $f | cut -c1-200; done
for d in $G/*/; do cp $d/training.json "$OUT/$(basename $d)-training.json"; done
