"""The data-parallel strategies, as data: one StrategySpec each.

This is the only place that knows strategy names. The paper's six names map to four
implementations; the "-apex" suffix is precision (mixed), not an implementation. Four more go
beyond the paper: the sharded forms of data parallelism (FSDP2 as ZeRO-3/2, its mixed-precision
form, HSDP, ZeRO-1). Everything else (templates, train/,
harvest, the CLI and the demo) reads a spec's fields and never compares names. Adding a
strategy is one entry here plus its implementation, one file under train/strategies/: hpcdp/
names that class as a string, so it never imports torch.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Literal

from hpcdp.errors import UsageError, did_you_mean

# How processes start. "one-per-node": one process that drives one device, or every device of
# its node (uses_all_node_devices); "one-per-device": one process per GPU (per CPU rank on
# CPU nodes), started by srun.
Launch = Literal["one-per-node", "one-per-device"]
# What carries gradients between processes: torch.distributed (DDP, FSDP, ZeRO: they share
# torchrun's launch and one network probe per campaign), Horovod, or nothing (one process).
Transport = Literal["none", "torch", "horovod"]
TEMPLATES: dict[str, str] = {"one-per-node": "single.sbatch.j2",
                             "one-per-device": "per_device.sbatch.j2"}
"""The launch family in templates/ that renders each kind of launch."""


@dataclass(frozen=True, kw_only=True)
class StrategySpec:
    """One strategy's record: every fact the renderer, the trainer, the docs and the demo use.
    (The runtime object that trains is train.strategies.Strategy, built from `implementation`.)
    """

    name: str
    """Canonical name, used in file names, metrics and tables."""
    paper_name: str
    """What the paper (arXiv 2206.06356) called it."""
    implementation: str
    """"module:Class" of its train.strategies.Strategy subclass (imported only by train/)."""
    launch: Launch
    mixed_precision: bool
    """True for the "-apex" variants: autocast + GradScaler (or legacy apex.amp)."""
    max_nodes: int | None
    """None: any node count. 1: the strategy cannot span nodes."""
    uses_all_node_devices: bool = False
    """The single process drives every GPU of its node (DataParallel)."""
    local_launcher: Literal["python", "torchrun", "horovodrun"]
    """How `hpcdp run` starts it on this machine without Slurm."""
    needs_horovod: bool = False
    """Horovod must be installed where it runs (preflight checks it; the template uses it)."""
    transport: Transport = "none"
    in_paper: bool = True
    """One of the paper's six; False: beyond the paper (the sharded strategies)."""
    min_tasks_per_node: int = 1
    """Processes a node must hold (HSDP shards within a node: 2)."""
    aliases: tuple[str, ...] = ()
    shards_state_of: str | None = None
    """The unsharded strategy whose replicated state this one shards (fsdp: distributed-ps):
    harvest's verdict states its memory per rank and throughput against that one's."""
    grad_comm: tuple[str, ...] = ()
    """Precisions it can send gradients in (train.grad_comm); empty: gradients never travel
    between processes (one process, or DataParallel inside it), so the setting does not apply."""
    sharding: Literal["replicated", "optimizer", "full", "in-node"] = "replicated"
    """What each rank holds of the model state, and so what it sends per step (hpcdp/forecast/):
    replicated (every rank the whole state; gradients all-reduced), optimizer (ZeRO-1: the
    optimizer state sharded, updated parameters gathered after the step), full (FSDP: all of it
    sharded, parameters gathered for forward and backward, gradients reduce-scattered), in-node
    (HSDP: sharded over a node's ranks, the shard's gradients all-reduced across nodes)."""

    @property
    def sharded_checkpoints(self) -> bool:
        """Every rank saves its shard (torch.distributed.checkpoint, a .dcp folder) where the
        parameters are sharded; otherwise rank 0 writes the whole state to one .pt file (ZeRO-1
        gathers its optimizer shards first). The trainer and --resume-from both ask here."""
        return self.sharding in ("full", "in-node")

    def check_grad_comm(self, grad_comm: str) -> None:
        if self.grad_comm and grad_comm not in self.grad_comm:
            raise UsageError(f"train.grad_comm {grad_comm!r}: {self.name} sends gradients in "
                             f"{', '.join(self.grad_comm)} only")

    @property
    def mechanism(self) -> str:
        """The implementation's module name (single, data_parallel, ddp, horovod): the
        metrics header's `mechanism`."""
        return self.implementation.partition(":")[0].rpartition(".")[2]

    @property
    def template(self) -> str:
        return TEMPLATES[self.launch]

    def tasks_per_node(self, devices_per_node: int) -> int:
        """Processes Slurm starts on each node, given GPUs (or CPU ranks) per node."""
        return devices_per_node if self.launch == "one-per-device" else 1

    def gpus_per_node(self, gpus_on_node: int) -> int:
        """GPUs the job asks for on each node."""
        if self.launch == "one-per-node" and not self.uses_all_node_devices:
            return min(1, gpus_on_node)
        return gpus_on_node

    def replicas_per_node(self, gpus_on_node: int, devices_per_node: int) -> int:
        """Data-parallel replicas on each node: one per process, or DataParallel's GPUs."""
        if self.uses_all_node_devices:
            return max(1, gpus_on_node)
        return self.tasks_per_node(devices_per_node)

    def check_tasks_per_node(self, tasks: int) -> None:
        if tasks < self.min_tasks_per_node:
            raise UsageError(
                f"strategy {self.name!r} needs {self.min_tasks_per_node} or more processes per "
                f"node (it shards within a node and replicates across nodes), not {tasks}; "
                "give nodes more GPUs (cluster.gpus_per_node) or CPU ranks "
                "(cluster.cpu_ranks_per_node), or use fsdp")

    def check_nodes(self, nodes: int) -> None:
        if nodes < 1:
            raise UsageError(f"--nodes {nodes}: the number of nodes must be 1 or more")
        if self.max_nodes is not None and nodes > self.max_nodes:
            multi = ", ".join(s.name for s in STRATEGIES if s.max_nodes is None)
            raise UsageError(
                f"strategy {self.name!r} runs on {self.max_nodes} node only, not {nodes}; "
                f"strategies that span nodes: {multi}"
            )


STRATEGIES: tuple[StrategySpec, ...] = (
    StrategySpec(
        name="single-gpu",
        paper_name="Single GPU",
        implementation="train.strategies.single:SingleStrategy",
        launch="one-per-node",
        mixed_precision=False,
        max_nodes=1,
        local_launcher="python",
        aliases=("single",),
    ),
    StrategySpec(
        name="single-ps",
        paper_name="Single Parameter Server (DataParallel)",
        implementation="train.strategies.data_parallel:DataParallelStrategy",
        launch="one-per-node",
        mixed_precision=False,
        max_nodes=1,
        uses_all_node_devices=True,
        local_launcher="python",
        aliases=("dp", "sps"),
    ),
    StrategySpec(
        name="distributed-ps",
        paper_name="Distributed Parameter Server (DistributedDataParallel)",
        implementation="train.strategies.ddp:DDPStrategy",
        launch="one-per-device",
        mixed_precision=False,
        max_nodes=None,
        local_launcher="torchrun",
        transport="torch",
        grad_comm=("fp32", "bf16", "fp16"),
        aliases=("ddp", "dps"),
    ),
    StrategySpec(
        name="horovod",
        paper_name="Horovod",
        implementation="train.strategies.horovod:HorovodStrategy",
        launch="one-per-device",
        mixed_precision=False,
        max_nodes=None,
        local_launcher="horovodrun",
        transport="horovod",
        # Horovod compresses to fp16 only (hvd.Compression.fp16; its ops take no bfloat16).
        grad_comm=("fp32", "fp16"),
        needs_horovod=True,
        aliases=("hvd",),
    ),
    StrategySpec(
        name="distributed-ps-apex",
        paper_name="Distributed Parameter Server + Apex (mixed precision)",
        implementation="train.strategies.ddp:DDPStrategy",
        launch="one-per-device",
        mixed_precision=True,
        max_nodes=None,
        local_launcher="torchrun",
        transport="torch",
        grad_comm=("fp32", "bf16", "fp16"),
        aliases=("ddp-apex", "dps-apex", "ddp-amp"),
    ),
    StrategySpec(
        name="horovod-apex",
        paper_name="Horovod + Apex (mixed precision)",
        implementation="train.strategies.horovod:HorovodStrategy",
        launch="one-per-device",
        mixed_precision=True,
        max_nodes=None,
        local_launcher="horovodrun",
        transport="horovod",
        # Horovod compresses to fp16 only (hvd.Compression.fp16; its ops take no bfloat16).
        grad_comm=("fp32", "fp16"),
        needs_horovod=True,
        aliases=("hvd-apex", "horovod-amp"),
    ),
    # Beyond the paper: the sharded forms of data parallelism (docs/strategies.md).
    StrategySpec(
        name="fsdp",
        paper_name="- (beyond the paper: FSDP2, ZeRO-3 or ZeRO-2)",
        implementation="train.strategies.fsdp:FSDPStrategy",
        launch="one-per-device",
        mixed_precision=False,
        max_nodes=None,
        local_launcher="torchrun",
        sharding="full",
        transport="torch",
        in_paper=False,
        grad_comm=("fp32", "bf16", "fp16"),
        shards_state_of="distributed-ps",
        aliases=("fsdp2",),
    ),
    StrategySpec(
        name="fsdp-apex",
        paper_name="- (beyond the paper: FSDP2 + mixed precision)",
        implementation="train.strategies.fsdp:FSDPStrategy",
        launch="one-per-device",
        mixed_precision=True,
        max_nodes=None,
        local_launcher="torchrun",
        sharding="full",
        transport="torch",
        in_paper=False,
        grad_comm=("fp32", "bf16", "fp16"),
        shards_state_of="distributed-ps-apex",
        aliases=("fsdp-amp", "fsdp2-amp"),
    ),
    StrategySpec(
        name="hsdp",
        paper_name="- (beyond the paper: FSDP2 sharded in a node, replicated across nodes)",
        implementation="train.strategies.fsdp:HSDPStrategy",
        launch="one-per-device",
        mixed_precision=False,
        max_nodes=None,
        local_launcher="torchrun",
        sharding="in-node",
        transport="torch",
        in_paper=False,
        min_tasks_per_node=2,
        grad_comm=("fp32", "bf16", "fp16"),
        shards_state_of="distributed-ps",
        aliases=("hybrid-shard",),
    ),
    StrategySpec(
        name="zero1",
        paper_name="- (beyond the paper: ZeRO-1, DDP + ZeroRedundancyOptimizer)",
        implementation="train.strategies.zero:ZeroStrategy",
        launch="one-per-device",
        mixed_precision=False,
        max_nodes=None,
        local_launcher="torchrun",
        sharding="optimizer",
        transport="torch",
        in_paper=False,
        grad_comm=("fp32", "bf16", "fp16"),
        shards_state_of="distributed-ps",
        aliases=("zero-1", "zero"),
    ),
)

# The reference every speed-up is measured against (the paper's baseline).
BASELINE = STRATEGIES[0]
assert BASELINE.name == "single-gpu"

_BY_NAME: dict[str, StrategySpec] = {}
NAMES: tuple[str, ...] = ()
PAPER_NAMES: tuple[str, ...] = ()
"""The paper's six: an experiment's matrix when it names none."""


def _index() -> None:
    global _BY_NAME, NAMES, PAPER_NAMES
    _BY_NAME = {s.name: s for s in STRATEGIES} | {a: s for s in STRATEGIES for a in s.aliases}
    NAMES = tuple(s.name for s in STRATEGIES)
    PAPER_NAMES = tuple(s.name for s in STRATEGIES if s.in_paper)


_index()


def alias_hint() -> str:
    """'dp, ddp, ...': every alias, for help texts and errors."""
    return ", ".join(a for s in STRATEGIES for a in s.aliases)


def get(name: str) -> StrategySpec:
    """The strategy called `name` (or one of its aliases); a UsageError naming the choices."""
    try:
        return _BY_NAME[str(name).strip().lower()]
    except KeyError:
        raise UsageError(
            f"unknown strategy {name!r}{did_you_mean(name, _BY_NAME)}; "
            f"valid: {', '.join(NAMES)} (aliases: {alias_hint()})"
        ) from None


def find(name: str) -> StrategySpec | None:
    """The strategy called `name`, or None (harvest reads logs of strategies since renamed)."""
    return _BY_NAME.get(str(name).strip().lower())


@contextlib.contextmanager
def registered(*specs: StrategySpec) -> Iterator[None]:
    """The registry with `specs` added, for the duration of a `with` block (tests, and a
    site that wants to try a strategy of its own before adding it here)."""
    global STRATEGIES
    saved = STRATEGIES
    STRATEGIES = saved + specs
    _index()
    try:
        yield
    finally:
        STRATEGIES = saved
        _index()
