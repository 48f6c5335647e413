#!/usr/bin/env bash
# The GPU paths that fit one GPU, on gpt2-124m with synthetic tokens, about a minute each:
# single-gpu, single-ps (DataParallel over one GPU), distributed-ps as one NCCL rank, and the
# mixed-precision variant with fp16 + GradScaler and with bf16. Prints the harvest table
# (tokens/s, step time, MFU) and writes it to OUT (default ./gpu-check).
#
# Usage: bench/gpu_check.sh [OUT]   (on a machine with a CUDA build of torch and one GPU)
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
OUT="${1:-gpu-check}"
PY="${PYTHON:-python}"
mkdir -p "$OUT"
"$PY" -c "import torch; assert torch.cuda.is_available(), 'no CUDA GPU visible'; print(torch.cuda.get_device_name(0))"
STEPS="${STEPS:-300}"
common=(--experiment "$ROOT/experiments/smoke.yaml"
        --set model.preset=gpt2-124m --set data.corpus=synthetic --set data.tokenizer=gpt2
        --set train.seq_len=1024 --set train.micro_batch_size="${MICRO_BATCH:-8}"
        --set train.steps="$STEPS" --set train.log_interval=10 --set train.warmup_log_steps=20
        --set train.eval_interval=0 --set train.checkpoint_interval=0 --set train.lr=6.0e-4
        --set train.warmup_steps=10)
run() {  # run NAME STRATEGY [more args]
    local name=$1 strategy=$2; shift 2
    echo "== $name"
    "$PY" -m torch.distributed.run --standalone --nproc_per_node=1 -m train \
        "${common[@]}" --strategy "$strategy" --out "$OUT/$name" "$@" \
        --expect-world 1 2>&1 | tail -4
}
run single-gpu single-gpu
run single-ps single-ps
run ddp-nccl distributed-ps
run ddp-fp16 distributed-ps-apex --set train.amp_dtype=fp16
run ddp-bf16 distributed-ps-apex --set train.amp_dtype=bf16
"$PY" -m hpcdp harvest "$OUT" --no-slurm --format markdown | tee "$OUT/table.md"
