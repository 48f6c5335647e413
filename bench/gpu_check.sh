#!/usr/bin/env bash
# Issue 11 (item 5): what hpcdp does on one GPU, sized for under 5 minutes on an H200.
# GPT-2 124M (seq 1024, synthetic tokens) for STEPS steps per run, one process each:
#   single-gpu fp32, and with torch.compile
#   distributed-ps-apex with fp16 + GradScaler, with bf16, and bf16 with torch.compile
#   distributed-ps and horovod at one rank (their wrappers step aside at world size 1), and
#   single-ps (DataParallel over the one GPU)
# Then the harvest table: tokens/s, step time, MFU (against the GPU's dense peak for the
# precision), peak memory. Record the figures, with the date, in docs/performance.md.
#
# Usage: bench/gpu_check.sh [OUT]   (CUDA build of torch, one GPU; STEPS=200 MICRO_BATCH=16)
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
OUT="${1:-gpu-check}"
PY="${PYTHON:-python}"
mkdir -p "$OUT"
"$PY" -c "import torch; assert torch.cuda.is_available(), 'no CUDA GPU visible'; print(torch.cuda.get_device_name(0), torch.__version__)"
STEPS="${STEPS:-200}"
common=(--experiment "$ROOT/experiments/smoke.yaml"
        --set model.preset=gpt2-124m --set data.corpus=synthetic --set data.tokenizer=gpt2
        --set train.seq_len=1024 --set train.micro_batch_size="${MICRO_BATCH:-16}"
        --set train.steps="$STEPS" --set train.log_interval=10 --set train.warmup_log_steps=30
        --set train.eval_interval=0 --set train.checkpoint_interval=0 --set train.lr=6.0e-4
        --set train.warmup_steps=10)
run() {  # run NAME STRATEGY [more args]; RANKS=N (default 1) processes, one GPU each
    local name=$1 strategy=$2 ranks=${RANKS:-1}; shift 2
    echo "== $name ($(date +%T))"
    timeout 240 "$PY" -m torch.distributed.run --standalone --nproc_per_node="$ranks" -m train \
        "${common[@]}" --strategy "$strategy" --out "$OUT/$name" "$@" \
        --expect-world "$ranks" 2>&1 | tail -3 || echo "!! $name failed"
}
run fp32 single-gpu
run fp32-compile single-gpu --set train.compile=true
run fp16-scaler distributed-ps-apex --set train.amp_dtype=fp16
run bf16 distributed-ps-apex --set train.amp_dtype=bf16
run bf16-compile distributed-ps-apex --set train.amp_dtype=bf16 --set train.compile=true
run ddp-1rank distributed-ps
run dataparallel-1gpu single-ps
# The sharded strategies as one rank: at world size 1 they leave the model whole and train as
# single-gpu does (fsdp-apex: its precision and GradScaler paths), so these measure their
# one-rank cost, not sharding. NCCL takes one rank per GPU: sharding itself (FSDP2's hooks
# and casts, ZeRO-1's partitioned optimizer, DDP beside them) runs where 2 GPUs are visible.
run fsdp-1rank fsdp
run fsdp-fp16-scaler fsdp-apex --set train.amp_dtype=fp16
run fsdp-bf16 fsdp-apex --set train.amp_dtype=bf16
run zero1-1rank zero1
gpus=$("$PY" -c "import torch; print(torch.cuda.device_count())")
if [ "$gpus" -ge 2 ]; then
    RANKS=2 run ddp-2gpu distributed-ps
    RANKS=2 run fsdp-2gpu fsdp
    RANKS=2 run fsdp-bf16-2gpu fsdp-apex --set train.amp_dtype=bf16
    RANKS=2 run zero1-2gpu zero1
else
    echo "== ddp/fsdp/zero1 on 2 GPUs: skipped (1 GPU visible: nothing to shard over)"
fi
if "$PY" -c "import horovod.torch" 2>/dev/null; then
    run horovod-1rank horovod
else
    echo "== horovod-1rank: skipped (horovod not importable)"
fi
"$PY" -m hpcdp harvest "$OUT" --no-slurm --format markdown | tee "$OUT/table.md"
