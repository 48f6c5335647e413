"""Cluster profiles and experiment files: typed, validated, with fix-it errors.

Both are YAML mappings read into frozen dataclasses. Validation happens here, before anything is
written or submitted: an unknown key names the closest valid one, a wrong type names the field,
the value and the expected type, and impossible combinations say what would be valid. Every field
can be overridden from the command line with `--set section.field=value` (YAML syntax for value).
Pure Python: train/ imports this module too.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml

from hpcdp import (
    EXPERIMENTS_DIR,
    PROFILES_DIR,
    PUBLISHED_FIGURES,
    PUBLISHED_SERIES,
    strategies,
    tracking,
)
from hpcdp.errors import ConfigErrors, UsageError, did_you_mean, one_line

# --------------------------------------------------------------------------------------------
# Cluster profile


@dataclass(frozen=True, kw_only=True)
class NetworkConfig:
    """The cluster's network as `hpcdp forecast` needs it for a cluster hpcdp has not run on
    (docs/forecast.md): bus bandwidths as nccl-tests reports them (busbw, GB/s, 1e9 bytes/s),
    latencies per ring step as NCCL's tuning model counts them. Unset (0): not known."""

    inter_node_busbw_gbps: float = 0.0
    """Bus bandwidth over 2+ nodes, GB/s: the busbw nccl-tests' all_reduce_perf prints at a
    large size on 2 or more whole nodes (every GPU of each). NCCL rings through every NIC, so
    on nodes with a NIC per GPU it is about the NICs' sum, not one NIC's rate: 331 on 4 x 8
    H100 with 8 x 400 Gb/s InfiniBand each (experiments/forecast-published.yaml)."""
    intra_node_busbw_gbps: float = 0.0
    """Bus bandwidth within a node, GB/s (all_reduce_perf on one node: NVLink H100 ~ 360-480)."""
    inter_node_latency_us: float = 0.0
    """Latency of one ring step between nodes, microseconds (NCCL's tuning: ~5-15 for IB)."""
    intra_node_latency_us: float = 0.0
    """Latency of one ring step within a node, microseconds (NVLink: ~1-3)."""
    gpus_per_node: int = 0
    """GPUs per node the figures were taken with; 0: the profile's gpus_per_node."""
    nic_gbit: float = 0.0
    """Line rate of one of a node's NICs, Gb/s; 0: the usual for the profile's gpu_type (400
    for H100 and H200 nodes, 200 for A100, 100 for V100). Only for the warning when the
    inter-node figure is below it."""

    def __post_init__(self) -> None:
        for name in ("inter_node_busbw_gbps", "intra_node_busbw_gbps", "inter_node_latency_us",
                     "intra_node_latency_us", "nic_gbit"):
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and 0 <= value < float("inf")):
                raise UsageError(f"cluster.network.{name} {value!r} must be a number of 0 or "
                                 "more (0: not known)")
        if self.gpus_per_node < 0:
            raise UsageError(f"cluster.network.gpus_per_node {self.gpus_per_node} must be 0 or "
                             "more")

    @property
    def known(self) -> bool:
        return self.inter_node_busbw_gbps > 0 and self.intra_node_busbw_gbps > 0


@dataclass(frozen=True, kw_only=True)
class ContainerConfig:
    """The image every rank, probe and data preparation runs in (docs/containers.md)."""

    runtime: Literal["none", "apptainer", "singularity", "pyxis", "oci"] = "none"
    """apptainer (singularity: the same, under its older command): `srun ... apptainer exec
    IMAGE python`; pyxis: srun's --container-image (NVIDIA's Pyxis/enroot plugin); oci: srun's
    own --container=BUNDLE (oci.conf with runc or crun); none: no container."""
    image: str = ""
    """apptainer: a .sif file or sandbox folder; pyxis: an image reference such as
    nvcr.io#nvidia/pytorch:24.05-py3, or a .sqsh file; oci: a bundle folder with config.json."""
    mounts: list[str] = field(default_factory=list)
    """More bind mounts, each SRC[:DST[:OPTIONS]] with absolute paths (DST defaults to SRC).
    The run folder, the data, the project and the working directory are always mounted at
    their own paths. Not for oci: a bundle's config.json carries its mounts."""
    env: dict[str, str] = field(default_factory=dict)
    """Variables set inside the container only (the job's own environment passes in too)."""
    gpu: Literal["auto", "nv", "rocm", "none"] = "auto"
    """apptainer's --nv (NVIDIA) or --rocm (AMD) GPU support; auto: --nv when the profile has
    GPUs. pyxis and oci get GPUs from the site's enroot or OCI hooks."""
    mount_home: bool = True
    """false: leave $HOME out (apptainer --no-home, pyxis --no-container-mount-home)."""
    workdir: str = ""
    """The working directory inside; default: the one the script was rendered in (mounted)."""
    options: list[str] = field(default_factory=list)
    """More options, verbatim and quoted: apptainer exec's, or srun's for pyxis and oci."""

    def __post_init__(self) -> None:
        where = "cluster.container"
        if self.runtime == "none":
            if self.image:
                raise UsageError(f"{where}.image {self.image!r} is set but {where}.runtime is "
                                 "'none'; set runtime to apptainer, singularity, pyxis or oci")
            return
        if not self.image.strip():
            raise UsageError(f"{where}.runtime {self.runtime!r} needs {where}.image: "
                             f"{_IMAGE_HINT[self.runtime]}")
        _no_control(self.image, f"{where}.image")
        if self.runtime != "pyxis" or looks_like_path(self.image):
            path = Path(self.image).expanduser()
            if not path.exists():
                raise UsageError(f"{where}.image {self.image!r} does not exist; expected "
                                 f"{_IMAGE_HINT[self.runtime]}")
            if self.runtime == "oci" and not (path / "config.json").is_file():
                raise UsageError(f"{where}.image {self.image!r} has no config.json; an oci "
                                 "image is a bundle folder (config.json and its root file "
                                 "system), e.g. made by `runc spec` or `umoci unpack`")
        if self.mounts and self.runtime == "oci":
            raise UsageError(f"{where}.mounts {self.mounts!r}: an oci bundle carries its "
                             "mounts in its config.json; add them there, or use apptainer")
        for mount in self.mounts:
            self.mount_paths(mount)
        for key in self.env:
            _check(key, f"{where}.env key", _ENV_RE, "a shell variable name")
        if self.workdir and not self.workdir.startswith("/"):
            raise UsageError(f"{where}.workdir {self.workdir!r} must be an absolute path")
        for opt in self.options:
            _no_control(opt, f"{where}.options entry")
            if not opt.startswith("-"):
                raise UsageError(f"{where}.options entry {opt!r} must be one option starting "
                                 "with '-', e.g. --writable-tmpfs or --container-remap-root")
            if self.runtime in ("apptainer", "singularity") and opt.split("=")[0] in (
                    "--cleanenv", "-e", "--containall", "-C"):
                raise UsageError(
                    f"{where}.options entry {opt!r} would clear the SLURM_* variables each "
                    "rank finds its place by (--cleanenv, -e, --containall and -C are "
                    f"refused); leave it out, and set what the image must see in {where}.env")

    @staticmethod
    def mount_paths(mount: str) -> tuple[str, str, str]:
        """(source, target, options) of one SRC[:DST[:OPTIONS]] entry, or a one-line error."""
        where = "cluster.container.mounts entry"
        _no_control(mount, where)
        parts = mount.split(":")
        if len(parts) > 3 or any(not part for part in parts) or "," in mount:
            raise UsageError(f"{where} {mount!r} must be SRC, SRC:DST or SRC:DST:OPTIONS "
                             "with no empty part and no comma, e.g. /scratch/data:/data:ro")
        source = parts[0]
        target = parts[1] if len(parts) > 1 else source
        options = parts[2] if len(parts) > 2 else ""
        for path, what in ((source, "source"), (target, "target")):
            if not path.startswith(("/", "~")):
                raise UsageError(f"{where} {mount!r}: the {what} {path!r} must be an absolute "
                                 "path")
        if not Path(source).expanduser().exists():
            raise UsageError(f"{where} {mount!r}: the source {source!r} does not exist")
        return str(Path(source).expanduser()), target, options

    @property
    def active(self) -> bool:
        return self.runtime != "none"


_IMAGE_HINT = {
    "apptainer": "a .sif file or a sandbox folder (apptainer build pytorch.sif docker://...)",
    "singularity": "a .sif file or a sandbox folder (singularity build pytorch.sif docker://...)",
    "pyxis": "an image reference like nvcr.io#nvidia/pytorch:24.05-py3, or a .sqsh file",
    "oci": "a bundle folder holding config.json and its root file system",
}


def looks_like_path(image: str) -> bool:
    return image.startswith(("/", "./", "../", "~")) or image.endswith(".sqsh")


def _no_control(value: str, what: str) -> None:
    if any(ord(c) < 32 for c in value):
        raise UsageError(f"{what} {value!r} holds a newline or control character")


@dataclass(frozen=True, kw_only=True)
class ClusterProfile:
    """How one Slurm cluster wants jobs asked for and started."""

    name: str = "cluster"
    local_cluster: bool = False
    """True for the cluster that `hpcdp cluster up` runs on this machine: hpcdp then points
    Slurm's commands at its slurm.conf and says so when it is not running."""
    partition: str | None = None
    account: str | None = None
    qos: str | None = None
    time_limit: str = "01:00:00"
    """Slurm time limit: MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM or D-HH:MM:SS."""
    signal_lead_s: int | None = None
    """Seconds before the time limit at which Slurm signals the job to checkpoint and requeue
    (`--signal=B:USR2@N`); default: a tenth of the limit, at most 120 s."""
    gpus_per_node: int = 0
    """GPUs on each node; 0 for CPU-only nodes (then cpu_ranks_per_node ranks per node)."""
    gpu_request: Literal["gpus-per-node", "gres", "gpus-per-task"] = "gpus-per-node"
    """How the cluster wants GPUs asked: `--gpus-per-node=N`, `--gres=gpu:N`, or
    `--gpus-per-task=N/tasks` (each task then sees only its own GPUs)."""
    gpu_bind: str | None = None
    """Optional `--gpu-bind=` value (e.g. closest, single:1, map_gpu:0,1)."""
    gpu_type: str | None = None
    """Optional GPU type, e.g. v100: `--gres=gpu:v100:N` / `--gpus-per-node=v100:N`."""
    cpu_ranks_per_node: int = 1
    """Ranks per node for one-process-per-device strategies on CPU-only nodes."""
    cpus_per_task: int | None = None
    mem: str | None = None
    """Memory per node as Slurm takes it (e.g. 64G; 0 for all of it)."""
    modules: list[str] = field(default_factory=list)
    """`module load` names, in order."""
    setup: list[str] = field(default_factory=list)
    """Shell lines run before training, verbatim (e.g. `source ~/venvs/hpcdp/bin/activate`)."""
    python: str = ""
    """Interpreter that runs `python -m train`; empty: the one running hpcdp, or `python` (the
    image's) when container.runtime is set."""
    env: dict[str, str] = field(default_factory=dict)
    """Extra environment variables exported in the job."""
    network_interface: str | None = None
    """NCCL_SOCKET_IFNAME / GLOO_SOCKET_IFNAME, e.g. ib0 or ^lo,docker."""
    srun_mpi: str = "pmix"
    """srun --mpi plugin for MPI launches (see `srun --mpi=list`)."""
    horovod_controller: Literal["mpi", "gloo"] = "mpi"
    """Horovod's controller: MPI through srun --mpi, or Gloo with a rendezvous set up by hpcdp."""
    launcher: Literal["srun", "torchrun"] = "srun"
    """How DDP's ranks start: srun starts every rank (one task per device), or srun starts one
    torchrun per node, which starts the node's ranks (c10d rendezvous at the first node, on the
    job's port). Horovod and the one-process strategies always start with srun."""
    extra_sbatch: list[str] = field(default_factory=list)
    """Extra `#SBATCH` options, each like `--constraint=v100` or `--exclusive`."""
    campaign_exclusive: bool = True
    """`hpcdp compare` asks for whole nodes (`--exclusive`), so that no other job's processes
    run beside the cells; false where a site forbids or charges for it (docs/compare.md)."""
    output_dir: str = "runs"
    """Where runs are written: OUTPUT_DIR/EXPERIMENT/STRATEGY-Nn/. Relative to the cwd."""
    container: ContainerConfig = field(default_factory=ContainerConfig)
    """The container image the job's steps run in (docs/containers.md); none by default."""
    network: NetworkConfig = field(default_factory=NetworkConfig)
    """The network's figures for `hpcdp forecast` (docs/forecast.md); unknown by default."""

    def __post_init__(self) -> None:
        check_name(self.name, "cluster.name")
        limit_s = self.time_limit_s()
        if self.signal_lead_s is not None:
            _at_least("cluster.signal_lead_s", self.signal_lead_s, 1)
            if self.signal_lead_s >= limit_s:
                raise UsageError(
                    f"cluster.signal_lead_s {self.signal_lead_s} is not shorter than "
                    f"cluster.time_limit {self.time_limit!r} ({limit_s} s): the job would be "
                    "told to stop as it starts; give a smaller lead or a longer limit")
        _at_least("cluster.gpus_per_node", self.gpus_per_node, 0)
        _at_least("cluster.cpu_ranks_per_node", self.cpu_ranks_per_node, 1)
        if self.cpus_per_task is not None:
            _at_least("cluster.cpus_per_task", self.cpus_per_task, 1)
        for opt in self.extra_sbatch:
            name = opt.partition("=")[0]
            if (not opt.startswith("-") or any(c.isspace() for c in name) or '"' in opt
                    or "\n" in opt or "\r" in opt):
                raise UsageError(
                    f"cluster.extra_sbatch entry {opt!r} must be one sbatch option starting "
                    "with '-', as --name or --name=value (no double quote), e.g. "
                    "--constraint=v100 or '--comment=a b'"
                )
        if not isinstance(self.campaign_exclusive, bool):
            raise UsageError(f"cluster.campaign_exclusive {self.campaign_exclusive!r} must be "
                             "true or false")
        for key in self.env:
            _check(key, "cluster.env key", _ENV_RE, "a shell variable name")
        if self.srun_mpi and not _NAME_RE.fullmatch(self.srun_mpi):
            raise UsageError(
                f"cluster.srun_mpi {self.srun_mpi!r}: expected a plugin name like pmix")

    def time_limit_s(self) -> int:
        """cluster.time_limit in seconds (Slurm's forms; a lone number is minutes)."""
        match = _TIME_RE.fullmatch(self.time_limit)
        if not match:
            raise UsageError(
                f"cluster.time_limit {self.time_limit!r} is not a Slurm time; valid forms: MM, "
                "MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS (e.g. 30 or 04:00:00)")
        days, clock = match["days"], [int(p) for p in match["clock"].split(":")]
        if days is not None:  # D-HH[:MM[:SS]]
            hours, minutes, seconds = (clock + [0, 0])[:3]
        else:  # MM, MM:SS or HH:MM:SS
            hours, minutes, seconds = {1: [0, clock[0], 0], 2: [0, *clock], 3: clock}[len(clock)]
        total = ((int(days or 0) * 24 + hours) * 60 + minutes) * 60 + seconds
        if total <= 0:
            raise UsageError(f"cluster.time_limit {self.time_limit!r} must be longer than 0")
        return total

    def signal_lead(self) -> int:
        """Seconds before the limit at which the job is signalled (see signal_lead_s)."""
        if self.signal_lead_s is not None:
            return self.signal_lead_s
        return max(1, min(MAX_SIGNAL_LEAD_S, self.time_limit_s() // 10))

    def devices_per_node(self) -> int:
        """GPUs per node, or CPU ranks per node on CPU-only clusters."""
        return self.gpus_per_node or self.cpu_ranks_per_node


# --------------------------------------------------------------------------------------------
# Experiment

# preset -> (layers, width, heads, context). The one table: train/model.py builds from it.
MODEL_PRESETS: dict[str, tuple[int, int, int, int]] = {
    "tiny": (2, 128, 4, 128),  # for tests; its context grows with seq_len up to MAX_CONTEXT
    "gpt2-100m": (12, 768, 12, 512),  # the paper's: context 512
    "gpt2-124m": (12, 768, 12, 1024),  # the standard GPT-2 small
}
MAX_CONTEXT = 1024  # GPT-2's position embeddings


TOKENIZER_VOCAB = {"bytes": 256, "gpt2": 50257}
"""The tokenizers whose vocabulary is fixed; a trained BPE's is data.vocab_size."""


def vocab_size_of(experiment: Experiment) -> int:
    """The vocabulary the experiment's model is built with (GPT-2's where nothing says)."""
    return (TOKENIZER_VOCAB.get(experiment.data.tokenizer) or experiment.data.vocab_size
            or TOKENIZER_VOCAB["gpt2"])


def model_context(preset: str, seq_len: int) -> int:
    """The context (n_positions) of a preset trained at seq_len."""
    context = MODEL_PRESETS[preset][3]
    return max(context, min(seq_len, MAX_CONTEXT)) if preset == "tiny" else context


@dataclass(frozen=True, kw_only=True)
class ModelConfig:
    preset: Literal["tiny", "gpt2-100m", "gpt2-124m"] = "tiny"
    """tiny: 2 layers, width 128 (tests); gpt2-100m: the paper's; gpt2-124m: the standard GPT-2."""
    dropout: float = 0.0
    attention: Literal["sdpa", "eager"] = "sdpa"
    init_from: str = ""
    """A transformers GPT-2 folder (one `hpcdp export` wrote, or one downloaded elsewhere) whose
    weights training starts from instead of random ones; checked against the preset, vocabulary
    and context when the experiment is loaded. A resume still comes from the run's own
    checkpoints. Empty: random initial weights."""

    def __post_init__(self) -> None:
        if not 0.0 <= self.dropout < 1.0:  # also refuses nan
            raise UsageError(f"model.dropout {self.dropout!r} must be in [0, 1)")


@dataclass(frozen=True, kw_only=True)
class DataConfig:
    corpus: str = "shakespeare"
    """A folder of .txt/.md files, a JSON list of strings, a named corpus (shakespeare,
    fortunes), or `synthetic` (random tokens, for benchmarks)."""
    tokenizer: Literal["bytes", "bpe", "gpt2"] = "bytes"
    """bytes: 256 symbols, no files; bpe: byte-level BPE trained locally; gpt2: GPT-2's BPE
    from local files (data.gpt2_files)."""
    vocab_size: int | None = None
    """For `bpe`: the vocabulary to train. Checked against the tokenizer for every kind."""
    gpt2_files: str | None = None
    """For `gpt2`: a gpt2.tiktoken file, or a folder with vocab.json and merges.txt."""
    text_field: str = "text"
    """The field of a JSONL corpus, or the column of a Parquet one, that holds each document."""
    prepared_dir: str = "data/prepared"
    """Where `python -m train prepare` writes token files (relative to the cwd)."""
    val_fraction: float = 0.05

    def __post_init__(self) -> None:
        if not 0.0 < self.val_fraction < 0.5:
            raise UsageError(
                f"data.val_fraction {self.val_fraction!r} must be between 0 and 0.5 (exclusive)"
            )
        if self.vocab_size is not None:
            _at_least("data.vocab_size", self.vocab_size, 257)
        if self.tokenizer == "bpe" and self.vocab_size is None:
            raise UsageError("data.vocab_size is required with data.tokenizer 'bpe' (e.g. 8192)")
        if not self.text_field.strip():
            raise UsageError("data.text_field must name a field or column, e.g. text")


@dataclass(frozen=True, kw_only=True)
class FSDPConfig:
    """The sharded strategies' settings (fsdp, fsdp-apex, hsdp)."""

    reshard_after_forward: bool = True
    """true: free each block's gathered parameters after its forward and gather them again
    for backward (ZeRO-3: least memory, one more all-gather per block); false: keep them until
    backward (ZeRO-2: gradients and optimizer state sharded, parameters whole between forward
    and backward)."""


@dataclass(frozen=True, kw_only=True)
class TrainConfig:
    steps: int = 20
    """Optimizer steps."""
    micro_batch_size: int = 4
    """Sequences per device per forward pass. DataParallel splits micro_batch_size x GPUs."""
    grad_accum_steps: int = 1
    """Micro-batches per optimizer step (weak scaling); strong scaling derives it per cell."""
    scaling: Literal["weak", "strong"] = "weak"
    """weak: micro_batch_size and grad_accum_steps are per replica, so the global batch grows
    with the world. strong: the global batch is global_batch_size in every cell, and each cell
    accumulates global_batch_size / (micro_batch_size x replicas) micro-batches."""
    global_batch_size: int = 0
    """Sequences per optimizer step over all replicas, with scaling: strong (0: not set)."""
    grad_comm: Literal["fp32", "bf16", "fp16"] = "fp32"
    """The precision gradients travel in between processes (DDP communication hooks, Horovod's
    compression); the optimizer still steps on fp32 gradients."""
    seq_len: int = 128
    lr: float = 1.5e-4
    min_lr: float = 0.0
    warmup_steps: int = 0
    weight_decay: float = 0.01
    grad_clip: float = 1.0
    """Max gradient norm; 0 disables clipping."""
    seed: int = 1234
    log_interval: int = 1
    warmup_log_steps: int = 2
    """Steps left out of throughput medians (compilation, allocator warm-up)."""
    eval_interval: int = 0
    """Validation every N steps (0: only at the end)."""
    eval_batches: int = 4
    checkpoint_interval: int = 0
    """Checkpoint every N steps (0: only at the end and on a stop signal)."""
    checkpoint_every_s: float = 600.0
    """Also checkpoint when this many seconds passed since the last one (0: off): a hard kill
    (node failure, scontrol requeue, SIGKILL) loses at most this much training."""
    keep_checkpoints: int = 2
    """Newest checkpoints kept on disk (a 124M model with AdamW state is ~1.5 GB each)."""
    amp_dtype: Literal["auto", "fp16", "bf16"] = "auto"
    """Mixed-precision dtype of the -apex strategies; auto: fp16 on GPUs, bf16 on CPU."""
    amp_backend: Literal["native", "apex"] = "native"
    """native: torch.autocast + torch.amp.GradScaler; apex: NVIDIA apex.amp (legacy, CUDA)."""
    apex_opt_level: Literal["O1", "O2"] = "O1"
    compile: bool = False
    trackers: list[str] = field(default_factory=list)
    """Experiment trackers rank 0 also writes to: tensorboard, mlflow, wandb (docs/tracking.md).
    None by default: metrics.jsonl holds everything, and a run's files should not depend on
    which packages a machine happens to have."""
    fsdp: FSDPConfig = field(default_factory=FSDPConfig)
    malloc: Literal["auto", "tcmalloc", "jemalloc", "system"] = "auto"
    """The C allocator of training processes (train/malloc.py). auto: tcmalloc where installed,
    on hosts without GPUs and outside Horovod's MPI controller (glibc's malloc made CPU steps
    slower and their time depend on each process's allocation history); system: glibc's."""
    dist_timeout_s: int = 300
    """Timeout for process-group set-up and collectives (torch, Horovod's Gloo and its stall
    shutdown), and the most the progress watchdog waits: a hang becomes an error."""
    hang_factor: float = 20.0
    """The watchdog ends a rank that finished no step for hang_factor x the median step time
    (at least hang_floor_s, at most dist_timeout_s), with every rank's stack in RUN_DIR/hang/."""
    hang_floor_s: float = 60.0
    stop_check_s: float = 1.0
    """How often the ranks agree on a stop signal (one small all-reduce and a host sync): a
    signal stops every rank within this long plus a step. 0: after every step."""
    resume_from: str | None = None
    """A run folder whose newest checkpoint this run starts from while its own folder has none
    (`hpcdp submit --resume-from RUN_DIR`): the same run continued in another folder, on
    another number of ranks. Its own checkpoints, once written, come first."""
    on_hang: Literal["fail", "requeue"] = "fail"
    """After the watchdog ended a hung job: fail (the job ends FAILED), or requeue: the batch
    script resubmits itself excluding the silent ranks' nodes, into the same run folder, which
    resumes from the newest checkpoint (at most HPCDP_MAX_REQUEUES times)."""

    def accum_steps(self, replicas: int) -> int:
        """Micro-batches per optimizer step for `replicas` data-parallel replicas."""
        if self.scaling == "weak":
            return self.grad_accum_steps
        per_micro_step = self.micro_batch_size * replicas
        if self.global_batch_size % per_micro_step:
            raise UsageError(
                f"train.global_batch_size {self.global_batch_size} (train.scaling=strong) is not "
                f"a multiple of {per_micro_step} sequences per micro-step (micro_batch_size "
                f"{self.micro_batch_size} x {replicas} replicas)")
        return self.global_batch_size // per_micro_step

    def __post_init__(self) -> None:
        for name in ("lr", "min_lr", "weight_decay", "grad_clip", "checkpoint_every_s",
                     "stop_check_s",
                     "hang_factor", "hang_floor_s"):
            if not math.isfinite(getattr(self, name)):
                raise UsageError(f"train.{name} {getattr(self, name)!r} must be a finite number")
        _at_least("train.seed", self.seed, 0)
        for name in ("steps", "micro_batch_size", "grad_accum_steps", "seq_len", "log_interval",
                     "eval_batches", "dist_timeout_s"):
            _at_least(f"train.{name}", getattr(self, name), 1)
        for name in ("warmup_steps", "eval_interval", "checkpoint_interval", "warmup_log_steps"):
            _at_least(f"train.{name}", getattr(self, name), 0)
        if self.lr <= 0 or self.min_lr < 0 or self.min_lr > self.lr:
            raise UsageError(
                f"train.lr {self.lr!r} / train.min_lr {self.min_lr!r}: "
                "need 0 <= min_lr <= lr, lr > 0"
            )
        _at_least("train.keep_checkpoints", self.keep_checkpoints, 1)
        _at_least("train.global_batch_size", self.global_batch_size, 0)
        if self.scaling == "strong" and self.global_batch_size % self.micro_batch_size:
            raise UsageError(
                f"train.global_batch_size {self.global_batch_size} (train.scaling=strong) must be "
                f"a positive multiple of train.micro_batch_size {self.micro_batch_size}, e.g. "
                f"{self.micro_batch_size * 8}")
        if self.scaling == "strong" and not self.global_batch_size:
            raise UsageError("train.scaling=strong needs train.global_batch_size (sequences per "
                             f"optimizer step over all replicas), e.g. {self.micro_batch_size * 8}")
        if self.hang_factor <= 0 or self.hang_floor_s <= 0:
            raise UsageError(f"train.hang_factor {self.hang_factor!r} and train.hang_floor_s "
                             f"{self.hang_floor_s!r} must be above 0")
        if self.stop_check_s < 0:
            raise UsageError(f"train.stop_check_s {self.stop_check_s!r} must be >= 0 (0: after "
                             "every step)")
        if self.checkpoint_every_s < 0:
            raise UsageError(f"train.checkpoint_every_s {self.checkpoint_every_s!r} must be "
                             ">= 0 (0 turns time-based checkpoints off)")
        if self.grad_clip < 0:
            raise UsageError(f"train.grad_clip {self.grad_clip!r} must be >= 0 (0 disables it)")
        tracking.check_names(self.trackers)


@dataclass(frozen=True, kw_only=True)
class Matrix:
    strategies: list[str] = field(default_factory=lambda: list(strategies.PAPER_NAMES))
    nodes: list[int] = field(default_factory=lambda: [1])

    def __post_init__(self) -> None:
        names = [strategies.get(s).name for s in self.strategies]  # raises on unknown names
        # An alias and its name (or a repeat) would render one run directory twice.
        object.__setattr__(self, "strategies", list(dict.fromkeys(names)))
        for n in self.nodes:
            _at_least("matrix.nodes entry", n, 1)
        object.__setattr__(self, "nodes", list(dict.fromkeys(self.nodes)))

    def cells(self, max_nodes: int | None = None) -> list[tuple[strategies.StrategySpec, int]]:
        """Every (strategy, nodes) pair the strategy can run (single-node ones skip N > 1), up
        to `max_nodes`. An empty result is an error that says why: nothing would run."""
        out = []
        for name in self.strategies:
            strategy = strategies.get(name)
            for nodes in self.nodes:
                if ((strategy.max_nodes is None or nodes <= strategy.max_nodes)
                        and (max_nodes is None or nodes <= max_nodes)):
                    out.append((strategy, nodes))
        if out:
            return out
        if not self.strategies or not self.nodes:
            empty = "matrix.strategies" if not self.strategies else "matrix.nodes"
            raise UsageError(f"no jobs: {empty} is empty; list at least one, e.g. "
                             f"--set {empty}={'[single-gpu]' if empty.endswith('s') else '[1]'}")
        why = [f"{name} runs on {strategies.get(name).max_nodes} node only" for name in
               self.strategies if strategies.get(name).max_nodes is not None]
        if max_nodes is not None:
            why.append(f"this command runs on {max_nodes} node only")
        raise UsageError(f"no jobs: {'; '.join(why)}, and matrix.nodes is {self.nodes}; "
                         "add 1 to matrix.nodes or pick a multi-node strategy")


@dataclass(frozen=True, kw_only=True)
class CompareConfig:
    """`hpcdp compare`: every cell of the matrix, repeated, in one allocation."""

    repeats: int = 5
    """Runs of each (strategy, nodes) cell. 5: the fewest from which the verdict can call one
    of up to four strategies faster than every other (every pair's interval at 1 - 0.05 / 6
    needs p <= 0.0083; 5 vs 5 runs reach 0.008); five to seven need 6 (stats.needed_repeats,
    the table and calibration in docs/compare.md)."""
    order: Literal["shuffled", "as-listed"] = "shuffled"
    """Either way each repeat is one round of every cell. shuffled: each round in its own
    random order (one seed, recorded), so that no strategy always runs first or last;
    as-listed: every round in the matrix's order."""
    seed: int | None = None
    """The shuffle's seed; None: drawn at random and recorded in campaign.json."""
    equivalent_within: float = 0.02
    """The verdict calls cells "equivalent" when the 90% interval of their throughput ratio lies
    within 1 +- this (docs/compare.md): a difference smaller than it is no reason to choose."""
    network_baseline: bool = True
    """Run the all-reduce probes before the first cell and after the last (baseline/,
    baseline-end/); false leaves them out: no "Network baseline" table, no bandwidth reached."""

    def __post_init__(self) -> None:
        _at_least("compare.repeats", self.repeats, 1)
        if not isinstance(self.network_baseline, bool):
            raise UsageError(f"compare.network_baseline {self.network_baseline!r} must be "
                             "true or false")
        if self.seed is not None:
            _at_least("compare.seed", self.seed, 0)
        band = self.equivalent_within
        if isinstance(band, bool) or not isinstance(band, (int, float)) or not 0 <= band < 0.5:
            raise UsageError(f"compare.equivalent_within {band!r} must be a fraction in "
                             "[0, 0.5), e.g. 0.02 for 2%")


@dataclass(frozen=True, kw_only=True)
class Experiment:
    name: str = "experiment"
    description: str = ""
    model: ModelConfig = field(default_factory=ModelConfig)
    data: DataConfig = field(default_factory=DataConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    matrix: Matrix = field(default_factory=Matrix)
    compare: CompareConfig = field(default_factory=CompareConfig)

    def __post_init__(self) -> None:
        check_name(self.name, "experiment name")
        context = model_context(self.model.preset, self.train.seq_len)
        if self.train.seq_len > context:
            raise UsageError(f"train.seq_len {self.train.seq_len} exceeds the context {context} "
                             f"of model.preset {self.model.preset!r}")
        fixed_vocab = TOKENIZER_VOCAB.get(self.data.tokenizer)
        if fixed_vocab and self.data.vocab_size not in (None, fixed_vocab):
            raise UsageError(f"data.vocab_size {self.data.vocab_size} does not match "
                             f"data.tokenizer {self.data.tokenizer!r}, which has {fixed_vocab} "
                             "tokens; leave data.vocab_size out")
        if self.train.amp_backend == "apex" and self.train.amp_dtype == "bf16":
            raise UsageError("train.amp_backend 'apex' trains in fp16 only; use "
                             "train.amp_dtype=fp16 (or auto), or amp_backend=native for bf16")


# --------------------------------------------------------------------------------------------
# Loading

_NAME_RE = re.compile(r"[A-Za-z0-9._-]+")
_ENV_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_TIME_RE = re.compile(r"(?:(?P<days>\d+)-)?(?P<clock>\d+(?::\d{2}){0,2})")
MAX_SIGNAL_LEAD_S = 120
"""The default lead before the time limit: enough to checkpoint a GPT-2-small-sized model."""


def _check(value: str, what: str, pattern: re.Pattern, valid: str) -> None:
    if not pattern.fullmatch(str(value)):
        raise UsageError(f"{what} {value!r} is not allowed; use {valid}")


def check_name(value: str, what: str) -> None:
    """A profile's or experiment's name: it names files and jobs."""
    _check(value, what, _NAME_RE, "letters, digits, '.', '_' and '-'")


def _at_least(what: str, value: int, minimum: int) -> None:
    if value < minimum:
        raise UsageError(f"{what} {value!r} must be >= {minimum}")


def _type_name(tp: Any) -> str:
    origin = typing.get_origin(tp)
    if origin is Literal:
        return "one of " + ", ".join(repr(a) for a in typing.get_args(tp))
    if origin in (typing.Union, types.UnionType):
        return " or ".join(_type_name(a) for a in typing.get_args(tp))
    if tp is type(None):
        return "null"
    if origin is not None:
        return str(tp).replace("typing.", "")
    return getattr(tp, "__name__", str(tp))


def _coerce(value: Any, tp: Any, where: str) -> Any:
    """Check `value` against the annotation `tp`; returns the value (dataclasses built)."""
    origin = typing.get_origin(tp)
    if dataclasses.is_dataclass(tp):
        return build(tp, value, where)
    if origin in (typing.Union, types.UnionType):
        for arg in typing.get_args(tp):
            try:
                return _coerce(value, arg, where)
            except UsageError:
                continue
        raise _type_error(value, tp, where)
    if origin is Literal:
        choices = typing.get_args(tp)
        if value in choices:
            return value
        raise UsageError(
            f"{where} {value!r} is not valid{did_you_mean(str(value), map(str, choices))}; "
            f"valid: {', '.join(map(str, choices))}"
        )
    if origin is list:
        (item_tp,) = typing.get_args(tp)
        if not isinstance(value, list):
            raise _type_error(value, tp, where)
        return [_coerce(v, item_tp, f"{where}[{i}]") for i, v in enumerate(value)]
    if origin is dict:
        key_tp, val_tp = typing.get_args(tp)
        if not isinstance(value, dict):
            raise _type_error(value, tp, where)
        return {_coerce(k, key_tp, where): _coerce(v, val_tp, f"{where}.{k}")
                for k, v in value.items()}
    if tp is type(None):
        if value is None:
            return None
        raise _type_error(value, tp, where)
    if tp is bool:
        if isinstance(value, bool):
            return value
        raise _type_error(value, tp, where)
    if tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        raise _type_error(value, tp, where)
    if tp is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        if isinstance(value, str):  # YAML 1.1 reads 2e-3 (no dot) as a string
            try:
                return float(value)
            except ValueError:
                pass
        raise _type_error(value, tp, where)
    if tp is str:
        # YAML reads 01:00:00 as a number of seconds and 8G as a string: accept numbers, say so.
        if isinstance(value, str):
            return value
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return str(value)
        raise _type_error(value, tp, where)
    raise TypeError(f"unsupported annotation {tp!r} at {where}")


def _type_error(value: Any, tp: Any, where: str) -> UsageError:
    return UsageError(f"{where} {value!r} has the wrong type; expected {_type_name(tp)}")


def build(cls: type, data: Any, where: str) -> Any:
    """Build dataclass `cls` from a mapping, naming `where` in every error."""
    if not isinstance(data, dict):  # an empty file (None) too: it is not a mapping
        raise UsageError(f"{where} must be a mapping of keys to values, not {type(data).__name__}")
    hints = typing.get_type_hints(cls)
    valid = [f.name for f in dataclasses.fields(cls)]
    kwargs, problems = {}, []
    for key, value in data.items():  # every key, so that one run names every bad one
        if key not in valid:
            problems.append(f"unknown key {key!r} in {where or f'the {cls.__name__.lower()}'}"
                            f"{did_you_mean(str(key), valid)}; valid keys: {', '.join(valid)}")
            continue
        try:
            kwargs[key] = _coerce(value, hints[key], f"{where}.{key}" if where else key)
        except UsageError as exc:
            problems += ConfigErrors.of(exc)
    if problems:  # the checks across fields need every field's value: they wait for these
        raise ConfigErrors(problems)
    return cls(**kwargs)


class _Loader(yaml.SafeLoader):
    """YAML without 1.1's base-60 integers: `time_limit: 4:00:00` stays the string Slurm
    expects instead of becoming 14400 (which Slurm would read as minutes)."""


_Loader.yaml_implicit_resolvers = {
    first: [(tag, regexp) for tag, regexp in resolvers if tag != "tag:yaml.org,2002:int"]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:int",
    re.compile(r"^(?:[-+]?0b[0-1_]+|[-+]?0[0-7_]+|[-+]?(?:0|[1-9][0-9_]*)|[-+]?0x[0-9a-fA-F_]+)$"),
    list("-+0123456789"),
)


def load_yaml_text(text: str):
    return yaml.load(text, Loader=_Loader)  # noqa: S506 - a SafeLoader subclass


def read_yaml(path: Path, what: str) -> dict:
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise UsageError(f"{what} file {str(path)!r} does not exist") from None
    except (OSError, UnicodeDecodeError) as exc:  # a directory, no permission, not a folder...
        reason = getattr(exc, "strerror", None) or exc
        raise UsageError(f"{what} file {str(path)!r} cannot be read: {reason}") from None
    try:
        data = load_yaml_text(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        at = f" at line {mark.line + 1}" if mark else ""
        raise UsageError(f"{what} file {str(path)!r} is not valid YAML{at}") from None
    if not isinstance(data, dict):  # an empty file (None) too: it is not a mapping
        found = "it is empty" if data is None else f"not a {type(data).__name__}"
        raise UsageError(
            f"{what} file {str(path)!r} must hold a YAML mapping (key: value lines); {found}")
    return data


def _resolve(spec: str, folder: Path, what: str, not_these: dict[Path, str] | None = None
             ) -> Path:
    """A shipped name (`local`, `smoke`) or a path to a YAML file. `not_these`: files in
    `folder` that are something else (what each is), neither listed nor taken by name."""
    not_these = not_these or {}
    path = Path(spec)
    if path.suffix in (".yaml", ".yml") or "/" in spec or path.exists():
        return path
    candidate = folder / f"{spec}.yaml"
    shipped = sorted(p.stem for p in folder.glob("*.yaml") if p not in not_these)
    if candidate in not_these:
        raise UsageError(f"{spec!r} is {not_these[candidate]}, not one to run; shipped: "
                         f"{', '.join(shipped)}, or give a path to a YAML file")
    if candidate.exists():
        return candidate
    raise UsageError(
        f"no {what} named {spec!r}{did_you_mean(spec, shipped)}; "
        f"shipped: {', '.join(shipped)}, or give a path to a YAML file"
    )


def parse_overrides(pairs: list[str]) -> dict[str, dict[str, Any]]:
    """`--set a.b=value` pairs -> {"a": {"b": value}} with values read as YAML."""
    tree: dict[str, Any] = {}
    for pair in pairs:
        key, sep, raw = pair.partition("=")
        if not sep or not key or not all(_ENV_RE.fullmatch(p) for p in key.split(".")):
            raise UsageError(
                f"--set {one_line(pair)!r} must look like section.key=value, "
                "e.g. train.steps=10 or cluster.partition=gpu"
            )
        try:
            value = load_yaml_text(raw) if raw.strip() else ""
        except yaml.YAMLError:
            value = raw
        node = tree
        parts = key.split(".")
        for part in parts[:-1]:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise UsageError(f"--set {key!r} conflicts with another --set of {part!r}")
        node[parts[-1]] = value
    return tree


def _merge(base: dict, over: dict) -> dict:
    out = dict(base)
    for key, value in over.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _merge(out[key], value)
        else:
            out[key] = value
    return out


def load_profile(spec: str, overrides: dict | None = None) -> ClusterProfile:
    path = _resolve(spec, PROFILES_DIR, "cluster profile")
    data = _merge(read_yaml(path, "cluster profile"), overrides or {})
    if data.get("local_cluster") is True and "network_interface" not in (overrides or {}):
        # The local cluster started without its node network (no namespaces here): its nodes
        # share the loopback, and a job must use it, whatever interface the profile names.
        from hpcdp import cluster

        if cluster.network_mode() == "loopback":
            data["network_interface"] = "lo"
    return build(ClusterProfile, data, "cluster")


def load_experiment(spec: str, overrides: dict | None = None) -> Experiment:
    path = _resolve(spec, EXPERIMENTS_DIR, "experiment", {
        PUBLISHED_FIGURES: "the published figures `hpcdp forecast` is checked against",
        PUBLISHED_SERIES: "the published series `hpcdp forecast` is checked against"})
    data = _merge(read_yaml(path, "experiment"), overrides or {})
    data.setdefault("name", path.stem)
    experiment = build(Experiment, data, "")
    check_corpus(experiment.data.corpus)
    check_init_from(experiment)
    return experiment


NAMED_CORPORA = ("shakespeare", "fortunes", "synthetic")
CORPUS_FOLDER_KINDS = ".txt/.md/.jsonl/.parquet"
CORPUS_FILE_KINDS = "a .txt/.md file, a .json list of strings, a .jsonl or a .parquet file"


def check_corpus(spec: str) -> None:
    """data.corpus names a corpus or an existing path: checked where every way in loads the
    experiment, so a typo is one line before a job is queued, not a FAILED job after the queue
    (train/corpora.py reads the files and checks their kinds)."""
    if spec in NAMED_CORPORA or Path(spec).expanduser().exists():
        return
    raise UsageError(
        f"data.corpus {spec!r} is not a named corpus{did_you_mean(spec, NAMED_CORPORA)} and no "
        f"such file or folder exists; valid: {', '.join(NAMED_CORPORA)}, {CORPUS_FILE_KINDS}, "
        f"or a folder of {CORPUS_FOLDER_KINDS} files")


def check_init_from(experiment: Experiment) -> None:
    """model.init_from must be a GPT-2 folder of this experiment's shape: every way in (submit,
    compare, run, python -m train) loads the experiment here, so a mismatch is one line before
    anything is queued or started."""
    folder = experiment.model.init_from
    if not folder:
        return
    where = f"model.init_from {folder!r}"
    try:
        found = json.loads((Path(folder).expanduser() / "config.json").read_text())
    except (OSError, ValueError):
        raise UsageError(f"{where} holds no readable config.json: give a transformers GPT-2 "
                         "folder (`hpcdp export RUN_DIR --to DIR` writes one)") from None
    n_layer, n_embd, n_head, _ = MODEL_PRESETS[experiment.model.preset]
    fixed = {"bytes": 256, "gpt2": 50257}.get(experiment.data.tokenizer)
    wanted = {"model_type": "gpt2", "n_layer": n_layer, "n_embd": n_embd, "n_head": n_head,
              "n_positions": model_context(experiment.model.preset, experiment.train.seq_len),
              "vocab_size": fixed or experiment.data.vocab_size}
    differ = [f"{k} {found.get(k)!r} (the experiment's {v!r})" for k, v in wanted.items()
              if v is not None and found.get(k) != v]
    if differ:
        raise UsageError(f"{where} does not match this experiment: {', '.join(differ)}; start "
                         "from a model of model.preset and data.tokenizer's shape")


def split_overrides(pairs: list[str]) -> tuple[dict, dict]:
    """Split `--set` pairs into (cluster overrides, experiment overrides).

    `cluster.X=...` goes to the profile; `model.`, `data.`, `train.`, `matrix.`, `name` and
    `description` go to the experiment; anything else names the valid sections.
    """
    tree = parse_overrides(pairs)
    cluster = tree.pop("cluster", {})
    experiment_keys = [f.name for f in dataclasses.fields(Experiment)]
    for key in tree:
        if key not in experiment_keys:
            valid = ["cluster", *experiment_keys]
            raise UsageError(
                f"--set {key}...: unknown section {key!r}{did_you_mean(key, valid)}; "
                f"valid: {', '.join(valid)}"
            )
    if not isinstance(cluster, dict):
        raise UsageError("--set cluster=...: set one field, e.g. cluster.partition=gpu")
    return cluster, tree


def as_dict(obj: Any) -> dict:
    """A plain dict (for JSON records and checkpoints)."""
    return dataclasses.asdict(obj)
