#!/usr/bin/env bash
# Issue 42's GPU measurements in one run (device tool: GPU_DATA=squad gpu-prep.sh from the shared tools,
# carry .gpu, run `bash tools/gpu-issue42.sh`).
# Each step has its own time limit and appends to a file under $OUT as it goes (at most 8 files
# come back), so a step that runs out of time still leaves the others' results. On a CPU
# (SKIP_ENV=1, to try the script) it runs the same steps at CPU sizes.
set -u
OUT=${OUT:-/tmp/gpu-out}; mkdir -p "$OUT"
[ -n "${SKIP_ENV:-}" ] || . .gpu/env.sh
grep -q rajpurkar "$ABLATE_DATA_CATALOG" 2>/dev/null || [ ! -f .gpu/data/squad/dev-v1.1.json ] \
  || echo "  rajpurkar/squad: {validation: data/squad/dev-v1.1.json}" >> "$ABLATE_DATA_CATALOG"
py=${PY:-python3}
dev=cuda; "$py" -c "import torch; assert torch.cuda.is_available()" 2>/dev/null || dev=cpu
step() {  # step FILE NAME SECONDS COMMAND...: its output appended to $OUT/FILE, time and status to steps.txt
  local file=$1 name=$2 limit=$3; shift 3
  local start=$(date +%s)
  echo "### $name: $*" >> "$OUT/$file"
  timeout "$limit" "$@" >> "$OUT/$file" 2>&1
  echo "$name rc=$? $(( $(date +%s) - start ))s" >> "$OUT/steps.txt"
}
{ "$py" -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda); print(torch.cuda.get_device_name() if torch.cuda.is_available() else 'no GPU')"; nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv 2>/dev/null; nproc; } >> "$OUT/steps.txt" 2>&1
study=${STUDY:-sweeps/studies/albert_table5_gpu.yaml}  # STUDY=...: another (2026-11-27 ran the one-seed form)
if [ "$dev" = cuda ]; then
  step study.txt study 200 ablate bench study "$study" --device cuda --out "$OUT/study.md"
  # each loop bench ends with its device reads per step, log step and validation batch (torch's sync warnings)
  step loops.txt pretrain-bert-small 75 ablate bench loop --device cuda --steps 300
  step loops.txt finetune-sst2-b32 100 ablate bench loop --regime finetune --device cuda --task sst2 --batch 32 --steps 200
  step loops.txt finetune-mrpc-b128 80 ablate bench loop --regime finetune --device cuda --task mrpc --batch 128 --steps 150
  step train.txt train-bert-base 90 ablate bench train --case bert-base --device cuda --compile
  step loops.txt finetune-squad-b32 80 ablate bench loop --regime finetune --device cuda --task squad --batch 32 --steps 150
else
  step study.txt study 300 ablate bench study sweeps/studies/quickstart.yaml --smoke --out "$OUT/study.md"
  step loops.txt finetune-sst2-b8 200 ablate bench loop --regime finetune --device cpu --task sst2 --batch 8 --steps 10 --compile
  step estimates.txt estimate-overview 30 ablate sweep sweeps/studies/overview_gpu.yaml --check
fi
