"""The one training loop of every strategy: `run` -> `setup` -> `fit` -> `train_step`.

A strategy only wraps (process group, model, optimizer, gradient sync) and precision is a field
(autocast + a scaler that is a no-op when off): nothing here asks which strategy runs.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
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

from hpcdp import distenv, run_folder, run_lock
from hpcdp import strategies as registry
from hpcdp.config import Experiment, as_dict
from hpcdp.errors import AlreadySaid, UsageError
from hpcdp.run_folder import METRICS_FILE
from hpcdp.tracking import TrackedRun
from train import checkpoint, faults, malloc, memory
from train.data import Batches, open_data
from train.metrics import MetricsWriter, peak_flops, step_line
from train.model import LanguageModel, build_model, count_params, flops_per_token, load_weights
from train.phases import NO_TIMER, NoTimer, PhaseTimer
from train.precision import Precision, make_precision
from train.stop import StopSignal
from train.strategies import Strategy, create
from train.watchdog import Watchdog


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
               grad_clip: float, lr: float, timer: PhaseTimer | NoTimer = NO_TIMER
               ) -> StepResult:
    """One optimizer step over `accum_steps` micro-batches; `timer` marks its phases."""
    for group in optimizer.param_groups:
        group["lr"] = lr
    device = strategy.device
    total: torch.Tensor | None = None

    def synchronize() -> None:  # after the last backward: what no computation hides
        timer.mark("backward")
        strategy.prepare_unscale(optimizer)
        timer.mark("sync")

    timer.mark(None)
    for micro in range(accum_steps):
        last = micro == accum_steps - 1
        x, y = batches.next_batch()
        x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
        timer.mark("data")
        # Only the last micro-step's backward communicates; the others accumulate locally.
        with contextlib.nullcontext() if last else strategy.no_sync(model):
            with precision.autocast():
                # .mean(): DataParallel returns one loss per device.
                loss = model(x, y).mean()
            if accum_steps > 1:  # no extra op without accumulation (glibc: bench/allocator.py)
                loss = loss / accum_steps
            timer.mark("forward")
            precision.backward(loss, optimizer, last=last, before_unscale=synchronize)
        if not last:
            timer.mark("backward")
        loss = loss.detach().float()  # fp32 even where apex O2 computed it in fp16
        total = loss if total is None else total + loss
    # Gradients are now synchronized across ranks and unscaled: the norm is the global one.
    grad_norm = torch.nn.utils.clip_grad_norm_(
        list(precision.master_params(optimizer)), grad_clip if grad_clip > 0 else math.inf
    )
    if hasattr(grad_norm, "full_tensor"):  # FSDP: a DTensor over the ranks' shards
        grad_norm = grad_norm.full_tensor()
    with strategy.optimizer_step_context(optimizer):
        skipped = precision.step(optimizer)
    optimizer.zero_grad()  # set_to_none is the default; Horovod's takes no argument
    timer.mark("optimizer")
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


def run(exp: Experiment, strategy: str | registry.StrategySpec, out_dir: str | Path,
        resume: bool = False, *, env: distenv.DistEnv | None = None,
        expect_world: int | None = None, expect_tasks_per_node: int | None = None,
        log: Callable[[str], None] = _say) -> dict[str, Any]:
    """Train `exp` with one strategy, writing OUT_DIR/metrics.jsonl and OUT_DIR/checkpoints/.

    Every process of the job calls this. Returns the summary record (on every rank).
    `python -m train` passes the strategy and the distributed environment it resolved and
    checked before torch loaded; other callers (tests, benchmarks) give a strategy name and
    no env, and they are resolved and checked here.
    """
    spec = strategy if isinstance(strategy, registry.StrategySpec) else registry.get(strategy)
    if env is None:
        env = distenv.detect()
        distenv.check_world(env, expect_world, expect_tasks_per_node)
    torch.set_num_threads(distenv.threads_per_process(env))
    strategy = create(spec, log=log if env.rank == 0 else _quiet)
    fault = faults.from_environment()
    if fault:
        fault.at_start(env.rank, fired_marker=Path(out_dir) / ".fault-fired")
    strategy.setup(env, exp.train.dist_timeout_s)
    try:
        claim = claim_run_dir(strategy, Path(out_dir), env,
                              continuing=resume or bool(exp.train.resume_from))
        record_connected(Path(out_dir), env)
        try:
            return _train(exp, spec, env, strategy, Path(out_dir), resume,
                          log if strategy.is_main else _quiet)
        finally:
            if claim is not None:
                claim.close()
    finally:
        strategy.teardown()


def claim_run_dir(strategy: Strategy, out_dir: Path, env: distenv.DistEnv, continuing: bool):
    """Rank 0 claims the run folder for this trainer (hpcdp/run_lock.py) before anything in it
    is read or written, and tells the other ranks: a second trainer in a folder (a job and
    `hpcdp run`, a script sbatch'ed beside a running one) is refused by every rank, in one
    line, instead of interleaving its steps with the first's. Not `continuing` (no --resume,
    no train.resume_from), a folder that holds an earlier run is refused too: starting over
    there would append a second run to its metrics.jsonl, read back as one run resumed, and
    leave its checkpoints for a later --resume to take for this run's (hpcdp's commands always
    pass --resume; this is `python -m train` by hand)."""
    claim, refusal = None, None
    if strategy.is_main:
        try:
            claim = run_lock.claim(out_dir, env.job_id)
        except run_lock.RunFolderBusy as exc:
            refusal = str(exc)
        if refusal is None and not continuing and run_folder.holds_a_run(out_dir):
            if claim is not None:
                claim.close()
            claim, refusal = None, (
                f"{out_dir} holds an earlier run ({run_folder.METRICS_FILE} or checkpoints); "
                "add --resume to continue it, or give another --out (or move it aside: hpcdp "
                "run, submit and compare do that with --fresh)")
    refusal = strategy.broadcast_object(refusal, name="run_folder_claim")
    if refusal is not None:
        raise UsageError(refusal) if strategy.is_main else AlreadySaid(UsageError.exit_code)
    return claim


def record_connected(out_dir: Path, env: distenv.DistEnv) -> None:
    """RUN_DIR/ranks/connected-RANK = "JOB": this rank's strategy set up its communication. The
    job script relaunches a launch that crashed before every rank wrote it (a start-up crash in
    MPI, PMIx or NCCL), never one that crashed while training."""
    folder = out_dir / "ranks"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"connected-{env.rank}").write_text(f"{env.job_id or 'manual'}\n")


def _train(exp: Experiment, spec: registry.StrategySpec, env: distenv.DistEnv,
           strategy: Strategy, out_dir: Path, resume: bool,
           log: Callable[[str], None]) -> dict[str, Any]:
    # Its own frame, so that the wrapped model (DDP's reducer, Horovod's hooks) is freed when
    # it returns, before teardown destroys the process group: freed after it, DDP's
    # destructor can hang the process at exit.
    training = setup(exp, spec, strategy, out_dir, resume, log)
    # Before the header is written: the trackers skip the steps earlier segments sent.
    tracked = TrackedRun(exp.train.trackers, out_dir, log) if strategy.is_main else None
    metrics = MetricsWriter(out_dir / METRICS_FILE if strategy.is_main else None, tracked)
    metrics.write("header", **header(training, env))
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    placement = {"device": str(strategy.device), "devices": strategy.devices_per_process,
                 "cuda_visible_devices": visible, "device_hint": env.device_hint(visible),
                 # Where this rank's Gloo traffic goes: the node interface, not lo, on a cluster.
                 "gloo_interface": os.environ.get("GLOO_SOCKET_IFNAME")}
    try:
        summary = fit(training, metrics, log, placement)
    except BaseException:
        metrics.close_trackers(None, "failed")
        raise
    summary["trackers"] = metrics.close_trackers(summary, summary["status"])
    metrics.write("summary", **summary)
    metrics.close()
    strategy.barrier()
    return summary


@dataclass
class Training:
    """Everything `fit` needs, built once by `setup`."""

    exp: Experiment
    spec: registry.StrategySpec
    strategy: Strategy
    out_dir: Path
    data: Any
    precision: Precision
    raw_model: Any
    """The GPT2LMHeadModel itself: what checkpoints hold and the replica check hashes."""
    model: torch.nn.Module
    """What the step calls: raw_model inside LanguageModel, maybe compiled, then wrapped."""
    optimizer: torch.optim.Optimizer
    batches: Batches
    batch_size: int
    """Sequences per process per micro-step (micro_batch_size x devices it drives)."""
    accum_steps: int
    """Micro-batches per optimizer step: train.grad_accum_steps, or with strong scaling what
    keeps train.global_batch_size over this job's replicas."""
    start_step: int = 0
    resumed_from: str | None = None
    last_saved: float = dataclasses.field(default_factory=time.monotonic)

    @property
    def global_batch(self) -> int:
        return self.batch_size * self.accum_steps * self.strategy.world_size

    @property
    def tokens_per_step(self) -> int:
        return self.global_batch * self.exp.train.seq_len

    @functools.cached_property
    def device_name(self) -> str:
        return _device_name(self.strategy.device)

    @functools.cached_property
    def flops_per_token(self) -> int:
        return flops_per_token(self.raw_model, self.exp.train.seq_len)

    @functools.cached_property
    def peak_flops_per_device(self) -> float | None:
        """Known for GPUs (and wherever HPCDP_PEAK_FLOPS says): the MFU's denominator."""
        if self.strategy.device.type != "cuda" and not os.environ.get("HPCDP_PEAK_FLOPS"):
            return None
        return peak_flops(self.device_name, self.precision.name)

    def checkpoint_step_due(self, step: int) -> bool:
        """Every checkpoint_interval steps: every rank knows the step, so no agreement."""
        interval = self.exp.train.checkpoint_interval
        return bool(interval and step % interval == 0)

    def checkpoint_time_due(self) -> bool:
        """checkpoint_every_s seconds after the last one, by this rank's clock: ranks agree
        on it (StopSignal.agreed) before any saves, since a sharded save is collective."""
        every = self.exp.train.checkpoint_every_s
        return bool(every and time.monotonic() - self.last_saved >= every)

    def save(self, step: int, metrics: MetricsWriter) -> None:
        """Every rank calls this: rank 0 writes the whole state to one file, or (sharded
        strategies) every rank writes its shard."""
        self.last_saved = time.monotonic()
        strategy, keep = self.strategy, self.exp.train.keep_checkpoints
        strategy.before_checkpoint(self.optimizer)
        state = {"precision": self.precision.state_dict(), "step": step,
                 "data": self.batches.state_dict(), "rng": checkpoint.rng_state(),
                 "config": as_dict(self.exp), "strategy": self.spec.name,
                 "world_size": strategy.world_size, "sample_layout": self.sample_layout()}
        failed = None
        try:
            if self.spec.sharded_checkpoints:
                from torch.distributed.checkpoint.state_dict import get_state_dict

                model_state, optimizer_state = get_state_dict(self.raw_model, self.optimizer)
                token = strategy.broadcast_object(os.getpid(), name="checkpoint_token")
                path = checkpoint.save_sharded(
                    self.out_dir, step, {"model": model_state, "optimizer": optimizer_state},
                    state, token, strategy.is_main, keep=keep)
            elif strategy.is_main:
                path = checkpoint.save(self.out_dir, step, {
                    "model": self.raw_model.state_dict(),
                    "optimizer": self.optimizer.state_dict(), **state}, keep=keep)
        except checkpoint.CheckpointError as exc:
            failed = exc
        # Rank 0 tells the others whether the checkpoint exists: after a failed save (a full
        # disk) every rank ends with rank 0's one line, none of them in its next collective.
        said = strategy.broadcast_object(failed and str(failed), name="checkpoint_failed")
        if said:
            raise failed if strategy.is_main else AlreadySaid(checkpoint.CheckpointError.exit_code)
        if failed:  # only this rank failed (rank 0 did not): say so here
            raise failed
        if strategy.is_main:
            metrics.write("checkpoint", step=step, path=str(path))

    def sample_layout(self) -> dict[str, int]:
        """What the data stream's position means: sequences drawn per micro-step over all
        ranks, and micro-steps per optimizer step. A resumed run must draw the same."""
        return {"sequences_per_micro_step": self.batch_size * self.strategy.world_size,
                "grad_accum_steps": self.accum_steps}


def setup(exp: Experiment, spec: registry.StrategySpec, strategy: Strategy, out_dir: Path,
          resume: bool, log: Callable[[str], None]) -> Training:
    """Data, model, optimizer, precision and batches; resumed from a checkpoint if asked."""
    cfg, device = exp.train, strategy.device
    data = open_data(exp)
    precision = make_precision(spec.mixed_precision, cfg.amp_dtype, cfg.amp_backend, device.type,
                               cfg.apex_opt_level)
    # Same seed on every rank: identical initial weights (DDP and Horovod broadcast anyway).
    torch.manual_seed(cfg.seed)
    raw_model = build_model(exp.model.preset, data.vocab_size, cfg.seq_len, exp.model.dropout,
                            exp.model.attention)
    if exp.model.init_from:  # every rank the same weights; a resume below replaces them
        load_pretrained(raw_model, exp.model.init_from, log)
    raw_model = raw_model.to(device)
    model: torch.nn.Module = LanguageModel(raw_model)
    optimizer = make_optimizer(model, exp, device, fused=precision.backend == "native")
    model, optimizer = precision.initialize(model, optimizer)
    # After initialisation each rank draws its own dropout masks.
    torch.manual_seed(cfg.seed + 1 + strategy.rank)
    batch_size = cfg.micro_batch_size * strategy.devices_per_process
    accum_steps = cfg.accum_steps(strategy.world_size * strategy.devices_per_process)
    batches = Batches(data, "train", cfg.seq_len, batch_size, strategy.rank,
                      strategy.world_size, cfg.seed, accum_steps)
    training = Training(exp=exp, spec=spec, strategy=strategy, out_dir=out_dir, data=data,
                        precision=precision, raw_model=raw_model, model=model,
                        optimizer=optimizer, batches=batches, batch_size=batch_size,
                        accum_steps=accum_steps)
    if spec.grad_comm:  # only where gradients travel between processes
        spec.check_grad_comm(cfg.grad_comm)
        strategy.grad_comm = cfg.grad_comm
    strategy.compute_dtype, strategy.settings = precision.name, cfg
    if strategy.casts_parameters:
        if precision.backend == "apex":
            raise UsageError(f"train.amp_backend 'apex': {spec.name} does mixed precision itself "
                             "(FSDP's MixedPrecisionPolicy); use train.amp_backend=native")
        precision.use_autocast = False
    _wrap(training, log)
    # After the wrapper: a sharded strategy's state exists only once its model is sharded
    # (and Horovod's and ZeRO's optimizers are new objects).
    if resume or exp.train.resume_from:
        _resume(training, log)
    training.model.train()
    return training


def load_pretrained(model: torch.nn.Module, folder: str, log: Callable[[str], None]) -> None:
    """model.init_from's weights (hpcdp/config.py checked the folder's shape at load)."""
    from safetensors.torch import load_file

    path = Path(folder).expanduser()
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise UsageError(f"model.init_from {folder!r} holds no .safetensors weights")
    state = {k: v for f in files for k, v in load_file(str(f)).items()}
    if "wte.weight" in state:  # the Hub's original gpt2 files: GPT2Model's names
        state = {k if k.startswith("lm_head.") else f"transformer.{k}": v
                 for k, v in state.items()}
    # Old files also hold the causal mask as a buffer (attn.bias, attn.masked_bias): not weights.
    state = {k: v.float() for k, v in state.items()
             if not k.endswith((".attn.bias", ".attn.masked_bias"))}
    load_weights(model, state, f"model.init_from {folder!r}")
    log(f"train: initial weights from {path}")


def _wrap(t: Training, log: Callable[[str], None]) -> None:
    """The strategy's wrapper, and torch.compile on the side of it the strategy asks for: DDP
    is compiled around its wrapper (torch's advice: Dynamo then splits the graph at DDP's
    bucket boundaries, so all-reduce still overlaps backward); DataParallel and Horovod compile
    the model inside (DataParallel replicates what it wraps; Horovod wraps only the optimizer)."""
    strategy, compile_ = t.strategy, t.exp.train.compile
    if compile_ and not strategy.compile_around_wrapper:
        t.model = torch.compile(t.model)
    t.model, t.optimizer = strategy.wrap(t.model, t.optimizer, t.accum_steps)
    if compile_ and strategy.compile_around_wrapper:
        t.model = torch.compile(t.model)
    if compile_:
        log(f"train: torch.compile {'around' if strategy.compile_around_wrapper else 'inside'}"
            f" the {type(strategy).__name__} wrapper")


def _resume(t: Training, log: Callable[[str], None]) -> None:
    """Continue from the newest checkpoint in the run folder, if there is one; else from the
    newest of train.resume_from's run folder (another run continued here)."""
    # Rank 0 picks the checkpoint, so every rank loads the same one (shared file system).
    newest, refusal = None, None
    if t.strategy.is_main:
        newest = checkpoint.newest_intact(t.out_dir, log)
        earlier = t.exp.train.resume_from
        if newest is None and earlier:
            try:
                run_lock.refuse_if_training(Path(earlier), "train.resume_from")
                newest = checkpoint.newest_intact(Path(earlier), log)
            except UsageError as exc:  # the run it continues is still training
                refusal = str(exc)
            if newest is not None:
                log(f"train: continuing the run of {earlier} in {t.out_dir}")
            elif refusal is None:
                refusal = (f"train.resume_from {earlier!r} holds no intact checkpoint in "
                           f"{checkpoint.checkpoint_dir(Path(earlier))}")
    found, refusal = t.strategy.broadcast_object((str(newest) if newest else None, refusal),
                                                 name="resume_checkpoint")
    if refusal:  # every rank ends; rank 0 says why
        raise UsageError(refusal) if t.strategy.is_main else AlreadySaid(UsageError.exit_code)
    if found is None:
        log(f"train: --resume: no checkpoint in {checkpoint.checkpoint_dir(t.out_dir)}, "
            "starting fresh")
        return
    state = checkpoint.load(Path(found))
    _check_same_family(state, t, found)
    _check_compatible(state["config"], t.exp, found)
    _check_same_samples(state, t, found, log)
    if checkpoint.is_sharded(Path(found)):
        from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

        model_state, optimizer_state = get_state_dict(t.raw_model, t.optimizer)
        shards = {"model": model_state, "optimizer": optimizer_state}
        checkpoint.load_shards(Path(found), shards)  # into this job's layout: reshards
        set_state_dict(t.raw_model, t.optimizer, model_state_dict=shards["model"],
                       optim_state_dict=shards["optimizer"])
        if state["world_size"] != t.strategy.world_size:
            log(f"train: resharded the checkpoint's state from {state['world_size']} ranks to "
                f"{t.strategy.world_size}")
    else:
        t.raw_model.load_state_dict(state["model"])
        t.optimizer.load_state_dict(state["optimizer"])
    t.precision.load_state_dict(state["precision"])
    t.batches.load_state_dict(state["data"])
    t.start_step, t.resumed_from = state["step"], found
    if t.strategy.is_main:
        checkpoint.set_rng_state(state["rng"])  # rank 0's; other ranks re-seed
    else:
        torch.manual_seed(t.exp.train.seed + 1 + t.strategy.rank + 7919 * t.start_step)
    log(f"train: resumed from {found} at step {t.start_step}")


def header(t: Training, env: distenv.DistEnv) -> dict[str, Any]:
    """The metrics header: what ran, where, with which settings (docs/metrics.md)."""
    cfg, strategy, precision, spec = t.exp.train, t.strategy, t.precision, t.spec
    return dict(
        strategy=spec.name, mechanism=spec.mechanism, paper_name=spec.paper_name,
        precision=precision.name,
        amp_backend=precision.backend if precision.name != "fp32" else None,
        world_size=strategy.world_size, nodes=env.num_nodes,
        tasks_per_node=env.local_world_size, device=strategy.device.type,
        device_name=t.device_name,
        devices_per_process=strategy.devices_per_process, model_preset=t.exp.model.preset,
        n_params=count_params(t.raw_model), seq_len=cfg.seq_len,
        micro_batch_size=cfg.micro_batch_size, grad_accum_steps=t.accum_steps,
        scaling=cfg.scaling, global_batch_size=t.global_batch, tokens_per_step=t.tokens_per_step,
        flops_per_token=t.flops_per_token,
        peak_flops_per_device=t.peak_flops_per_device,
        start_step=t.start_step, resumed_from=t.resumed_from, slurm_job_id=env.job_id,
        restart_count=env.restart_count, hostname=socket.gethostname(),
        experiment=t.exp.name, config=as_dict(t.exp), versions=_versions(),
        threads_per_process=torch.get_num_threads(),
        # The CPUs this process may run on (Slurm's binding where it binds), beside its threads.
        cpus_per_process=(len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
                          else os.cpu_count()),
        malloc=malloc.in_use(),
        launcher=env.launcher, container=distenv.container_in_use(),
        communication=strategy.communication, grad_comm=strategy.grad_comm,
        grad_bytes_per_step=_grad_bytes(t.raw_model, strategy.grad_comm),
    )


GRAD_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2}


def _grad_bytes(model: torch.nn.Module, grad_comm: str) -> int | None:
    """Bytes of gradient one rank puts into the all-reduce per optimizer step."""
    if grad_comm not in GRAD_BYTES:
        return None
    n = sum(p.numel() for p in model.parameters() if p.requires_grad)
    return n * GRAD_BYTES[grad_comm]


def fit(t: Training, metrics: MetricsWriter, log: Callable[[str], None],
        placement: dict[str, Any] | None = None) -> dict[str, Any]:
    """The loop: step, log, evaluate, checkpoint, stop on a signal. Returns the summary.
    `placement`: the rank's device, for its record in RUN_DIR/ranks/."""
    cfg, strategy, device = t.exp.train, t.strategy, t.strategy.device
    log(f"train: {t.spec.name} ({strategy.describe()}), precision {t.precision.name}, "
        f"world {strategy.world_size}, global batch {t.global_batch} x {cfg.seq_len} tokens, "
        f"{count_params(t.raw_model) / 1e6:.2f}M parameters, steps {t.start_step + 1}..{cfg.steps}")
    throughput = Throughput(t, metrics)
    stop, fault = StopSignal(cfg.stop_check_s), faults.from_environment()
    watchdog = Watchdog(t.out_dir, strategy.rank, strategy.world_size, factor=cfg.hang_factor,
                        floor_s=cfg.hang_floor_s, ceiling_s=cfg.dist_timeout_s,
                        placement=placement)
    step, last_loss, last_val = t.start_step, None, None
    timer = PhaseTimer(device)
    while step < cfg.steps:
        t0 = time.perf_counter()
        lr = lr_at(step, lr=cfg.lr, min_lr=cfg.min_lr, warmup_steps=cfg.warmup_steps,
                   total_steps=cfg.steps)
        result = train_step(t.model, t.optimizer, t.batches, strategy, t.precision,
                            accum_steps=t.accum_steps, grad_clip=cfg.grad_clip, lr=lr,
                            timer=timer)
        _sync(device)
        phases = timer.read()
        step += 1
        throughput.step_done(time.perf_counter() - t0)
        watchdog.beat(step, throughput.times[-1])
        if step % cfg.log_interval == 0 or step == cfg.steps:
            line, last_loss = throughput.record(step, result, lr, phases)
            log(line)
        if step == cfg.steps or (cfg.eval_interval and step % cfg.eval_interval == 0):
            last_val = _evaluate(t, step, metrics, log, watchdog)
        if fault and fault.after_step(step, strategy.rank, lambda: stop.name is not None,
                                      watchdog.beat, fired_marker=t.out_dir / ".fault-fired"):
            stop.check_now()  # every rank paused at this step: agree on the stop here
        agreed = stop.agreed(strategy, device, step, throughput.times[-1], t.checkpoint_time_due())
        stopping = step < cfg.steps and agreed.stop
        if step == cfg.steps or stopping or agreed.checkpoint or t.checkpoint_step_due(step):
            t.save(step, metrics)
            watchdog.beat()
        if stopping:
            log(f"train: {stop.name} received: stopped after step {step} with a checkpoint; "
                "run again with --resume to continue")
            break
    throughput.loop_done()
    stop.restore()
    watchdog.stop()
    if step == t.start_step:
        log(f"train: nothing to do, the run already reached step {cfg.steps}")
    digest, identical = replica_check(t.raw_model, strategy, device)
    if not identical:
        log("train: WARNING: model replicas differ across ranks at the end")
    return {"status": "completed" if step >= cfg.steps else "interrupted", "steps": step,
            "final_loss": last_loss, "final_val_loss": last_val,
            **throughput.summary(), "params_sha256": digest, "replicas_identical": identical,
            "memory": memory.summary(t.raw_model, t.optimizer, strategy, device)}


def _evaluate(t: Training, step: int, metrics: MetricsWriter, log: Callable[[str], None],
              watchdog: Watchdog) -> float:
    watchdog.grace()  # the first evaluation compiles its graph (train.compile): not a hang
    val = evaluate(t.model, t.data, t.exp, t.strategy, t.precision, t.batch_size)
    metrics.write("eval", step=step, val_loss=val)
    log(f"train: step {step} val_loss {val:.4f}")
    watchdog.beat()
    return val


class Throughput:
    """Step times of this segment: the per-step metrics record and the summary's medians."""

    def __init__(self, t: Training, metrics: MetricsWriter) -> None:
        self.t, self.metrics = t, metrics
        self.start = time.perf_counter()
        self.times: list[float] = []
        self.peak = t.peak_flops_per_device
        self.devices = t.strategy.world_size * t.strategy.devices_per_process
        self.first_step_start: float | None = None
        self.loop_end: float | None = None
        self.comm: dict[str, float] | None = None

    def step_done(self, seconds: float) -> None:
        """After each step's synchronize (every step, logged or not: the strategy's timing of
        the step's all-reduce is read and reset here)."""
        if self.first_step_start is None:
            self.first_step_start = time.perf_counter() - seconds
        self.times.append(seconds)
        self.comm = self.t.strategy.comm_breakdown()

    def loop_done(self) -> None:
        """The end of the segment's last loop iteration: its logging, evaluation, checkpoint and
        stop check done (tokens per elapsed second include them)."""
        self.loop_end = time.perf_counter()

    def record(self, step: int, result: StepResult, lr: float, phases: dict[str, float]
               ) -> tuple[str, float]:
        """Write the step record (every rank calls it: the loss and the ranks' work are
        averaged and gathered in one collective); returns the human line and the loss."""
        t, dt, device, comm = self.t, self.times[-1], self.t.strategy.device, self.comm
        tokens_per_s = t.tokens_per_step / dt
        exposed = t.strategy.exposed_comm(phases, comm)
        loss, rank_work = mean_loss_and_rank_work(
            t.strategy, result.loss, None if exposed is None else dt - exposed)
        self.metrics.write(
            "step", step=step, loss=loss, lr=lr, grad_norm=result.grad_norm.item(),
            loss_scale=t.precision.loss_scale(), skipped=result.skipped, phases_s=phases,
            rank_work_s=rank_work,  # before the fields harvest's fast pattern captures
            ddp_comm_s=({k: comm[k] for k in ("allreduce", "exposed", "window")}
                        if comm else None),
            exposed_comm_s=exposed,
            allreduce_s=comm["allreduce"] if comm else None,
            allreduce_bytes=comm["bytes"] if comm else None,
            allreduce_calls=comm["calls"] if comm else None, step_time_s=dt,
            tokens_per_s=tokens_per_s, tokens_seen=step * t.tokens_per_step,
            elapsed_s=time.perf_counter() - self.start,
            max_mem_gb=(torch.cuda.max_memory_allocated(device) / 1e9
                        if device.type == "cuda" else None),
            mfu=(t.flops_per_token * tokens_per_s / (self.peak * self.devices)
                 if self.peak else None),
        )
        return step_line(step, t.exp.train.steps, loss, lr, tokens_per_s, dt, t.spec.name,
                         t.strategy.world_size), loss

    def summary(self) -> dict[str, Any]:
        timed = self.times[self.t.exp.train.warmup_log_steps:] or self.times
        median = statistics.median(timed) if timed else None
        tokens = len(self.times) * self.t.tokens_per_step
        wall = None
        if self.first_step_start is not None:
            wall = (self.loop_end or time.perf_counter()) - self.first_step_start
        return {"elapsed_s": time.perf_counter() - self.start,
                "tokens_per_s_median": self.t.tokens_per_step / median if median else None,
                "step_time_s_median": median, "tokens_trained": tokens,
                "train_elapsed_s": wall,
                "tokens_per_elapsed_s": tokens / wall if wall else None}


def mean_loss_and_rank_work(strategy: Strategy, loss: torch.Tensor, work_s: float | None
                            ) -> tuple[float, dict[str, float] | None]:
    """The loss averaged over ranks, and how the ranks' own work in the step (each one's step
    less the communication it waited for) spread: each rank puts its work in its own slot, and
    the one average that the loss needed anyway carries the slots. Written as a summary (ranks,
    mean, sd, min, max, the slowest rank), a few numbers at any world size; the forecast's
    slowest-of-N term is read from its sd. None where there is one rank or the wait is not
    timed apart from compute (FSDP, DataParallel)."""
    n = strategy.world_size
    if n == 1 or work_s is None:
        return strategy.mean(loss).item(), None
    values = torch.zeros(n + 1, dtype=torch.float32, device=loss.device)  # as the loss
    values[0] = loss
    values[1 + strategy.rank] = work_s * n  # the average divides by n
    mean_loss, *work = strategy.mean(values).tolist()
    mean = sum(work) / n
    slowest = max(range(n), key=work.__getitem__)
    return mean_loss, {"ranks": n, "mean": mean,
                       "sd": math.sqrt(sum((w - mean) ** 2 for w in work) / (n - 1)),
                       "min": min(work), "max": work[slowest], "slowest": slowest}


def replica_check(model: torch.nn.Module, strategy: Strategy,
                  device: torch.device) -> tuple[str, bool]:
    """sha256 of the parameters, and whether every rank holds bit-identical ones."""
    digest = hashlib.sha256()
    for name, tensor in model.state_dict().items():
        if hasattr(tensor, "full_tensor"):  # a DTensor shard (FSDP): its replica's whole value
            tensor = tensor.full_tensor()
        digest.update(name.encode())
        digest.update(tensor.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy())
    mine = digest.hexdigest()
    if strategy.world_size == 1:
        return mine, True
    differs = torch.tensor(0.0 if strategy.broadcast_object(mine, name="params_sha256") == mine
                           else 1.0, device=device)
    return mine, strategy.mean(differs).item() == 0.0


def _check_same_family(state: dict, t: Training, path: str) -> None:
    """A sharded strategy resumes only from sharded checkpoints, the others only from one
    file of the whole state."""
    sharded = checkpoint.is_sharded(Path(path))
    if sharded == t.spec.sharded_checkpoints:
        return

    def kind(shards: bool) -> str:
        return ("sharded checkpoints (one shard per rank, torch.distributed.checkpoint)" if shards
                else "checkpoints of the whole state in one file")
    raise UsageError(f"checkpoint {path} is one of {state['strategy']}'s {kind(sharded)}; "
                     f"{t.spec.name} resumes only from {kind(not sharded)}: use another --out "
                     "or --fresh")


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


def _check_same_samples(state: dict, t: Training, path: str, log: Callable[[str], None]) -> None:
    """The data stream continues only with the same sequences per micro-step over all ranks
    and the same accumulation: then any world size continues exactly (batches are drawn over
    the global batch, not per rank). Anything else is refused, naming what differs."""
    cfg = state["config"]["train"]
    saved = state.get("sample_layout") or {  # checkpoints from before sample_layout
        "sequences_per_micro_step": cfg["micro_batch_size"] * state["world_size"],
        "grad_accum_steps": cfg["grad_accum_steps"]}
    now = t.sample_layout()
    if saved != now:
        differs = ", ".join(f"{k} {saved[k]} (now {now[k]})" for k in now if saved[k] != now[k])
        raise UsageError(
            f"checkpoint {path} was trained with {differs}: this job cannot continue its data "
            f"stream; match micro_batch_size x world size ({saved['sequences_per_micro_step']}) "
            "and grad_accum_steps, or use another --out")
    if state["world_size"] != t.strategy.world_size:
        log(f"train: the checkpoint was written by {state['world_size']} ranks, this job has "
            f"{t.strategy.world_size}; the global batch is the same, so it continues exactly")


__all__ = ["run", "train_step", "lr_at", "evaluate", "StepResult"]
