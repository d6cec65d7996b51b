#!/usr/bin/env bash
# Issue 36's GPU measurements in one run (device tool: carry .gpu, run `bash tools/gpu-issue36.sh`).
# Each step has its own time limit and writes its output under $OUT as it goes, so a step that
# runs out of time still leaves the others' results. On a CPU (to try the script) it runs the
# same commands at CPU sizes.
set -u
OUT=${OUT:-/tmp/gpu-out}; mkdir -p "$OUT"
[ -n "${SKIP_ENV:-}" ] || . .gpu/env.sh   # SKIP_ENV=1: try it here with the venv's ablate on PATH
dev=cuda; "${PY:-python3}" -c "import torch; assert torch.cuda.is_available()" 2>/dev/null || dev=cpu
step() {  # step NAME SECONDS COMMAND...: run it, its output in $OUT/NAME.txt, its time and status in $OUT/steps.txt
  local name=$1 limit=$2; shift 2
  local start=$(date +%s)
  timeout "$limit" "$@" > "$OUT/$name.txt" 2>&1
  echo "$name rc=$? $(( $(date +%s) - start ))s" >> "$OUT/steps.txt"
}
{ "${PY:-python3}" -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda); print(torch.cuda.get_device_name() if torch.cuda.is_available() else 'no GPU')"; nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv 2>/dev/null; } > "$OUT/env.txt" 2>&1
if [ "$dev" = cuda ]; then
  step loop_pretrain 90 ablate bench loop --regime pretrain --device cuda
  step loop_finetune 90 ablate bench loop --regime finetune --device cuda
  step train_bertbase 120 ablate bench train --case bert-base --device cuda
  step study_fastbert_gpu 100 ablate bench study sweeps/studies/fastbert_gpu.yaml --smoke --device cuda
  step estimate_overview_gpu 60 ablate sweep sweeps/studies/overview_gpu.yaml --check
  step loop_distill 75 ablate bench loop --regime distill --device cuda --case distill-mini
else
  step loop_pretrain 120 ablate bench loop --regime pretrain --device cpu --steps 20
  step study_quickstart 200 ablate bench study sweeps/studies/quickstart.yaml --smoke
fi
tail -n 3 "$OUT"/*.txt > "$OUT/summary.txt" 2>&1
