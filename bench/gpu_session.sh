#!/usr/bin/env bash
# The main device call of a GPU session (docs/gpu.md, "During the session"): the last onnxruntime-gpu
# part, the serving check, then trainings side by side on the one GPU in the time left, and everything
# that comes back packed into at most 8 files under $OUT (gpu-check.json, gpu-check.log, session.log,
# train.tar.part-NN: the run folders and logs, cut at 15 MiB; here `cat train.tar.part-* | tar -x`).
#
#   bash bench/gpu_session.sh [--seconds 570] [--ort .ort/part-2] [--check-args "--budget-s 300"] \
#     [--train "NAME PACK [model.gpu_train args]"]...
#
# --seconds is the whole call (keep it under the device call's timeout_s): each training gets
# --minutes for what is left after the check, less 25 s for packing. Without --train it only checks.
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-runs/gpu-out}
mkdir -p "$OUT"
T0=$(date +%s)
SECONDS_TOTAL=570
ORT_PART=""
CHECK_ARGS=""
TRAINS=()
while [ $# -gt 0 ]; do
  case "$1" in
    --seconds) SECONDS_TOTAL=$2; shift 2 ;;
    --ort) ORT_PART=$2; shift 2 ;;
    --check-args) CHECK_ARGS=$2; shift 2 ;;
    --train) TRAINS+=("$2"); shift 2 ;;
    *) echo "usage: bash bench/gpu_session.sh [--seconds S] [--ort DIR] [--check-args ARGS] [--train 'NAME PACK ARGS']..."; exit 2 ;;
  esac
done
elapsed() { echo $(($(date +%s) - T0)); }
{
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null
  [ -n "$ORT_PART" ] && bash bench/gpu_run.sh ort-part "$ORT_PART"
  # shellcheck disable=SC2086 # the check's arguments are meant to split
  OUT=$OUT bash bench/gpu_run.sh check $CHECK_ARGS
  echo "check: exit $? after $(elapsed) s"
} 2>&1 | tee "$OUT/session.log"
[ ${#TRAINS[@]} -gt 0 ] || exit 0

RUNS=$(mktemp -d)
MINUTES=$(awk -v left="$((SECONDS_TOTAL - $(elapsed) - 25))" 'BEGIN { printf "%.2f", left / 60 }')
echo "training ${#TRAINS[@]} run(s) side by side, $MINUTES min each" | tee -a "$OUT/session.log"
(nvidia-smi --query-gpu=timestamp,utilization.gpu,memory.used --format=csv -l 20 >"$RUNS/smi.log" 2>&1 &
  echo $! >"$RUNS/smi.pid")
PIDS=()
for spec in "${TRAINS[@]}"; do
  # shellcheck disable=SC2086 # NAME PACK ARGS...
  set -- $spec
  name=$1 pack=$2
  shift 2
  (OUT=$RUNS GPU_RUN_SITE=none GPU_RUN_LOGS=0 bash bench/gpu_run.sh train "$pack" "$name" "$@" \
    --minutes "$MINUTES" >"$RUNS/$name.log" 2>&1) &
  PIDS+=($!)
done
wait "${PIDS[@]}"
kill "$(cat "$RUNS/smi.pid")" 2>/dev/null
rm -f "$RUNS/smi.pid"
grep -h "^model\|valid loss\|^done" "$RUNS"/*.log | cut -c1-240 | tee -a "$OUT/session.log"
tar -C "$RUNS" -cf - . | split -b 15m -d - "$OUT/train.tar.part-"
rm -rf "$RUNS"
echo "session: $(elapsed) s; back: $(ls "$OUT" | tr '\n' ' ')" | tee -a "$OUT/session.log"
