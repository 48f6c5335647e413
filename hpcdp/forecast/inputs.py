"""What a forecast is fitted on: the network figures (the campaign's probes, or a profile's
network: section, with the warning on a likely mistake in them) and one Fit per strategy and
precision from the campaign's run folders."""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from pathlib import Path

from hpcdp import run_folder
from hpcdp.config import MODEL_PRESETS, ClusterProfile, NetworkConfig, model_context
from hpcdp.forecast.model import Model, Network, _numel, gpt2_shapes


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
                   notes=tuple(notes),
                   # Horovod's probes on a CPU go through MPI or Gloo's rings, not NCCL's tree
                   library=transport if transport in ("gloo", "nccl") else "mpi")


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
    rank_spread: float | None = None
    """How much a rank's own work varies about its step's mean over the ranks (one standard
    deviation, a share of that mean): the slowest-of-N term's input. None: not measured."""
    rank_spread_steps: int = 0
    """Steps the spread was measured over (0: borrowed or not measured)."""
    rank_spread_source: str = "not measured"
    shard_group: int | None = None
    """Ranks one copy of the model is sharded over, replicated beyond (a published hybrid
    recipe's); None: as the strategy shards (fsdp over all ranks, hsdp over a node)."""


def _median(values):
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def _phases(records: list[dict]) -> tuple[float | None, float | None, float | None]:
    """Median forward, backward and all-phases seconds of the later half of a run's step
    records."""
    steps = [r["phases_s"] for r in records if isinstance(r.get("phases_s"), dict)]
    later = steps[len(steps) // 2:]
    total = [sum(v for v in ph.values() if isinstance(v, (int, float))) for ph in later]
    return (_median([ph.get("forward") for ph in later]),
            _median([ph.get("backward") for ph in later]), _median(total))


def rank_spread(runs: list[list[dict]]) -> tuple[float, int, int] | None:
    """(spread, ranks, steps) of the step records' `rank_work_s` (how the ranks' own work in a
    step spread: ranks, mean, sd) over the later half of each run's steps: the ranks' standard
    deviation about each step's mean, pooled over the steps, as a share of the mean work. None
    where no record has two ranks' work (one rank; FSDP and DataParallel do not time their
    waits apart)."""
    squares, dof, means, ranks = 0.0, 0, [], 0
    for records in runs:
        works = [r["rank_work_s"] for r in records if isinstance(r.get("rank_work_s"), dict)]
        for work in works[len(works) // 2:]:
            try:
                n, mean, sd = int(work["ranks"]), float(work["mean"]), float(work["sd"])
            except (KeyError, TypeError, ValueError):
                continue
            if n < 2 or not (math.isfinite(mean) and math.isfinite(sd)):
                continue
            squares += sd * sd * (n - 1)
            dof, ranks = dof + n - 1, max(ranks, n)
            means.append(mean)
    if not dof or sum(means) <= 0:
        return None
    return math.sqrt(squares / dof) / (sum(means) / len(means)), ranks, len(means)


def _header(run_dir: Path) -> dict:
    head, _ = run_folder.head_and_tail(run_dir)
    return head if head and head["kind"] == "header" else {}


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
        steps = [run_folder.read_metrics(Path(r.run_dir), ("step",)) for r in runs]  # once
        phases = [_phases(records) for records in steps]
        spread = rank_spread(steps)
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
            device=str(header.get("device") or "cuda").split(":")[0],
            rank_spread=spread[0] if spread else None,
            rank_spread_steps=spread[2] if spread else 0,
            rank_spread_source=(f"{spread[1]} ranks' work over {spread[2]} steps of "
                                f"{len(runs)} run(s)" if spread else "not measured")))
    _borrow_rank_spread(fits)
    return fits, skipped


def _borrow_rank_spread(fits: list[Fit]) -> None:
    """A fit whose ranks' work was not timed apart from their waits (FSDP, one rank) takes the
    campaign's other cells' spread, weighted by their steps: the ranks run the same model on
    the same devices, and how their work varies is the machine's, not the strategy's."""
    donors = [f for f in fits if f.rank_spread is not None and f.rank_spread_steps]
    if not donors:
        return
    pooled = (sum(f.rank_spread * f.rank_spread_steps for f in donors)
              / sum(f.rank_spread_steps for f in donors))
    names = ", ".join(sorted({f.strategy for f in donors}))
    for fit in fits:
        if fit.rank_spread is None:
            fit.rank_spread = pooled
            fit.rank_spread_source = (f"borrowed from the campaign's {names} cells: its own "
                                      "waits are not timed apart")



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
