"""`hpcdp forecast`: from one campaign to the scale a user will train on.

For each strategy and precision the campaign ran, the step time at N nodes is

    step(N) = compute + exposed(N),   exposed(N) = max(0, comm(N) - window)

- compute: measured in the campaign (per rank, at its batch per rank): the cell's median step
  time less its measured exposed communication. Weak scaling keeps it; strong scaling (global
  batch fixed) scales it with the micro-steps each rank still runs (flagged where that leaves the
  measured range).
- comm(N): the collectives the strategy issues per optimizer step (`plan`), each costing, as
  NCCL's ring model does (src/graph/tuning.cc; nccl-tests doc/PERFORMANCE.md for the factors):

      latency = (steps - inter_steps) x intra_lat + inter_steps x inter_lat
      time    = calls x latency + bytes x factor(n) / busbw

  steps 2(n-1) for all-reduce and n-1 for all-gather and reduce-scatter, inter_steps 2(nodes-1)
  and nodes-1; factor 2(n-1)/n and (n-1)/n. busbw is the inter-node figure once the ring leaves
  the node, else the intra-node one.
- window: the compute that runs while the collectives are in flight (backward for the gradient
  all-reduce; forward and backward for FSDP's gathers), from the campaign's phases. Where the
  campaign measured communication that compute did not hide, the hidden part (comm - exposed)
  is the window instead: what was measured hidden stays hidden, and no more.
- The network (alpha per ring step, busbw; intra- and inter-node apart) is fitted to the
  campaign's all-reduce probes (every size of their sweep, start and end), or read from the
  target profile's `network:` section.

Memory per rank: parameters, gradients and AdamW state as each strategy shards them (computed
from the model's tensor shapes: FSDP's dim-0 chunks, ZeRO-1's greedy partition, as torch does
them), plus what the campaign measured beyond the state (activations, buffers). Time, GPU-hours
and billing to train `tokens` follow from tokens/s. Every figure carries an interval (the
repeats' spread, the probe fit's residuals and drift) and says where it extrapolates.

No torch: the CLI imports this.
"""

from __future__ import annotations

import json
import math
import statistics
from dataclasses import dataclass, field
from pathlib import Path

from hpcdp import PROJECT_ROOT
from hpcdp import strategies as registry
from hpcdp.config import MODEL_PRESETS, ClusterProfile, NetworkConfig, model_context
from hpcdp.errors import UsageError

DEFAULT_NODES = (1, 2, 4, 8, 16, 32, 64, 128)
TOKENS_PER_PARAM = 20
"""Default training length: 20 tokens per parameter (Hoffmann et al., 2022)."""
DDP_BUCKET_BYTES = 25 << 20  # DistributedDataParallel(bucket_cap_mb=25)
DDP_FIRST_BUCKET_BYTES = 1 << 20  # torch.distributed._DEFAULT_FIRST_BUCKET_BYTES
HOROVOD_FUSION_BYTES = 64 << 20  # HOROVOD_FUSION_THRESHOLD's default
ADAM_STATE_TENSORS = 2  # exp_avg, exp_avg_sq, each as large as the parameter
ADAM_STEP_BYTES = 4  # AdamW's `step`: one float32 scalar per parameter tensor
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


def experiment_shapes(experiment) -> list[tuple]:
    """gpt2_shapes of a loaded experiment's model (its preset, vocabulary and context), without
    transformers: the submit-time memory check and the network probe's gradient size."""
    from hpcdp.estimate import _vocab

    n_layer, n_embd, _, _ = MODEL_PRESETS[experiment.model.preset]
    return gpt2_shapes(n_layer, n_embd, _vocab(experiment),
                       model_context(experiment.model.preset, experiment.train.seq_len))


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
    """Whose algorithms: "nccl" (rings: factors as nccl-tests gives them) or "gloo", whose
    reduce-scatter costs a whole all-reduce and whose broadcast sends the message from the
    root to every other rank (measured on the local cluster: docs/forecast.md)."""

    def collective_s(self, op: str, nbytes: float, ranks: int, nodes: int,
                     calls: int = 1) -> float:
        """One collective of `nbytes` over `ranks` ranks spread on `nodes` nodes, issued as
        `calls` messages (buckets, FSDP units)."""
        if ranks <= 1 or nbytes <= 0:
            return 0.0
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
        return calls * latency + nbytes * factor / busbw


def _fit_line(points: list[tuple[float, float]]) -> tuple[float, float]:
    """Least squares of t = a + b x in relative terms (every size counts alike, 1 KiB as 256
    MiB), a and b kept >= 0; points (x, t)."""
    # Minimise sum(((a + b x) / t - 1)^2): linear in (a, b) with rows (1/t, x/t).
    s11 = sum(1 / t ** 2 for _, t in points)
    s12 = sum(x / t ** 2 for x, t in points)
    s22 = sum(x * x / t ** 2 for x, t in points)
    r1 = sum(1 / t for _, t in points)
    r2 = sum(x / t for x, t in points)
    det = s11 * s22 - s12 * s12
    if det > 0:
        a, b = (r1 * s22 - r2 * s12) / det, (s11 * r2 - s12 * r1) / det
        if a >= 0 and b > 0:
            return a, b
    # Clamped: latency 0 (bandwidth alone), or bandwidth from the largest size
    b0 = r2 / s22 if s22 else 0.0
    if b0 > 0:
        return 0.0, b0
    x, t = max(points)
    return t, 0.0 if x == 0 else t / x


def _probe_points(probe: dict) -> list[tuple[float, float]]:
    sweep = probe.get("sweep") if isinstance(probe.get("sweep"), list) else [probe]
    points = []
    for entry in sweep:
        try:
            nbytes, seconds = float(entry["bytes"]), float(entry["median_s"])
        except (KeyError, TypeError, ValueError):
            continue
        if nbytes > 0 and seconds > 0:
            points.append((nbytes, seconds))
    return points


def fit_network(probes: list[dict], transport: str) -> Network | None:
    """Alpha and busbw from a campaign's probes over `transport` (their `communication`): the
    one-node probes give the intra-node level, the multi-node ones the inter-node level; a level
    no probe measured borrows the other's figures, and says so."""
    mine = [p for p in probes if str(p.get("communication", "")).split("/")[0] == transport]
    levels: dict[str, list] = {"intra": [], "inter": []}
    for probe in mine:
        n, nodes = int(probe.get("world_size") or 0), int(probe.get("nodes") or 1)
        if n < 2:
            continue
        for nbytes, seconds in _probe_points(probe):
            levels["inter" if nodes > 1 else "intra"].append((n, nodes, nbytes, seconds))
    if not levels["intra"] and not levels["inter"]:
        return None
    figures, residuals = {}, []
    for level, rows in levels.items():
        if not rows:
            continue
        # x: bytes x factor; the intercept over the ring's steps is the latency per step
        # (probes with one rank per node: every step crosses nodes on the inter level).
        points = [(b * 2 * (n - 1) / n, t) for n, _, b, t in rows]
        steps = statistics.median(2 * (n - 1) for n, _, _, _ in rows)
        a, b = _fit_line(points)
        figures[level] = (a / steps, 1 / b if b > 0 else math.inf)
        residuals += [(x, (a + b * x) / t - 1) for x, t in points]
    notes = []
    if "inter" not in figures:
        figures["inter"] = figures["intra"]
        notes.append(f"no multi-node probe over {transport}: inter-node figures are the "
                     "intra-node ones")
    if "intra" not in figures:
        figures["intra"] = figures["inter"]
        notes.append(f"no one-node probe over {transport}: intra-node figures are the "
                     "inter-node ones")
    rel = sorted(abs(r) for _, r in residuals)
    spread = rel[min(len(rel) - 1, int(0.9 * len(rel)))] if rel else 0.0
    all_rows = levels["intra"] + levels["inter"]
    return Network(intra_lat_s=figures["intra"][0], intra_busbw=figures["intra"][1],
                   inter_lat_s=figures["inter"][0], inter_busbw=figures["inter"][1],
                   spread=spread, source=f"{len(mine)} probe(s) over {transport}",
                   max_bytes=max(r[2] for r in all_rows),
                   max_nodes=max(r[1] for r in all_rows), residuals=tuple(residuals),
                   notes=tuple(notes), library="gloo" if transport == "gloo" else "nccl")


def network_warnings(profile: ClusterProfile) -> list[str]:
    """The likely mistake in a profile's network figures: an inter-node bus bandwidth below one
    NIC's line rate on a multi-GPU node is one NIC's rate (or a per-GPU figure), where nccl-tests
    over 2+ such nodes reports about the NICs' sum. One line each."""
    from hpcdp import peaks

    net = profile.network
    gpus = net.gpus_per_node or profile.gpus_per_node
    nic = net.nic_gbit or peaks.node_nic_gbit(profile.gpu_type or "")
    if gpus < 2 or not nic or not 0 < net.inter_node_busbw_gbps < nic / 8:
        return []
    return [f"cluster profile {profile.name!r}: network.inter_node_busbw_gbps "
            f"{net.inter_node_busbw_gbps:g} is below one {nic:g} Gb/s NIC's line rate "
            f"({nic / 8:g} GB/s) on nodes of {gpus} GPUs: likely one NIC's rate, not the bus "
            "bandwidth; give the busbw all_reduce_perf prints on 2+ whole nodes (about the NICs' "
            "sum: 331 on 4 x 8 H100 with 8 x 400 Gb/s), or set network.nic_gbit if each node's "
            "NICs are slower (docs/forecast.md#feeding-it-another-cluster)"]


def network_from_profile(net: NetworkConfig, name: str) -> Network:
    """The target profile's `network:` figures (docs/forecast.md says where to find them)."""
    return Network(intra_lat_s=net.intra_node_latency_us * 1e-6,
                   intra_busbw=net.intra_node_busbw_gbps * 1e9,
                   inter_lat_s=net.inter_node_latency_us * 1e-6,
                   inter_busbw=net.inter_node_busbw_gbps * 1e9,
                   source=f"cluster profile {name!r} network section")


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

    @property
    def total(self) -> float:
        return self.overlapped + self.tail + self.serial

    def exposed(self, window: float, scale: float = 1.0) -> float:
        """What the step waits for when `window` seconds of compute can hide the overlapped
        part (`scale`: the network's figures scaled, for the interval)."""
        return scale * (self.tail + self.serial) + max(0.0, scale * self.overlapped - window)


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
               streams: bool = True) -> Comm:
    """One optimizer step's collectives at `nodes` x `ranks_per_node` ranks, as Comm's three
    terms (`streams`: the device runs collectives beside compute: a GPU, not a CPU)."""
    n = nodes * ranks_per_node
    g, p = model.grad_bytes, model.param_gather_bytes
    if spec.sharding in ("full", "in-node"):
        group, group_nodes = (n, nodes) if spec.sharding == "full" else (min(n, ranks_per_node), 1)
        gathers = 1 + (model.block_share if reshard_after_forward else 0.0)
        gather = net.collective_s("all_gather", p * gathers, group, group_nodes,
                                  calls=model.units * 2)
        scatter = net.collective_s("reduce_scatter", g, group, group_nodes, calls=model.units)
        if spec.sharding == "in-node":  # the shard's replicas all-reduced across nodes
            scatter += net.collective_s("all_reduce", g / group, nodes, nodes, calls=model.units)
        if not streams:
            return Comm(serial=gather + scatter)
        # The first unit's gather (the root: embeddings; and the first block) and the last
        # reduce-scatter (the same units' gradients) have no compute beside them.
        edge = (1 - model.block_share) + model.block_share / max(1, model.units - 1)
        tail = (net.collective_s("all_gather", p * edge, group, group_nodes, calls=2)
                + net.collective_s("reduce_scatter", g * edge, group, group_nodes, calls=2))
        return Comm(overlapped=max(0.0, gather + scatter - tail), tail=tail)
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
    return Comm(overlapped=reduce - tail, tail=tail, serial=serial)


def comm_s(spec: registry.StrategySpec, model: Model, net: Network, nodes: int,
           ranks_per_node: int, reshard_after_forward: bool = True) -> float:
    """Seconds of collectives one optimizer step issues, none hidden."""
    return comm_terms(spec, model, net, nodes, ranks_per_node, reshard_after_forward).total


# ----------------------------------------------------------------------------- campaign inputs

@dataclass
class Fit:
    """One (strategy, precision, communication) of the campaign, measured at `nodes`."""

    strategy: str
    precision: str
    communication: str
    nodes: int
    ranks_per_node: int
    step_s: list[float]
    """Median step time of each repeat."""
    exposed_s: float | None
    """Median exposed communication measured (None: not measured)."""
    forward_s: float | None
    backward_s: float | None
    phases_s: float | None
    """Median forward, backward and all-phases seconds per step (None: not recorded)."""
    tokens_per_step: int
    micro_batch: int
    accum: int
    scaling: str
    global_batch: int
    model: Model
    shapes: list[tuple]
    reshard_after_forward: bool
    state_gb: float | None
    peak_gb: float | None
    memory_measured: str | None
    device: str = "cuda"
    """The campaign's device type (its header's `device`): a CPU runs FSDP's collectives
    synchronously (Comm.serial)."""
    measured: dict = field(default_factory=dict)
    """Measured median tokens/s (with range) per node count, for the table and the plot."""


def _median(values):
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def _phases(run_dir: Path) -> tuple[float | None, float | None, float | None]:
    """Median forward, backward and all-phases seconds of the later half of a run's steps."""
    try:
        lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    except OSError:
        return None, None, None
    steps = []
    for line in lines:
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if record.get("kind") == "step" and isinstance(record.get("phases_s"), dict):
            steps.append(record["phases_s"])
    later = steps[len(steps) // 2:]
    total = [sum(v for v in ph.values() if isinstance(v, (int, float))) for ph in later]
    return (_median([ph.get("forward") for ph in later]),
            _median([ph.get("backward") for ph in later]), _median(total))


def _header(run_dir: Path) -> dict:
    try:
        with open(run_dir / "metrics.jsonl") as f:
            record = json.loads(f.readline())
    except (OSError, ValueError):
        return {}
    return record if record.get("kind") == "header" else {}


def model_of(header: dict) -> tuple[Model, list[tuple], bool]:
    """The model's tensor shapes and what its collectives carry, from a run's header."""
    config = header.get("config") or {}
    preset = (config.get("model") or {}).get("preset", "tiny")
    train = config.get("train") or {}
    n_layer, n_embd, _, _ = MODEL_PRESETS[preset]
    seq_len = int(header.get("seq_len") or train.get("seq_len") or 128)
    shapes_no_vocab = gpt2_shapes(n_layer, n_embd, 0, model_context(preset, seq_len))
    n_params = int(header["n_params"])
    vocab = (n_params - sum(_numel(s) for s in shapes_no_vocab)) // n_embd
    shapes = gpt2_shapes(n_layer, n_embd, vocab, model_context(preset, seq_len))
    grad_bytes = header.get("grad_bytes_per_step") or n_params * 4
    mixed = header.get("precision") in ("bf16", "fp16")
    block = sum(_numel(s) for s in shapes[2:-2])
    fsdp = (train.get("fsdp") or {})
    model = Model(n_params=n_params, grad_bytes=int(grad_bytes),
                  param_gather_bytes=n_params * (2 if mixed else 4), units=n_layer + 1,
                  block_share=block / n_params, tensors=len(shapes))
    return model, shapes, bool(fsdp.get("reshard_after_forward", True))


def fits_of(cells, fit_nodes: set[int] | None) -> tuple[list[Fit], list[str]]:
    """One Fit per strategy and precision: its cell at the largest node count allowed."""
    chosen: dict[tuple, object] = {}
    skipped = []
    for cell in cells:
        if not cell.runs or cell.strategy is None or cell.nodes is None:
            continue
        if fit_nodes is not None and cell.nodes not in fit_nodes:
            continue
        key = (cell.strategy, cell.precision, (cell.communication or "").split("/")[0],
               cell.conditions)
        if key not in chosen or cell.nodes > chosen[key].nodes:
            chosen[key] = cell
    fits = []
    for cell in chosen.values():
        runs = [r for r in cell.runs if r.step_time_s]
        if not runs:
            skipped.append(f"{cell.strategy}: no step time")
            continue
        header = _header(Path(runs[0].run_dir))
        if not header.get("n_params"):
            skipped.append(f"{cell.strategy}: no header in {runs[0].run_dir}")
            continue
        model, shapes, reshard = model_of(header)
        phases = [_phases(Path(r.run_dir)) for r in runs]
        fits.append(Fit(
            strategy=cell.strategy, precision=cell.precision or "fp32",
            communication=(cell.communication or "none").split("/")[0], nodes=cell.nodes,
            ranks_per_node=int(header.get("tasks_per_node") or 1),
            # each run's step as its tokens/s implies: the fit's median gives the median back
            step_s=[int(header.get("tokens_per_step") or 0) / r.tokens_per_s
                    if r.tokens_per_s else r.step_time_s for r in runs],
            exposed_s=_median([r.exposed_comm_s for r in runs]),
            forward_s=_median([f for f, _, _ in phases]),
            backward_s=_median([b for _, b, _ in phases]),
            phases_s=_median([t for _, _, t in phases]),
            tokens_per_step=int(header.get("tokens_per_step") or 0),
            micro_batch=int(header.get("micro_batch_size") or 1),
            accum=int(header.get("grad_accum_steps") or 1),
            scaling=str(header.get("scaling") or "weak"),
            global_batch=int(header.get("global_batch_size") or 0),
            model=model, shapes=shapes, reshard_after_forward=reshard,
            state_gb=_median([r.state_gb for r in runs]),
            peak_gb=_median([r.peak_mem_gb for r in runs]),
            memory_measured=runs[0].memory_measured,
            device=str(header.get("device") or "cuda").split(":")[0]))
    return fits, skipped


# ---------------------------------------------------------------------------------- prediction

@dataclass
class Prediction:
    strategy: str
    precision: str
    nodes: int
    gpus: int
    tokens_per_s: float | None = None
    tokens_per_s_low: float | None = None
    tokens_per_s_high: float | None = None
    step_s: float | None = None
    compute_s: float | None = None
    comm_s: float | None = None
    exposed_s: float | None = None
    state_gb: float | None = None
    memory_gb: float | None = None
    hours: float | None = None
    hours_low: float | None = None
    hours_high: float | None = None
    gpu_hours: float | None = None
    billing: float | None = None
    measured: float | None = None
    measured_range: tuple | None = None
    flags: list[str] = field(default_factory=list)
    why_none: str | None = None
    terms: dict = field(default_factory=dict)
    """The step's parts in seconds (Comm's terms, the compute and its window)."""


ONE_RUN = "1 run: no interval (repeats give one: hpcdp compare --repeats 3)"


def window_share(fit: Fit, spec: registry.StrategySpec) -> float:
    """The share of compute that collectives can hide behind: backward for the gradient
    all-reduce, forward and backward for FSDP's gathers (the campaign's phases, else FLOPs:
    forward 1/3, backward 2/3 of forward + backward, the optimizer left out)."""
    if fit.forward_s is not None and fit.backward_s is not None and fit.phases_s:
        forward, backward = fit.forward_s / fit.phases_s, fit.backward_s / fit.phases_s
    else:
        forward, backward = 1 - BACKWARD_SHARE, BACKWARD_SHARE
    share = forward + backward if spec.sharding in ("full", "in-node") else backward
    return min(max(share, 0.0), 1.0)


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
    if comm.overlapped <= share * base or share >= 1:
        compute = max(base, 1e-9)
    else:  # comm beyond the window is exposed
        compute = max((base - comm.overlapped) / (1 - share), 0.1 * step)
    return compute, share * compute


def _scale_compute(fit: Fit, gpus: int, out: Prediction) -> tuple[float, float] | None:
    """(tokens per step at `gpus` ranks, compute's scale): weak scaling keeps compute per rank;
    strong scaling keeps the global batch, so each rank runs fewer micro-steps. None (and
    out.why_none) when the batch cannot be split that far."""
    if fit.scaling != "strong":
        return fit.tokens_per_step / (fit.nodes * fit.ranks_per_node) * gpus, 1.0
    accum = fit.global_batch / (fit.micro_batch * gpus)
    if accum < 1:
        out.why_none = (f"global batch {fit.global_batch} cannot be split over {gpus} ranks "
                        f"at micro-batch {fit.micro_batch}")
        return None
    if accum != int(accum):
        out.flags.append("global batch not divisible")
    if accum < fit.accum:
        out.flags.append("compute extrapolated to fewer micro-steps")
    return fit.tokens_per_step, accum / fit.accum


def predict(fit: Fit, net: Network | None, nodes: int, ranks_per_node: int, *,
            tokens: float, measured: dict, billing_per_node_hour: float | None,
            compute_scale: float = 1.0, target_device: str | None = None) -> Prediction:
    spec = registry.get(fit.strategy)
    gpus = nodes * ranks_per_node
    out = Prediction(fit.strategy, fit.precision, nodes, gpus)
    if nodes in measured:  # shown beside the forecast, and where none can be made
        out.measured, out.measured_range = measured[nodes]
    out.why_none = _why_not(spec, fit, net, nodes, ranks_per_node)
    if out.why_none:
        return out
    # Without network figures only where it was measured: its collectives are in its step.
    needs_net = spec.transport != "none" and gpus > 1 and net is not None
    step_med = 1 / statistics.median(1 / s for s in fit.step_s)  # at the median tokens/s
    streams = fit.device != "cpu" if target_device is None else target_device != "cpu"
    comm_fit = comm_terms(spec, fit.model, net, fit.nodes, fit.ranks_per_node,
                          fit.reshard_after_forward, fit.device != "cpu") \
        if net and spec.transport != "none" else Comm()
    compute, window = split_step(step_med, comm_fit, fit.exposed_s, window_share(fit, spec))
    spread_lo, spread_hi = min(fit.step_s) / step_med, max(fit.step_s) / step_med
    scaled = _scale_compute(fit, gpus, out)
    if scaled is None:
        return out
    tokens_per_step, scale = scaled
    scale *= compute_scale
    if fit.exposed_s is None or comm_fit.total == 0:  # a window not measured moves with compute
        window *= scale
    compute *= scale
    comm = comm_terms(spec, fit.model, net, nodes, ranks_per_node, fit.reshard_after_forward,
                      streams) if needs_net else Comm()
    spread = net.spread if net else 0.0

    def step(c_scale: float, n_scale: float) -> float:
        return compute * c_scale + comm.exposed(window, n_scale)

    out.step_s = step(1, 1)
    out.compute_s, out.comm_s, out.exposed_s = compute, comm.total, out.step_s - compute
    out.terms = {"compute_s": compute, "window_s": window, "overlapped_s": comm.overlapped,
                 "tail_s": comm.tail, "serial_s": comm.serial}
    out.tokens_per_s = tokens_per_step / out.step_s
    out.hours = tokens / out.tokens_per_s / 3600
    if len(fit.step_s) > 1:
        out.tokens_per_s_low = tokens_per_step / step(spread_hi, 1 + spread)
        out.tokens_per_s_high = tokens_per_step / step(spread_lo, max(0.0, 1 - spread))
        out.hours_low = tokens / out.tokens_per_s_high / 3600
        out.hours_high = tokens / out.tokens_per_s_low / 3600
    else:  # one run shows no spread: no interval, rather than one of zero width
        out.flags.append(ONE_RUN)
    out.gpu_hours = out.hours * gpus
    if billing_per_node_hour is not None:
        out.billing = billing_per_node_hour * nodes * out.hours
    # Memory: the state as this strategy shards it at N, plus what the campaign measured
    # beyond its state (activations, buffers; the process itself on a CPU).
    out.state_gb = state_bytes(spec.sharding, fit.shapes, gpus, ranks_per_node) / 1e9
    if fit.peak_gb is not None and fit.state_gb is not None:
        out.memory_gb = out.state_gb + max(0.0, fit.peak_gb - fit.state_gb)
    out.flags += _flags(fit, net if needs_net else None, nodes, measured)
    return out


def _why_not(spec: registry.StrategySpec, fit: Fit, net: Network | None, nodes: int,
             ranks_per_node: int) -> str | None:
    """Why nothing can be forecast at this shape, or None."""
    if spec.max_nodes is not None and nodes > spec.max_nodes:
        return f"{spec.name} runs on {spec.max_nodes} node only: not extrapolated"
    if spec.sharding == "in-node" and ranks_per_node < spec.min_tasks_per_node:
        return f"needs {spec.min_tasks_per_node}+ ranks per node"
    if (spec.transport != "none" and nodes * ranks_per_node > 1 and net is None
            and (nodes, ranks_per_node) != (fit.nodes, fit.ranks_per_node)):
        return f"no network figures for {fit.communication}"
    return None


def _flags(fit: Fit, net: Network | None, nodes: int, measured: dict) -> list[str]:
    """Where a prediction goes beyond what was measured (`net`: None when none is used)."""
    flags = []
    if fit.nodes * fit.ranks_per_node == 1 and net is not None:
        flags.append("fitted at 1 rank: the strategy's own per-step work not measured")
    if nodes > max([fit.nodes, *measured]):
        flags.append("extrapolated")
    if net and net.max_nodes and nodes > net.max_nodes:
        flags.append(f"network beyond {net.max_nodes} probed node(s)")
    largest = max(fit.model.grad_bytes, fit.model.param_gather_bytes)
    if net and net.max_bytes and largest > net.max_bytes * 1.01:
        flags.append("message beyond the probed sizes")
    return flags


# ------------------------------------------------------------------------------------ the whole

@dataclass
class Forecast:
    source: str
    nodes: list[int]
    tokens: float
    tokens_default: bool
    fits: list[Fit]
    networks: dict[str, Network]
    predictions: list[Prediction]
    notes: list[str]
    target: str | None = None
    gpu_memory_gb: float | None = None
    billing: dict | None = None


def parse_nodes(text: str) -> list[int]:
    """'1,2,4' or '1-128' (powers of two) as node counts; UsageError naming a bad one."""
    counts = []
    for part in text.split(","):
        part = part.strip()
        lo, dash, hi = part.partition("-")
        try:
            if dash:
                a, b = int(lo), int(hi)
                if 1 <= b < a:
                    raise UsageError(f"--nodes {part!r} is a range from high to low; give it "
                                     f"low to high: {b}-{a}")
                if a < 1:
                    raise ValueError
                k, found = 1, []
                while k <= b:
                    if k >= a:
                        found.append(k)
                    k *= 2
                counts += found or [a]
            else:
                value = int(part)
                if value < 1:
                    raise ValueError
                counts.append(value)
        except ValueError:
            raise UsageError(f"--nodes {part!r} is not a positive whole number; give node "
                             "counts like 1,2,4,8 or a range like 1-128 (powers of two)") from None
    return sorted(set(counts))


def measured_by_nodes(cells, fit: Fit) -> dict[int, tuple]:
    """The campaign's own tokens/s (median, (min, max)) for this strategy and precision."""
    out = {}
    for cell in cells:
        if (cell.strategy, cell.precision or "fp32") != (fit.strategy, fit.precision):
            continue
        values = [r.tokens_per_s for r in cell.runs if r.tokens_per_s]
        if values and cell.nodes is not None:
            out[cell.nodes] = (statistics.median(values), (min(values), max(values)))
    return out


def billing_rate(info: dict | None, gpus_per_node: int) -> float | None:
    """Billing units per node-hour of a whole node under the partition's TRESBillingWeights
    (Slurm's default sum of weighted TRES); None without weights."""
    if not info:
        return None
    w = info.get("weights") or {"cpu": 1.0}  # no weights: Slurm bills 1 per allocated CPU
    rate = w.get("cpu", 0.0) * (info.get("cpus_per_node") or 0)
    rate += w.get("mem", 0.0) * (info.get("mem_gb_per_node") or 0)
    rate += w.get("gres/gpu", 0.0) * gpus_per_node
    return rate


def _check_inputs(run_dir: str, target: ClusterProfile | None) -> Path:
    folder = Path(run_dir)
    if not folder.is_dir():
        raise UsageError(f"{run_dir!r} is not a folder; give a campaign's folder, e.g. "
                         "runs/smoke/compare (what `hpcdp compare` wrote)")
    if target is not None and not target.network.known:
        raise UsageError(
            f"cluster profile {target.name!r} has no network figures: add a network: section "
            "(inter_node_busbw_gbps, intra_node_busbw_gbps, latencies; docs/forecast.md), or "
            "leave --cluster out to forecast this campaign's own cluster from its probes")
    return folder


def make(run_dir: str, *, nodes: list[int] | None = None, fit_nodes: list[int] | None = None,
         target: ClusterProfile | None = None, tokens: float | None = None,
         query_slurm: bool = True) -> Forecast:
    """Every checkable mistake is found before anything is computed, one line each."""
    from hpcdp import harvest, peaks

    folder = _check_inputs(run_dir, target)
    result = harvest.collect([folder], query_slurm=False)
    cells = [c for c in result.cells if c.runs]
    if not cells:
        raise UsageError(f"{run_dir} holds no finished run to forecast from; run `hpcdp compare` "
                         "(or point at its folder) first")
    fit_set = set(fit_nodes) if fit_nodes else None
    fits, skipped = fits_of(cells, fit_set)
    if not fits:
        have = sorted({c.nodes for c in cells if c.nodes})
        raise UsageError(f"--fit-nodes {','.join(map(str, sorted(fit_set or [])))}: the campaign "
                         f"has finished cells on {','.join(map(str, have))} node(s) only")
    notes = [f"left out: {s}" for s in skipped]
    measured_nodes = sorted({c.nodes for c in cells if c.nodes})
    if len(measured_nodes) == 1:
        notes.append(f"the campaign ran on {measured_nodes[0]} node(s) only: the forecast's "
                     "error cannot be checked against another node count here (campaign on "
                     "1,2 nodes and --fit-nodes 1 to measure it)")
    networks = _networks(fits, result.baseline, target, notes)
    ranks_per_node = None
    gpu_memory = None
    compute_scale: dict[tuple, float] = {}
    if target is not None:
        notes += network_warnings(target)
        ranks_per_node = target.network.gpus_per_node or target.gpus_per_node or None
        gpu_memory = peaks.device_memory_gb(target.gpu_type or "")
        compute_scale = _rescale_to(target, fits, cells, notes)
    billing_info = _billing(folder, target) if query_slurm else None
    node_counts = nodes or sorted(set(DEFAULT_NODES) | set(measured_nodes))
    n_params = max(f.model.n_params for f in fits)
    total_tokens = tokens if tokens else TOKENS_PER_PARAM * n_params
    predictions = []
    for fit in fits:
        rpn = ranks_per_node or fit.ranks_per_node
        measured = measured_by_nodes(cells, fit)
        rate = billing_rate(billing_info, target.gpus_per_node if target else 0)
        for n in node_counts:
            predictions.append(predict(
                fit, networks.get(fit.communication), n, rpn, tokens=total_tokens,
                measured=measured if target is None else {}, billing_per_node_hour=rate,
                compute_scale=compute_scale.get((fit.strategy, fit.precision), 1.0),
                target_device=None if target is None else
                ("cuda" if target.gpus_per_node else "cpu")))
    for p in predictions:
        if gpu_memory and p.memory_gb and p.memory_gb > gpu_memory:
            p.flags.append(f"exceeds {gpu_memory:.0f} GB per GPU")
    return Forecast(source=str(folder), nodes=node_counts, tokens=total_tokens,
                    tokens_default=not tokens, fits=fits, networks=networks,
                    predictions=predictions, notes=notes,
                    target=target.name if target else None, gpu_memory_gb=gpu_memory,
                    billing=billing_info)


def _networks(fits: list[Fit], probes: list[dict], target: ClusterProfile | None,
              notes: list[str]) -> dict[str, Network]:
    """Per transport: the target profile's figures, else the fit to the campaign's probes."""
    if target is not None:
        shared = network_from_profile(target.network, target.name)
        return {f.communication: shared for f in fits}
    networks: dict[str, Network] = {}
    for fit in fits:
        if fit.communication not in networks and fit.communication != "none":
            net = fit_network(probes, fit.communication)
            if net is not None:
                networks[fit.communication] = net
    needing = sorted({f.communication for f in fits if f.communication != "none"
                      and f.communication not in networks})
    if needing:
        missing = (f"no network probe over {', '.join(needing)} (compare.network_baseline "
                   "false?)" if probes else "no network probe in this folder (`hpcdp compare` "
                   "runs one before its cells)")
        notes.append(f"{missing}: those strategies are left out beyond their measured cells; "
                     "give --cluster a profile with a network: section to forecast them")
    for net in networks.values():
        notes += list(net.notes)
    return networks


def _rescale_to(target: ClusterProfile, fits: list[Fit], cells, notes: list[str]
                ) -> dict[tuple, float]:
    """Compute's scale on the target's GPU: the ratio of peak FLOP/s, only where both the
    campaign's device and the target's are known (the table says which it did)."""
    from hpcdp import peaks

    scale = {}
    for fit in fits:
        run = next(c.runs[0] for c in cells if c.strategy == fit.strategy and c.runs)
        mine = _header(Path(run.run_dir)).get("peak_flops_per_device")
        theirs = peaks.peak_flops(target.gpu_type, fit.precision) if target.gpu_type else None
        if mine and theirs:
            scale[(fit.strategy, fit.precision)] = mine / theirs
    if fits and not scale:
        notes.append("compute is as measured on the campaign's devices: not rescaled to "
                     f"{target.gpu_type or 'the target'} (a peak FLOP/s is unknown for one of "
                     "them)")
    elif scale:
        notes.append(f"compute rescaled to {target.gpu_type} by the ratio of peak FLOP/s "
                     "(hpcdp/peaks.py): an assumption, not a measurement")
    return scale


def _billing(folder: Path, target: ClusterProfile | None) -> dict | None:
    """The target's partition's billing, or the campaign's own with what sacct billed it."""
    if target is None:
        return _campaign_billing(folder)
    from hpcdp import slurm

    info = slurm.partition_billing(target.partition)
    if info is not None:
        info["gpus_per_node"] = target.gpus_per_node
    return info


def _campaign_billing(folder: Path) -> dict | None:
    """The weights of the partition the campaign's job ran in, with what sacct billed it, to
    set beside the forecast's rate."""
    from hpcdp import slurm

    try:
        submission = json.loads((folder / "submission.json").read_text())
    except (OSError, ValueError):
        return None
    job = slurm.job_billing(str(submission.get("job_id", "")))
    # sacct's partition: `--set cluster.partition=...` may have moved it off the profile's.
    partition = job.get("partition") if job else None
    if partition is None:
        try:  # the profile it was submitted with names one (None: the default partition)
            from hpcdp.config import load_profile

            partition = load_profile(str(submission.get("cluster"))).partition
        except UsageError:
            partition = None
    info = slurm.partition_billing(partition)
    if info is not None and job is not None:
        info["campaign_job"] = {"job_id": str(submission.get("job_id")), **job,
                                "nodes": submission.get("nodes")}
    return info


# ---------------------------------------------------------------------------------- rendering

def _si(value: float | None, unit: str = "") -> str:
    if value is None:
        return "-"
    for scale, prefix in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= scale:
            return f"{value / scale:.3g}{prefix}{unit}"
    return f"{value:.3g}{unit}"


def _hours(h: float | None) -> str:
    if h is None:
        return "-"
    return f"{h * 60:.1f} min" if h < 1 else f"{h:.1f} h" if h < 48 else f"{h / 24:.1f} d"


def _with_interval(show, value, low, high) -> str:
    """`value [low-high]`, or the value alone where no interval is known (one run)."""
    return show(value) + (f" [{show(low)}-{show(high)}]" if low is not None else "")


def rows(fc: Forecast, n: int) -> list[list[str]]:
    out = []
    for p in sorted((p for p in fc.predictions if p.nodes == n),
                    key=lambda p: -(p.tokens_per_s or 0)):
        measured = []
        if p.measured is not None:
            err = f" ({p.tokens_per_s / p.measured - 1:+.0%})" if p.tokens_per_s else ""
            measured = [f"measured {_si(p.measured)}{err}"]
        if p.tokens_per_s is None:
            out.append([p.strategy, p.precision, str(p.gpus), "-", "-", "-", "-", "-", "-", "-",
                        "; ".join([f"not forecast: {p.why_none}", *measured])])
            continue
        out.append([
            p.strategy, p.precision, str(p.gpus),
            _with_interval(_si, p.tokens_per_s, p.tokens_per_s_low, p.tokens_per_s_high),
            _si(p.tokens_per_s / p.gpus),
            f"{p.exposed_s / p.step_s:.0%}" if p.step_s else "-",
            f"{p.state_gb:.3g}" if p.state_gb is not None else "-",
            f"{p.memory_gb:.3g}" if p.memory_gb is not None else "-",
            _with_interval(_hours, p.hours, p.hours_low, p.hours_high),
            f"{p.gpu_hours:.3g}" + (f" / {p.billing:.3g}" if p.billing is not None else ""),
            "; ".join(measured + p.flags)])
    return out


def _nothing_at(fc: Forecast, n: int) -> bool:
    """No strategy forecast or measured at `n` nodes: a table of dashes says nothing."""
    return all(p.tokens_per_s is None and p.measured is None
               for p in fc.predictions if p.nodes == n)


HEADERS = ["strategy", "prec", "GPUs", "tokens/s predicted [interval]", "tok/s/GPU",
           "exposed", "state GB", "mem GB", "time to train", "GPU-h / billing", "notes"]


def render_text(fc: Forecast, markdown: bool = False) -> str:
    lines = [f"Forecast from {fc.source}" + (f" for cluster {fc.target}" if fc.target else "")
             + f": {_si(fc.tokens)} tokens to train"
             + (f" ({TOKENS_PER_PARAM} per parameter)" if fc.tokens_default else "")
             + ". Predicted, not measured: ranks below are the model's, not a verdict."]
    for fit in fc.fits:
        lines.append(f"  fitted on {fit.strategy} {fit.precision}: {fit.nodes} node(s) x "
                     f"{fit.ranks_per_node}, {len(fit.step_s)} run(s), step "
                     f"{statistics.median(fit.step_s) * 1e3:.1f} ms")
    for name, net in fc.networks.items():
        resid = sorted(abs(r) for _, r in net.residuals)
        fit_line = (f"; fit residuals median {statistics.median(resid):.0%}, "
                    f"max {resid[-1]:.0%} over {len(resid)} points") if resid else ""
        lines.append(f"  network {name} ({net.source}): intra {net.intra_busbw / 1e9:.3g} GB/s, "
                     f"{net.intra_lat_s * 1e6:.3g} us/step; inter {net.inter_busbw / 1e9:.3g} "
                     f"GB/s, {net.inter_lat_s * 1e6:.3g} us/step{fit_line}")
    if fc.billing is not None:
        weights = fc.billing.get("weights")
        rate = billing_rate(fc.billing, fc.billing.get("gpus_per_node", 0))
        said = (",".join(f"{k}={v:g}" for k, v in weights.items()) if weights
                else "none set: Slurm bills 1 per CPU")
        lines.append(f"  billing: partition {fc.billing['partition']}, {rate:g} units per "
                     f"node-hour of a whole node (TRESBillingWeights {said})")
        job = fc.billing.get("campaign_job")
        if job and job.get("billing") is not None and job.get("nodes"):
            lines.append(f"  sacct: the campaign's job {job['job_id']} was billed "
                         f"{job['billing']:g} units per hour for its {job['nodes']} node(s) "
                         f"({job['billing'] / job['nodes']:g} per node-hour); energy "
                         + (f"{job['energy_j']:g} J" if job.get("energy_j") else "not recorded "
                            "(no AcctGatherEnergyType plugin)"))
    for note in fc.notes:
        lines.append(f"  note: {note}")
    empty = [n for n in fc.nodes if _nothing_at(fc, n)]
    for n in fc.nodes:
        table = rows(fc, n)
        if not table or n in empty:
            continue
        lines.append("")
        lines.append(f"{n} node(s):")
        widths = [max(len(str(r[i])) for r in [HEADERS, *table]) for i in range(len(HEADERS))]
        if markdown:
            lines.append("| " + " | ".join(HEADERS) + " |")
            lines.append("|" + "---|" * len(HEADERS))
            lines += ["| " + " | ".join(r) + " |" for r in table]
        else:
            lines.append("  ".join(h.ljust(w) for h, w in zip(HEADERS, widths)).rstrip())
            lines += ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in table]
        said = ranking_line(ranking(fc, n))
        if said:
            lines.append(said)
    if empty:  # one line for the node counts where nothing could be forecast
        why = sorted({f"{p.strategy} {p.precision}: {p.why_none}" for p in fc.predictions
                      if p.nodes in empty})
        lines += ["", f"not forecast at {', '.join(map(str, empty))} node(s): "
                  + "; ".join(why)]
    return "\n".join(lines) + "\n"


def ranking(fc: Forecast, n: int) -> dict:
    """At `n` nodes, in the verdict's manner: one forecast is "predicted ahead of" another only
    where their intervals do not overlap; otherwise they "can't tell apart" (one run gives no
    interval: nothing is ranked on a point alone). A strategy whose memory per rank exceeds the
    target's GPU does not fit, and memory decides, not speed."""
    shown = sorted((p for p in fc.predictions if p.nodes == n and p.tokens_per_s),
                   key=lambda p: -p.tokens_per_s)
    too_big = {f"{p.strategy} {p.precision}": next(f for f in p.flags if f.startswith("exceeds"))
               for p in shown if any(f.startswith("exceeds") for f in p.flags)}
    fitting = [p for p in shown if f"{p.strategy} {p.precision}" not in too_big]
    ahead: dict[str, list[str]] = {}
    tied: list[list[str]] = []
    for i, a in enumerate(fitting):
        for b in fitting[i + 1:]:
            pair = [f"{a.strategy} {a.precision}", f"{b.strategy} {b.precision}"]
            if (a.tokens_per_s_low is not None and b.tokens_per_s_high is not None
                    and a.tokens_per_s_low > b.tokens_per_s_high):
                ahead.setdefault(pair[0], []).append(pair[1])
            else:
                tied.append(pair)
    return {"nodes": n, "ahead_of": ahead, "cannot_tell_apart": tied, "does_not_fit": too_big}


def ranking_line(rank: dict) -> str | None:
    """The ranking in one line, or None where fewer than two strategies were forecast."""
    parts = [f"{a} predicted ahead of {', '.join(bs)}" for a, bs in rank["ahead_of"].items()]
    if rank["cannot_tell_apart"]:
        parts.append(f"can't tell apart at {rank['nodes']}: "
                     + ", ".join(f"{a} and {b}" for a, b in rank["cannot_tell_apart"]))
    parts += [f"{name} does not fit ({why}): memory decides"
              for name, why in rank["does_not_fit"].items()]
    return "ranking: " + "; ".join(parts) if parts else None


def as_json(fc: Forecast) -> dict:
    import dataclasses

    return {
        "source": fc.source, "target": fc.target, "tokens": fc.tokens, "nodes": fc.nodes,
        "gpu_memory_gb": fc.gpu_memory_gb, "notes": fc.notes, "billing": fc.billing,
        "networks": {k: {**dataclasses.asdict(v), "residuals": [list(r) for r in v.residuals]}
                     for k, v in fc.networks.items()},
        "fits": [{k: v for k, v in dataclasses.asdict(f).items() if k not in ("shapes",)}
                 for f in fc.fits],
        "predictions": [dataclasses.asdict(p) for p in fc.predictions],
        "ranking": [ranking(fc, n) for n in fc.nodes],
    }


def plot(fc: Forecast, path: Path) -> Path:
    """Tokens/s per GPU against nodes: forecast bands and measured points per strategy."""
    from hpcdp.harvest.plots import _figure

    fig = _figure()
    ax = fig.add_subplot()
    by = {}
    for p in sorted(fc.predictions, key=lambda p: p.nodes):
        by.setdefault((p.strategy, p.precision), []).append(p)
    for (strategy, precision), preds in sorted(by.items()):
        forecast = [p for p in preds if p.tokens_per_s is not None]
        banded = [p for p in forecast if p.tokens_per_s_low is not None]  # not from one run
        seen = [(p.nodes, p.measured / p.gpus) for p in preds if p.measured is not None]
        color, label = None, f"{strategy} {precision} (measured)"
        if forecast:
            line, = ax.plot([p.nodes for p in forecast],
                            [p.tokens_per_s / p.gpus for p in forecast], "--",
                            label=f"{strategy} {precision} (forecast)")
            color, label = line.get_color(), None
        if banded:
            ax.fill_between([p.nodes for p in banded],
                            [p.tokens_per_s_low / p.gpus for p in banded],
                            [p.tokens_per_s_high / p.gpus for p in banded], alpha=0.2,
                            color=color)
        if seen:
            ax.plot(*zip(*seen), "o", color=color, label=label)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("nodes")
    ax.set_ylabel("tokens/s per GPU (rank)")
    ax.set_title("Forecast (dashed, band: interval) and measured (dots)")
    ax.legend(fontsize=7)
    fig.savefig(path, bbox_inches="tight")
    return path


# ------------------------------------------------------------------------- published figures

PUBLISHED_FILE = PROJECT_ROOT / "experiments" / "forecast-published.yaml"


def published_checks(path: Path = PUBLISHED_FILE) -> list[dict]:
    """The model against published scaling figures (experiments/forecast-published.yaml): for
    each, what it predicts from the inputs published with it, the published value and the
    relative error, and whether the file's tolerance applies to that figure."""
    from hpcdp.config import build, read_yaml

    checks = []
    for name, case in read_yaml(Path(path), "published figures").items():
        net = network_from_profile(build(NetworkConfig, case["network"], f"{name}.network"),
                                   name)
        gpn = int(case["gpus_per_node"])
        if "op" in case:  # one collective, as nccl-tests times it
            ranks = int(case["nodes"]) * gpn
            for nbytes, published_us in case["times_us"].items():
                predicted = net.collective_s(case["op"], float(nbytes), ranks,
                                             int(case["nodes"])) * 1e6
                checks.append({"case": name, "what": f"{int(nbytes):,} B all-reduce time (us)",
                               "predicted": predicted, "published": float(published_us),
                               "error": predicted / float(published_us) - 1,
                               "checked": int(nbytes) >= int(case.get("checked_from_bytes", 0)),
                               "tolerance": float(case["tolerance"])})
            continue
        params = float(case["params"])
        model = Model(n_params=int(params), grad_bytes=int(params * case["grad_bytes"]),
                      param_gather_bytes=int(params * case["param_bytes"]),
                      units=int(case["units"]), block_share=float(case["block_share"]))
        fit_gpus, per_gpu = int(case["fit"]["gpus"]), float(case["fit"]["tokens_per_s_per_gpu"])
        tokens = int(case["tokens_per_gpu_step"])
        fit = Fit(strategy=case["strategy"], precision="bf16", communication="published",
                  nodes=max(1, fit_gpus // gpn), ranks_per_node=min(gpn, fit_gpus),
                  step_s=[tokens / per_gpu], exposed_s=None, forward_s=None, backward_s=None,
                  phases_s=None, tokens_per_step=tokens * fit_gpus, micro_batch=1, accum=1,
                  scaling="weak", global_batch=fit_gpus, model=model, shapes=[],
                  reshard_after_forward=True, state_gb=None, peak_gb=None,
                  memory_measured=None)
        check_gpus = int(case["check"]["gpus"])
        p = predict(fit, net, check_gpus // gpn, gpn, tokens=1.0, measured={},
                    billing_per_node_hour=None)
        predicted = p.tokens_per_s / check_gpus
        published = float(case["check"]["tokens_per_s_per_gpu"])
        checks.append({"case": name, "what": f"tokens/s per GPU at {check_gpus} GPUs "
                       f"(fitted at {fit_gpus})", "predicted": predicted, "published": published,
                       "error": predicted / published - 1, "checked": True,
                       "tolerance": float(case["tolerance"])})
    return checks


# ------------------------------------------------------------------- before queuing: will it fit?

def activation_bytes(n_layer: int, n_embd: int, n_head: int, seq: int, batch: int, vocab: int,
                     bytes_per_value: int, eager_attention: bool) -> float:
    """Activations one rank keeps for backward, per Korthikanti et al. 2022 (sbh(34 + 5as/h)
    per layer in 2-byte values; the 5as/h of the attention matrix only where attention is not
    fused), plus the logits and their gradient in fp32. An estimate: a campaign measures it."""
    per_layer = seq * batch * n_embd * (34 + (5 * n_head * seq / n_embd if eager_attention
                                              else 0))
    return n_layer * per_layer * bytes_per_value / 2 + 2 * seq * batch * vocab * 4


def memory_warnings(jobs, profile: ClusterProfile, experiment) -> list[str]:
    """One line per cell whose memory per rank, as estimated from the experiment alone (model
    state as its strategy shards it, plus activations by Korthikanti et al.'s count), exceeds
    the device memory of the profile's gpu_type: an out-of-memory said before queuing, not
    after hours in the queue. `hpcdp forecast` gives the figure a campaign measured."""
    from hpcdp import peaks
    from hpcdp.estimate import _vocab

    memory = peaks.device_memory_gb(profile.gpu_type or "") if profile.gpus_per_node else None
    if not memory:
        return []
    n_layer, n_embd, n_head, _ = MODEL_PRESETS[experiment.model.preset]
    vocab, train = _vocab(experiment), experiment.train
    shapes = experiment_shapes(experiment)
    lines = []
    for job in jobs:
        spec = job.strategy
        ranks = job.nodes * job.tasks_per_node
        state = state_bytes(spec.sharding, shapes, ranks, job.tasks_per_node) / 1e9
        acts = activation_bytes(n_layer, n_embd, n_head, train.seq_len, train.micro_batch_size,
                                vocab, 2 if spec.mixed_precision else 4,
                                experiment.model.attention == "eager") / 1e9
        if state + acts > memory:
            lines.append(f"hpcdp: warning: {spec.name} on {job.nodes} node(s) needs about "
                         f"{state + acts:.1f} GB per rank ({state:.1f} GB model state, "
                         f"~{acts:.1f} GB activations at micro-batch "
                         f"{train.micro_batch_size}), more than a {profile.gpu_type}'s "
                         f"{memory:.0f} GB: lower train.micro_batch_size (raise "
                         "grad_accum_steps to keep the batch), or use a sharded strategy")
    return lines
