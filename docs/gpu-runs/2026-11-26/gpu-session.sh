#!/usr/bin/env bash
# One device call: the serving check, then two Spanish trainings side by side on the one GPU
# (a deep-encoder/shallow-decoder model from scratch, and the shipped model continued), packed
# into <= 15 MiB parts so that at most 8 files come back.
set -u
export PYTHONUNBUFFERED=1
T0=$(date +%s)
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv
timeout 240 bash bench/gpu_run.sh check --budget-s 150
echo "check rc=$? after $(( $(date +%s) - T0 )) s"
G=/tmp/gout; mkdir -p $G
MIN=$(python3 -c "print(round((565 - ($(date +%s) - $T0)) / 60, 2))")
echo "training minutes each: $MIN"
nvidia-smi --query-gpu=timestamp,utilization.gpu,memory.used --format=csv -l 20 > $G/smi.log 2>&1 &
SMI=$!
(OUT=$G GPU_RUN_SITE=none GPU_RUN_LOGS=0 bash bench/gpu_run.sh train runs/pack-es.tar es-ds12x2 --config small --encoder-layers 12 --decoder-layers 2 --lr 1.5e-3 --warmup 800 --minutes "$MIN" --valid-every 1500 > $G/es-ds12x2.log 2>&1) &
PA=$!
(OUT=$G GPU_RUN_SITE=none GPU_RUN_LOGS=0 bash bench/gpu_run.sh train runs/pack-es.tar es-small-cont --config small --init-from models/en-es-small --lr 6e-4 --minutes "$MIN" --valid-every 1500 > $G/es-small-cont.log 2>&1) &
PB=$!
wait $PA $PB
kill $SMI
grep -h "^step\|^done\|^model" $G/*.log | cut -c1-300
tar -C $G -cf - . | split -b 15m -d - "$OUT/train.tar.part-"
ls -la "$OUT"
echo "all done after $(( $(date +%s) - T0 )) s"
