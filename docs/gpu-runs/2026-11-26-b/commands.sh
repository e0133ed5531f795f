# The device calls of the second GPU session (2026-11-26, one H100, 15 min of device time), in order.
# Here, before each: the index as the comment says (bash bench/gpu_run.sh slim/unslim), packs made with
# `python -m model.pack --data runs/data-LANG --tokenizer models/en-LANG-small/tokenizer.model --out runs/pack-LANG.tar`.

# 1. (slim all; carry .ort/part-1; 0.3 s, 42 s held with the start)
mkdir -p /tmp/ort-parts && cp .ort/part-1/* /tmp/ort-parts/

# 2. (slim all; carry .ort/part-2 .whl runs/pack-it.tar runs/pack-pt_BR.tar; 0.2 s): stage on the warm machine
mkdir -p /tmp/ort-parts /tmp/stage && cp .ort/part-2/* /tmp/ort-parts/ &&
  cp .whl/site-cp312.tar.xz runs/pack-it.tar runs/pack-pt_BR.tar /tmp/stage/

# 3. (unslim; slim; carry runs/pack-es.tar; 509 s): the check, then three trainings side by side
GPU_RUN_SITE=/tmp/stage/site-cp312.tar.xz bash bench/gpu_session.sh --seconds 570 --check-args "--budget-s 240" \
  --train "it-small /tmp/stage/pack-it.tar --config small --lr 1.5e-3" \
  --train "pt_BR-small /tmp/stage/pack-pt_BR.tar --config small --lr 1.5e-3" \
  --train "es-12x2 runs/pack-es.tar --config small --encoder-layers 12 --decoder-layers 2 --norm-first --lr 1e-3"

# give_back; then a fresh machine for the 322 s left:
# 4. (unslim; GPU_RUN_KEEP_MODEL=models/none bash bench/gpu_run.sh slim: 5 MB of code travel;
#    carry runs/init-fr runs/init-de (config.json, model.safetensors, tokenizer.model of the shipped models)
#    runs/pack-fr.tar runs/pack-de.tar; 157 s): the shipped French and German models continued
mkdir -p /tmp/r; for l in fr de; do OUT=/tmp/r GPU_RUN_SITE=none GPU_RUN_LOGS=0 bash bench/gpu_run.sh train \
  runs/pack-$l.tar $l-cont --init-from runs/init-$l --lr 8e-4 --minutes 3.3 > /tmp/r/$l.log 2>&1 & done; wait
grep -h "^model\|valid loss\|^done" /tmp/r/*.log | cut -c1-240
tar -C /tmp/r -cf - . | split -b 15m -d - $OUT/train.tar.part-
