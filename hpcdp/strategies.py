"""The six data-parallel strategies of the paper, as data.

This is the only place that knows strategy names. Six names map to four mechanisms; the "-apex"
suffix is precision (mixed), not a mechanism. Everything else (templates, train/, harvest) asks a
`Strategy` for its fields and never compares names.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from hpcdp.errors import UsageError, did_you_mean

Mechanism = Literal["single", "data_parallel", "ddp", "horovod"]
# How processes start. "one-per-node": one process that sees every device of its node;
# "one-per-device": one process per GPU (per CPU rank on CPU nodes), started by srun.
Launch = Literal["one-per-node", "one-per-device"]


@dataclass(frozen=True, kw_only=True)
class Strategy:
    name: str
    """Canonical name, used in file names, metrics and tables."""
    paper_name: str
    """What the paper (arXiv 2206.06356) called it."""
    mechanism: Mechanism
    """Which train/strategies module implements it."""
    launch: Launch
    mixed_precision: bool
    """True for the "-apex" variants: autocast + GradScaler (or legacy apex.amp)."""
    max_nodes: int | None
    """None: any node count. 1: the strategy cannot span nodes."""
    uses_all_node_devices: bool = False
    """The single process drives every GPU of its node (DataParallel)."""
    template: str
    """The launch family in templates/ that renders its sbatch script."""
    local_launcher: Literal["python", "torchrun", "horovodrun"]
    """How `hpcdp run` starts it on this machine without Slurm."""
    aliases: tuple[str, ...] = ()

    @property
    def needs_horovod(self) -> bool:
        return self.mechanism == "horovod"

    def tasks_per_node(self, devices_per_node: int) -> int:
        """Processes Slurm starts on each node, given GPUs (or CPU ranks) per node."""
        return devices_per_node if self.launch == "one-per-device" else 1

    def gpus_per_node(self, gpus_on_node: int) -> int:
        """GPUs the job asks for on each node."""
        if gpus_on_node == 0:
            return 0
        if self.mechanism == "single":
            return 1
        return gpus_on_node

    def check_nodes(self, nodes: int) -> None:
        if nodes < 1:
            raise UsageError(f"--nodes {nodes}: the number of nodes must be 1 or more")
        if self.max_nodes is not None and nodes > self.max_nodes:
            multi = ", ".join(s.name for s in STRATEGIES if s.max_nodes is None)
            raise UsageError(
                f"strategy {self.name!r} runs on {self.max_nodes} node only, not {nodes}; "
                f"strategies that span nodes: {multi}"
            )


STRATEGIES: tuple[Strategy, ...] = (
    Strategy(
        name="single-gpu",
        paper_name="Single GPU",
        mechanism="single",
        launch="one-per-node",
        mixed_precision=False,
        max_nodes=1,
        template="single.sbatch.j2",
        local_launcher="python",
        aliases=("single",),
    ),
    Strategy(
        name="single-ps",
        paper_name="Single Parameter Server (DataParallel)",
        mechanism="data_parallel",
        launch="one-per-node",
        mixed_precision=False,
        max_nodes=1,
        uses_all_node_devices=True,
        template="single.sbatch.j2",
        local_launcher="python",
        aliases=("dp", "sps"),
    ),
    Strategy(
        name="distributed-ps",
        paper_name="Distributed Parameter Server (DistributedDataParallel)",
        mechanism="ddp",
        launch="one-per-device",
        mixed_precision=False,
        max_nodes=None,
        template="srun.sbatch.j2",
        local_launcher="torchrun",
        aliases=("ddp", "dps"),
    ),
    Strategy(
        name="horovod",
        paper_name="Horovod",
        mechanism="horovod",
        launch="one-per-device",
        mixed_precision=False,
        max_nodes=None,
        template="horovod.sbatch.j2",
        local_launcher="horovodrun",
        aliases=("hvd",),
    ),
    Strategy(
        name="distributed-ps-apex",
        paper_name="Distributed Parameter Server + Apex (mixed precision)",
        mechanism="ddp",
        launch="one-per-device",
        mixed_precision=True,
        max_nodes=None,
        template="srun.sbatch.j2",
        local_launcher="torchrun",
        aliases=("ddp-apex", "dps-apex", "ddp-amp"),
    ),
    Strategy(
        name="horovod-apex",
        paper_name="Horovod + Apex (mixed precision)",
        mechanism="horovod",
        launch="one-per-device",
        mixed_precision=True,
        max_nodes=None,
        template="horovod.sbatch.j2",
        local_launcher="horovodrun",
        aliases=("hvd-apex", "horovod-amp"),
    ),
)

# The reference every speed-up is measured against (the paper's baseline).
BASELINE = STRATEGIES[0]
assert BASELINE.name == "single-gpu"

_BY_NAME = {s.name: s for s in STRATEGIES} | {a: s for s in STRATEGIES for a in s.aliases}
NAMES = tuple(s.name for s in STRATEGIES)


def get(name: str) -> Strategy:
    """The strategy called `name` (or one of its aliases); a UsageError naming the choices."""
    try:
        return _BY_NAME[str(name).strip().lower()]
    except KeyError:
        raise UsageError(
            f"unknown strategy {name!r}{did_you_mean(name, _BY_NAME)}; "
            f"valid: {', '.join(NAMES)} (aliases: dp, ddp, ddp-apex)"
        ) from None
