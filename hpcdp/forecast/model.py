"""The forecast's model, pure (no files, no Slurm, no torch), as harvest/stats.py is: the state
each strategy holds per rank, the network's alpha-beta costs, what one optimizer step sends and
which part of it compute can hide (Comm), and a measured step split into compute and window.
hpcdp/forecast/__init__.py explains the model as a whole."""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

from hpcdp import strategies as registry

DDP_BUCKET_BYTES = 25 << 20  # DistributedDataParallel(bucket_cap_mb=25)
DDP_FIRST_BUCKET_BYTES = 1 << 20  # torch.distributed._DEFAULT_FIRST_BUCKET_BYTES
HOROVOD_FUSION_BYTES = 64 << 20  # HOROVOD_FUSION_THRESHOLD's default
ADAM_STATE_TENSORS = 2  # exp_avg, exp_avg_sq, each as large as the parameter
ADAM_STEP_BYTES = 4  # AdamW's `step`: one float32 scalar per parameter tensor
TREE_BUSBW_SHARE = 0.9  # NCCL's tuning.cc: a tree reaches 0.9 of the ring's bus bandwidth
OVERLAP_SLOWDOWN = 0.189
"""How much slower compute runs beside a collective on a GPU, whose kernels take SMs and memory
bandwidth from it: 18.9% on average (at most 40%), measured on A100, H100, MI250 and MI210
training GPT and Llama models (Lee et al., "Characterizing Compute-Communication Overlap in
GPU-Accelerated Distributed Deep Learning", arXiv 2507.03114, 2025), against the same compute
with no collective beside it."""
BACKWARD_SHARE = 2 / 3
"""Of forward + backward compute, backward's share by FLOPs (2 of every 3 matmuls): the window
used where the campaign's phases are not recorded."""



# ----------------------------------------------------------------------------------- model state

def gpt2_shapes(n_layer: int, n_embd: int, vocab: int, n_positions: int) -> list[tuple]:
    """GPT2LMHeadModel's parameter shapes in model.parameters() order (the head is tied to the
    token embedding, so it appears once)."""
    d = n_embd
    block = [(d,), (d,), (d, 3 * d), (3 * d,), (d, d), (d,), (d,), (d,), (d, 4 * d), (4 * d,),
             (4 * d, d), (d,)]
    return [(vocab, d), (n_positions, d), *block * n_layer, (d,), (d,)]


def _numel(shape: tuple) -> int:
    return math.prod(shape)


def _chunk0(shape: tuple, ranks: int) -> int:
    """Elements rank 0 holds of a tensor sharded on dim 0 as FSDP2 does it (torch.chunk: pieces
    of ceil(d0 / ranks) rows; rank 0's is the largest)."""
    rows = -(-shape[0] // ranks)
    return min(rows, shape[0]) * _numel(shape[1:])


def _zero1_partition(shapes: list[tuple], ranks: int) -> tuple[list[int], list[int]]:
    """Elements of optimizer state per rank under ZeroRedundancyOptimizer: within each parameter
    group (matrices, then vectors: the loop's two AdamW groups), tensors largest first, each to
    the rank holding the fewest elements so far (torch's _partition_parameters)."""
    sizes = [0] * ranks
    tensors = [0] * ranks
    for group in ([s for s in shapes if len(s) >= 2], [s for s in shapes if len(s) < 2]):
        for shape in sorted(group, key=_numel, reverse=True):
            rank = sizes.index(min(sizes))
            sizes[rank] += _numel(shape)
            tensors[rank] += 1
    return sizes, tensors


def state_bytes(sharding: str, shapes: list[tuple], ranks: int, ranks_per_node: int,
                param_bytes: int = 4) -> float:
    """Parameters, gradients and AdamW state on the rank that holds the most (what hpcdp's
    `state per rank` measures: train/memory.py)."""
    n_tensors = len(shapes)
    total = sum(_numel(s) for s in shapes)
    if sharding in ("full", "in-node"):
        group = ranks if sharding == "full" else min(ranks, ranks_per_node)
        local = total if group == 1 else sum(_chunk0(s, group) for s in shapes)
        return local * (param_bytes + param_bytes + 4 * ADAM_STATE_TENSORS) \
            + n_tensors * ADAM_STEP_BYTES
    if sharding == "optimizer" and ranks > 1:
        sizes, tensors = _zero1_partition(shapes, ranks)
        rank = max(range(ranks), key=lambda r: sizes[r])
        return total * 2 * param_bytes + sizes[rank] * 4 * ADAM_STATE_TENSORS \
            + tensors[rank] * ADAM_STEP_BYTES
    return total * (2 * param_bytes + 4 * ADAM_STATE_TENSORS) + n_tensors * ADAM_STEP_BYTES



# ------------------------------------------------------------------------------------- network

@dataclass(frozen=True)
class Network:
    """Alpha-beta figures per level: latency per ring step (s) and bus bandwidth (bytes/s)."""

    intra_lat_s: float
    intra_busbw: float
    inter_lat_s: float
    inter_busbw: float
    spread: float = 0.0
    """Relative uncertainty of a collective's time (the fit's residuals, the start/end drift)."""
    source: str = ""
    max_bytes: float | None = None
    """Largest message the figures were measured at (None: given, not measured)."""
    max_nodes: int | None = None
    """Most nodes a probe spanned (None: given)."""
    residuals: tuple = ()
    """(bytes, relative residual) of every probe point, for the table's fit line."""
    notes: tuple = ()
    library: str = "nccl"
    """Whose algorithms: "nccl" (rings, factors as nccl-tests gives them, and for an
    all-reduce across nodes the tree where NCCL's own cost model prefers it), "mpi" (rings
    only: Horovod's probes on a CPU) or "gloo", whose reduce-scatter costs a whole all-reduce
    and whose broadcast sends the message from the root to every other rank (measured on the
    local cluster: docs/forecast.md)."""

    def collective_s(self, op: str, nbytes: float, ranks: int, nodes: int,
                     calls: int = 1) -> float:
        """One collective of `nbytes` over `ranks` ranks spread on `nodes` nodes, issued as
        `calls` messages (buckets, FSDP units)."""
        return self.collective(op, nbytes, ranks, nodes, calls)[0]

    def collective(self, op: str, nbytes: float, ranks: int, nodes: int, calls: int = 1
                   ) -> tuple[float, float, str]:
        """(seconds, of which latency, algorithm) of collective_s's collective. The algorithm
        is "ring", or "tree" for an NCCL all-reduce across nodes where NCCL would choose it: its
        latency grows with log2 of the nodes rather than with the nodes, its bandwidth is
        0.9 x the bus bandwidth at half the ring's bytes per step (NVIDIA/nccl
        src/graph/tuning.cc: tree busBw x .9, algorithm bandwidth busBw x .5; latency
        2 x ((ranks per node - 1) x intra + log2(nodes) x inter))."""
        ring = self._ring(op, nbytes, ranks, nodes, calls)
        if self.library != "nccl" or op != "all_reduce" or nodes < 2 or ranks <= 1 \
                or nbytes <= 0:
            return (*ring, "ring")
        per_node = max(1, ranks // nodes)
        latency = calls * 2 * ((per_node - 1) * self.intra_lat_s
                               + math.ceil(math.log2(nodes)) * self.inter_lat_s)
        tree = latency + nbytes * 2 / (TREE_BUSBW_SHARE * self.inter_busbw)
        return (tree, latency, "tree") if tree < ring[0] else (*ring, "ring")

    def _ring(self, op: str, nbytes: float, ranks: int, nodes: int, calls: int
              ) -> tuple[float, float]:
        """(seconds, of which latency) over rings (and gloo's own broadcast)."""
        if ranks <= 1 or nbytes <= 0:
            return 0.0, 0.0
        n = ranks
        gloo = self.library == "gloo"
        if gloo and op == "reduce_scatter":
            op = "all_reduce"
        all_reduce = op == "all_reduce"
        steps = 2 * (n - 1) if all_reduce else n - 1
        inter_steps = 0 if nodes <= 1 else (2 if all_reduce else 1) * (nodes - 1)
        factor = {"all_reduce": 2 * (n - 1) / n, "all_gather": (n - 1) / n,
                  "reduce_scatter": (n - 1) / n, "broadcast": 1.0}[op]
        if gloo and op == "broadcast":
            # The root sends to each rank itself: one step, and one copy of the message over
            # its link per rank on the other nodes (through memory within its node).
            steps, inter_steps = 1, int(nodes > 1)
            factor = n - n // nodes if nodes > 1 else n - 1
        latency = (steps - inter_steps) * self.intra_lat_s + inter_steps * self.inter_lat_s
        busbw = self.inter_busbw if nodes > 1 else self.intra_busbw
        return calls * latency + nbytes * factor / busbw, calls * latency



# ------------------------------------------------------------------------- the slowest of N ranks

@functools.cache
def expected_max_normal(n: int) -> float:
    """E[max of n independent standard normals]: 0 for one, 0.564 for two, 1.424 for 8,
    2.595 for 128 (a numerical integral of x n phi(x) Phi(x)^(n-1) over +-8 sigma)."""
    if n <= 1:
        return 0.0
    dx, total = 0.01, 0.0  # the midpoint rule on this smooth integrand: 1e-13 from dx = 0.002
    for i in range(-800, 800):
        x = (i + 0.5) * dx
        pdf = math.exp(-x * x / 2) / math.sqrt(2 * math.pi)
        total += x * n * pdf * (0.5 * (1 + math.erf(x / math.sqrt(2)))) ** (n - 1) * dx
    return total


def straggler_s(work_s: float, spread: float | None, ranks: int, fitted_ranks: int) -> float:
    """What waiting for the slowest of `ranks` adds to a step beyond what the fit's
    `fitted_ranks` already waited for: every rank's work varies by `spread` (a share of
    `work_s`, one standard deviation) from step to step, every rank waits for the slowest, and
    the slowest of N lies sigma x E[max of N] above the mean, which grows with N."""
    if not spread:
        return 0.0
    return spread * work_s * (expected_max_normal(ranks) - expected_max_normal(fitted_ranks))


# ---------------------------------------------------------------------------- what a step sends

@dataclass(frozen=True)
class Model:
    """What the collectives carry: parameter elements, in which dtypes, over how many units."""

    n_params: int
    grad_bytes: int
    """Bytes of gradient per rank per optimizer step, in train.grad_comm's precision."""
    param_gather_bytes: int
    """Bytes of parameters gathered (FSDP: in the compute dtype under mixed precision)."""
    units: int
    """FSDP units (the blocks and the root)."""
    block_share: float
    """Share of the parameters in the blocks (gathered again for backward under ZeRO-3)."""
    tensors: int = 0
    """Parameter tensors (ZeRO-1 broadcasts each on its own); 0: one per unit."""


@dataclass(frozen=True)
class Comm:
    """Seconds of one optimizer step's collectives, by what compute can hide.

    - overlapped: sent while compute runs (DDP's and Horovod's gradient buckets during backward,
      FSDP's prefetched gathers and its reduce-scatters behind the next unit's backward);
    - tail: the part of those no compute can hide, as the schedule leaves nothing to run beside
      it: the last gradient bucket, ready only when backward ends; FSDP's first gather (before
      any compute) and its last reduce-scatter (after backward);
    - serial: outside every compute window: ZeRO-1's parameter broadcast after the optimizer
      step, and every FSDP collective on a device without streams (CPU), where FSDP2 issues
      them synchronously (unshard_async_op is False by default), so each blocks its rank.
    """

    overlapped: float = 0.0
    tail: float = 0.0
    serial: float = 0.0
    slowdown: float = 0.0
    """How much slower compute runs while an overlapped collective runs beside it
    (OVERLAP_SLOWDOWN on a GPU; 0 where nothing runs beside compute)."""

    @property
    def total(self) -> float:
        return self.overlapped + self.tail + self.serial

    def interference(self, window: float, scale: float = 1.0) -> float:
        """What hiding costs: the compute that ran beside the overlapped collectives (as much
        of them as the window holds) runs `slowdown` slower."""
        return self.slowdown * min(scale * self.overlapped, window)

    def exposed(self, window: float, scale: float = 1.0) -> float:
        """What the step spends on communication beyond compute when `window` seconds of
        compute can hide the overlapped part: the part it waits for, and what hiding the rest
        slowed compute by (`scale`: the network's figures scaled, for the interval)."""
        return (scale * (self.tail + self.serial) + max(0.0, scale * self.overlapped - window)
                + self.interference(window, scale))


def _last_bucket(grad_bytes: int, bucket: int, first: int) -> int:
    """Bytes in the last gradient bucket: DDP fills its first bucket to `first` bytes
    (torch's 1 MiB first bucket), then buckets of `bucket` bytes, in reverse parameter order;
    the last one sent holds the first layers and the embedding, ready when backward ends."""
    if grad_bytes <= first:
        return grad_bytes
    rest = (grad_bytes - first) % bucket
    return rest or bucket


def comm_terms(spec: registry.StrategySpec, model: Model, net: Network, nodes: int,
               ranks_per_node: int, reshard_after_forward: bool = True,
               streams: bool = True, shard_group: int | None = None) -> Comm:
    """One optimizer step's collectives at `nodes` x `ranks_per_node` ranks, as Comm's three
    terms (`streams`: the device runs collectives beside compute: a GPU, not a CPU;
    `shard_group`: fully sharded strategies shard over that many ranks and replicate beyond,
    as HSDP does over a node; None: over all)."""
    n = nodes * ranks_per_node
    g, p = model.grad_bytes, model.param_gather_bytes
    if spec.sharding in ("full", "in-node"):
        group = min(n, ranks_per_node if spec.sharding == "in-node" else shard_group or n)
        group_nodes, replicas = max(1, group // ranks_per_node), n // group
        gathers = 1 + (model.block_share if reshard_after_forward else 0.0)
        gather = net.collective_s("all_gather", p * gathers, group, group_nodes,
                                  calls=model.units * 2)
        scatter = net.collective_s("reduce_scatter", g, group, group_nodes, calls=model.units)
        if replicas > 1:  # each shard all-reduced across its replicas, one per node or more
            scatter += net.collective_s("all_reduce", g / group, replicas, replicas,
                                        calls=model.units)
        if not streams:
            return Comm(serial=gather + scatter)
        # The first unit's gather (the root: embeddings; and the first block) and the last
        # reduce-scatter (the same units' gradients) have no compute beside them.
        edge = (1 - model.block_share) + model.block_share / max(1, model.units - 1)
        tail = (net.collective_s("all_gather", p * edge, group, group_nodes, calls=2)
                + net.collective_s("reduce_scatter", g * edge, group, group_nodes, calls=2))
        return Comm(overlapped=max(0.0, gather + scatter - tail), tail=tail,
                    slowdown=OVERLAP_SLOWDOWN)
    bucket = HOROVOD_FUSION_BYTES if spec.transport == "horovod" else DDP_BUCKET_BYTES
    calls = max(1, math.ceil(g / bucket))
    reduce = net.collective_s("all_reduce", g, n, nodes, calls=calls)
    if spec.transport == "horovod":  # what backward produces last waits for the next cycle
        last = int(g * ((1 - model.block_share) + model.block_share / max(1, model.units - 1)))
    else:
        last = _last_bucket(g, bucket, DDP_FIRST_BUCKET_BYTES)
    tail = min(reduce, net.collective_s("all_reduce", last, n, nodes))
    serial = 0.0
    if spec.sharding == "optimizer":
        # ZeroRedundancyOptimizer.step: each rank updates its partition, then every parameter
        # is broadcast from its owner, one call per tensor (parameters_as_bucket_view=False).
        serial = net.collective_s("broadcast", p, n, nodes, calls=model.tensors or model.units)
    return Comm(overlapped=reduce - tail, tail=tail, serial=serial,
                slowdown=OVERLAP_SLOWDOWN if streams else 0.0)


class _LatencyOnly:
    """A Network whose collectives cost only their latency: comm_terms through it gives the
    latency part of each term, under the algorithm the whole collective takes."""

    def __init__(self, net: Network) -> None:
        self.net = net

    def collective_s(self, op: str, nbytes: float, ranks: int, nodes: int,
                     calls: int = 1) -> float:
        return self.net.collective(op, nbytes, ranks, nodes, calls)[1]


def latency_s(spec: registry.StrategySpec, model: Model, net: Network, nodes: int,
              ranks_per_node: int, reshard_after_forward: bool = True,
              streams: bool = True, shard_group: int | None = None) -> float:
    """Of one optimizer step's collectives (comm_terms' total), the seconds that are latency:
    the part that grows with the ring's steps (or a tree's depth), not with the bytes."""
    return comm_terms(spec, model, _LatencyOnly(net), nodes, ranks_per_node,  # type: ignore
                      reshard_after_forward, streams, shard_group).total


def comm_s(spec: registry.StrategySpec, model: Model, net: Network, nodes: int,
           ranks_per_node: int, reshard_after_forward: bool = True) -> float:
    """Seconds of collectives one optimizer step issues, none hidden."""
    return comm_terms(spec, model, net, nodes, ranks_per_node, reshard_after_forward).total



def split_step(step: float, comm: Comm, exposed: float | None, share: float
               ) -> tuple[float, float]:
    """(compute, window) of a measured step, such that compute + comm.exposed(window) gives the
    step back. Exposed communication measured (the gradient all-reduce's: DDP's buckets,
    Horovod's synchronize) and above zero: the window is what the step hid of the overlapped
    collectives. Otherwise (FSDP, or all of it hid): the compute c for which
    c + comm.exposed(share x c) is the step."""
    if exposed and comm.overlapped + comm.tail > 0:
        # Some was exposed: the window is what hid. Exposed beyond the modelled collectives (a
        # CPU's threads competing, a slow collective the model does not explain) stays in the
        # step as measured, at every N.
        window = max(0.0, comm.overlapped + comm.tail - exposed)
        return max(step - comm.exposed(window), 1e-9), window
    # Not measured, or nothing exposed (all of it hid): the window is the phases' share.
    base = step - comm.serial - comm.tail
    hid = base - comm.slowdown * comm.overlapped  # all of it hid, slowing compute beside it
    if comm.overlapped <= share * hid or share >= 1:
        compute = max(hid, 1e-9)
    else:  # comm beyond the window is exposed; the window's compute ran slowed
        compute = max((base - comm.overlapped) / (1 - share * (1 - comm.slowdown)),
                      0.1 * step)
    return compute, share * compute
