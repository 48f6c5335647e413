"""The one training loop of all six strategies: `run` sets up, `train_step` is one optimizer step.

A strategy only wraps (process group, model, optimizer, gradient sync) and precision is a field
(autocast + a scaler that is a no-op when off): nothing here asks which strategy runs.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.metadata
import math
import os
import platform
import socket
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from hpcdp import distenv
from hpcdp import strategies as registry
from hpcdp.config import Experiment, as_dict
from hpcdp.errors import UsageError
from train import checkpoint, faults
from train.stop import StopSignal
from train.data import Batches, open_data
from train.metrics import MetricsWriter, peak_flops, step_line
from train.model import LanguageModel, build_model, count_params, flops_per_token
from train.precision import Precision, make_precision
from train.strategies import Strategy, create


@dataclass
class StepResult:
    loss: torch.Tensor
    """This rank's mean loss over its micro-batches (detached, not yet averaged over ranks)."""
    grad_norm: torch.Tensor
    """Total gradient norm before clipping (after sync and unscaling); inf/nan when skipped."""
    skipped: bool
    """The scaler skipped the optimizer step (fp16 gradients not finite)."""


def train_step(model: torch.nn.Module, optimizer: torch.optim.Optimizer, batches: Batches,
               strategy: Strategy, precision: Precision, *, accum_steps: int,
               grad_clip: float, lr: float) -> StepResult:
    """One optimizer step over `accum_steps` micro-batches."""
    for group in optimizer.param_groups:
        group["lr"] = lr
    device = strategy.device
    total = torch.zeros((), device=device)
    for micro in range(accum_steps):
        last = micro == accum_steps - 1
        x, y = batches.next_batch()
        x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
        # Only the last micro-step's backward communicates; the others accumulate locally.
        with contextlib.nullcontext() if last else strategy.no_sync(model):
            with precision.autocast():
                # .mean(): DataParallel returns one loss per device.
                loss = model(x, y).mean() / accum_steps
            precision.backward(loss, optimizer, last=last,
                               before_unscale=lambda: strategy.prepare_unscale(optimizer))
        total += loss.detach().float()
    # Gradients are now synchronized across ranks and unscaled: the norm is the global one.
    grad_norm = torch.nn.utils.clip_grad_norm_(
        list(precision.master_params(optimizer)), grad_clip if grad_clip > 0 else math.inf
    )
    with strategy.optimizer_step_context(optimizer):
        skipped = precision.step(optimizer)
    optimizer.zero_grad()  # set_to_none is the default; Horovod's takes no argument
    return StepResult(loss=total, grad_norm=grad_norm, skipped=skipped)


def lr_at(step: int, *, lr: float, min_lr: float, warmup_steps: int, total_steps: int) -> float:
    """Learning rate of 0-based step `step`: linear warm-up, then linear decay to min_lr (the
    paper's schedule)."""
    if step < warmup_steps:
        return lr * (step + 1) / warmup_steps
    progress = (step - warmup_steps) / max(1, total_steps - warmup_steps)
    return lr - (lr - min_lr) * min(1.0, progress)


@torch.no_grad()
def evaluate(model: torch.nn.Module, data: Any, exp: Experiment, strategy: Strategy,
             precision: Precision, batch_size: int) -> float:
    """Mean validation loss over eval_batches, averaged over ranks; same samples every time."""
    val = Batches(data, "val", exp.train.seq_len, batch_size, strategy.rank, strategy.world_size,
                  exp.train.seed)
    model.eval()
    total = torch.zeros((), device=strategy.device)
    for _ in range(exp.train.eval_batches):
        x, y = val.next_batch()
        with precision.autocast():
            total += model(x.to(strategy.device), y.to(strategy.device)).mean().float()
    model.train()
    return strategy.mean(total / exp.train.eval_batches).item()


def make_optimizer(model: torch.nn.Module, exp: Experiment, device: torch.device,
                   fused: bool) -> torch.optim.AdamW:
    """AdamW; weight decay on matrices only (not on biases, LayerNorms)."""
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": exp.train.weight_decay},
              {"params": no_decay, "weight_decay": 0.0}]
    # The fused kernel (CPU and CUDA) is several times faster than the per-tensor loop.
    kwargs: dict[str, Any] = {"fused": True} if fused else {}
    try:
        return torch.optim.AdamW(groups, lr=exp.train.lr, **kwargs)
    except (RuntimeError, TypeError, ValueError):
        return torch.optim.AdamW(groups, lr=exp.train.lr)


def _threads(env: distenv.DistEnv) -> int:
    # An explicit OMP_NUM_THREADS (torchrun sets 1, a user may set more) wins.
    raw = os.environ.get("OMP_NUM_THREADS", "").strip()
    if raw.isdigit() and int(raw) > 0:
        return int(raw)
    return distenv.threads_per_process(env)


def _device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "cpu"


def _versions() -> dict[str, str | None]:
    def version(dist: str) -> str | None:
        try:
            return importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            return None

    return {"python": platform.python_version(), "torch": torch.__version__,
            "transformers": version("transformers"), "horovod": version("horovod")}


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _say(line: str) -> None:
    print(line, flush=True)


def _quiet(line: str) -> None:
    pass


def run(exp: Experiment, strategy_name: str, out_dir: str | Path, resume: bool = False, *,
        expect_world: int | None = None, expect_tasks_per_node: int | None = None,
        log: Callable[[str], None] = _say) -> dict[str, Any]:
    """Train `exp` with one strategy, writing OUT_DIR/metrics.jsonl and OUT_DIR/checkpoints/.

    Every process of the job calls this. Returns the summary record (on every rank).
    """
    spec = registry.get(strategy_name)
    env = distenv.detect()
    distenv.check_world(env, expect_world, expect_tasks_per_node)
    torch.set_num_threads(_threads(env))
    strategy = create(spec.name, log=log if env.rank == 0 else _quiet)
    strategy.setup(env, exp.train.dist_timeout_s)
    try:
        return _train(exp, spec, env, strategy, Path(out_dir), resume,
                      log if strategy.is_main else _quiet)
    finally:
        strategy.teardown()


def _train(exp: Experiment, spec: registry.Strategy, env: distenv.DistEnv, strategy: Strategy,
           out_dir: Path, resume: bool, log: Callable[[str], None]) -> dict[str, Any]:
    cfg = exp.train
    device = strategy.device
    data = open_data(exp)
    precision = make_precision(spec.mixed_precision, cfg.amp_dtype, cfg.amp_backend, device.type,
                               cfg.apex_opt_level)

    # Same seed on every rank: identical initial weights (DDP and Horovod broadcast anyway).
    torch.manual_seed(cfg.seed)
    raw_model = build_model(exp.model.preset, data.vocab_size, cfg.seq_len, exp.model.dropout,
                            exp.model.attention).to(device)
    model: torch.nn.Module = LanguageModel(raw_model)
    optimizer = make_optimizer(model, exp, device, fused=precision.backend == "native")
    model, optimizer = precision.initialize(model, optimizer)
    # After initialisation each rank draws its own dropout masks.
    torch.manual_seed(cfg.seed + 1 + strategy.rank)

    batch_size = cfg.micro_batch_size * strategy.devices_per_process  # per process, per micro
    batches = Batches(data, "train", cfg.seq_len, batch_size, strategy.rank,
                      strategy.world_size, cfg.seed)

    start_step, resumed_from = 0, None
    if resume:
        # Rank 0 picks the checkpoint, so every rank loads the same one (shared file system).
        newest = checkpoint.latest(out_dir) if strategy.is_main else None
        found = strategy.broadcast_object(str(newest) if newest else None,
                                         name="resume_checkpoint")
        if found is None:
            log(f"train: --resume: no checkpoint in {checkpoint.checkpoint_dir(out_dir)}, "
                "starting fresh")
        else:
            state = checkpoint.load(Path(found))
            _check_compatible(state["config"], exp, found)
            raw_model.load_state_dict(state["model"])
            optimizer.load_state_dict(state["optimizer"])
            precision.load_state_dict(state["precision"])
            batches.load_state_dict(state["data"])
            start_step, resumed_from = state["step"], found
            if strategy.is_main:
                checkpoint.set_rng_state(state["rng"])  # rank 0's; other ranks re-seed
            else:
                torch.manual_seed(cfg.seed + 1 + strategy.rank + 7919 * start_step)
            log(f"train: resumed from {found} at step {start_step}")

    if cfg.compile:
        model = torch.compile(model)
    model, optimizer = strategy.wrap(model, optimizer, cfg.grad_accum_steps)
    model.train()

    global_batch = batch_size * cfg.grad_accum_steps * strategy.world_size
    tokens_per_step = global_batch * cfg.seq_len
    fpt = flops_per_token(raw_model, cfg.seq_len)
    device_name = _device_name(device)
    peak = peak_flops(device_name, precision.name) if device.type == "cuda" or os.environ.get(
        "HPCDP_PEAK_FLOPS") else None
    n_devices = strategy.world_size * strategy.devices_per_process

    metrics = MetricsWriter(out_dir / "metrics.jsonl" if strategy.is_main else None)
    metrics.write(
        "header", strategy=spec.name, mechanism=spec.mechanism, paper_name=spec.paper_name,
        precision=precision.name, amp_backend=precision.backend if precision.name != "fp32"
        else None, world_size=strategy.world_size, nodes=env.num_nodes,
        tasks_per_node=env.local_world_size, device=device.type, device_name=device_name,
        devices_per_process=strategy.devices_per_process, model_preset=exp.model.preset,
        n_params=count_params(raw_model), seq_len=cfg.seq_len,
        micro_batch_size=cfg.micro_batch_size, grad_accum_steps=cfg.grad_accum_steps,
        global_batch_size=global_batch, tokens_per_step=tokens_per_step, flops_per_token=fpt,
        peak_flops_per_device=peak, start_step=start_step, resumed_from=resumed_from,
        slurm_job_id=env.job_id, restart_count=env.restart_count, hostname=socket.gethostname(),
        experiment=exp.name, config=as_dict(exp), versions=_versions(),
        threads_per_process=torch.get_num_threads(), launcher=env.launcher,
        communication=strategy.communication,
    )
    log(f"train: {spec.name} ({strategy.describe()}), precision {precision.name}, "
        f"world {strategy.world_size}, global batch {global_batch} x {cfg.seq_len} tokens, "
        f"{count_params(raw_model) / 1e6:.2f}M parameters, steps {start_step + 1}..{cfg.steps}")

    def save(step: int) -> None:
        if strategy.is_main:
            path = checkpoint.save(out_dir, step, {
                "model": raw_model.state_dict(), "optimizer": optimizer.state_dict(),
                "precision": precision.state_dict(), "step": step,
                "data": batches.state_dict(), "rng": checkpoint.rng_state(),
                "config": as_dict(exp), "strategy": spec.name,
                "world_size": strategy.world_size,
            })
            metrics.write("checkpoint", step=step, path=str(path))

    stop = StopSignal()
    fault = faults.from_environment()
    segment_start = time.perf_counter()
    step_times: list[float] = []
    last_loss: float | None = None
    last_val: float | None = None
    step = start_step
    interrupted = False
    while step < cfg.steps:
        t0 = time.perf_counter()
        lr = lr_at(step, lr=cfg.lr, min_lr=cfg.min_lr, warmup_steps=cfg.warmup_steps,
                   total_steps=cfg.steps)
        result = train_step(model, optimizer, batches, strategy, precision,
                            accum_steps=cfg.grad_accum_steps, grad_clip=cfg.grad_clip, lr=lr)
        _sync(device)
        dt = time.perf_counter() - t0
        step += 1
        step_times.append(dt)

        if step % cfg.log_interval == 0 or step == cfg.steps:
            last_loss = strategy.mean(result.loss).item()
            tokens_per_s = tokens_per_step / dt
            mfu = fpt * tokens_per_s / (peak * n_devices) if peak else None
            metrics.write(
                "step", step=step, loss=last_loss, lr=lr, grad_norm=result.grad_norm.item(),
                loss_scale=precision.loss_scale(), skipped=result.skipped, step_time_s=dt,
                tokens_per_s=tokens_per_s, tokens_seen=step * tokens_per_step,
                elapsed_s=time.perf_counter() - segment_start,
                max_mem_gb=(torch.cuda.max_memory_allocated(device) / 1e9
                            if device.type == "cuda" else None),
                mfu=mfu,
            )
            log(step_line(step, cfg.steps, last_loss, lr, tokens_per_s, dt, spec.name,
                          strategy.world_size))
        if step == cfg.steps or (cfg.eval_interval and step % cfg.eval_interval == 0):
            last_val = evaluate(model, data, exp, strategy, precision, batch_size)
            metrics.write("eval", step=step, val_loss=last_val)
            log(f"train: step {step} val_loss {last_val:.4f}")
        if fault:
            fault.after_step(step, lambda: stop.name is not None)
        stopping = step < cfg.steps and stop.agreed(strategy, device)
        if (step == cfg.steps or stopping
                or (cfg.checkpoint_interval and step % cfg.checkpoint_interval == 0)):
            save(step)
        if stopping:
            log(f"train: {stop.name} received: stopped after step {step} with a checkpoint; "
                "run again with --resume to continue")
            interrupted = True
            break
    stop.restore()

    if step == start_step:
        log(f"train: nothing to do, the run already reached step {cfg.steps}")
    digest, identical = replica_check(raw_model, strategy, device)
    if not identical:
        log("train: WARNING: model replicas differ across ranks at the end")
    timed = step_times[cfg.warmup_log_steps:] or step_times
    summary = {
        "status": "interrupted" if interrupted else "completed", "steps": step,
        "final_loss": last_loss, "final_val_loss": last_val,
        "elapsed_s": time.perf_counter() - segment_start,
        "tokens_per_s_median": tokens_per_step / statistics.median(timed) if timed else None,
        "step_time_s_median": statistics.median(timed) if timed else None,
        "params_sha256": digest, "replicas_identical": identical,
    }
    metrics.write("summary", **summary)
    metrics.close()
    strategy.barrier()
    return summary


def replica_check(model: torch.nn.Module, strategy: Strategy,
                  device: torch.device) -> tuple[str, bool]:
    """sha256 of the parameters, and whether every rank holds bit-identical ones."""
    digest = hashlib.sha256()
    for name, tensor in model.state_dict().items():
        digest.update(name.encode())
        digest.update(tensor.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy())
    mine = digest.hexdigest()
    if strategy.world_size == 1:
        return mine, True
    differs = torch.tensor(0.0 if strategy.broadcast_object(mine, name="params_sha256") == mine
                           else 1.0, device=device)
    return mine, strategy.mean(differs).item() == 0.0


def _check_compatible(saved: dict, exp: Experiment, path: str) -> None:
    """A checkpoint continues only the run it came from: same model and sequence length."""
    now = as_dict(exp)
    for section, key in (("model", "preset"), ("train", "seq_len"), ("data", "tokenizer"),
                         ("data", "vocab_size"), ("data", "corpus")):
        if saved[section][key] != now[section][key]:
            raise UsageError(
                f"checkpoint {path} was trained with {section}.{key}={saved[section][key]!r}, "
                f"not {now[section][key]!r}; use another --out or drop --resume"
            )


__all__ = ["run", "train_step", "lr_at", "evaluate", "StepResult"]
