"""hpcdp forecast's whole: from a campaign folder (or a target profile) to a Forecast, every
checkable mistake found first, one line each."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from hpcdp.config import ClusterProfile
from hpcdp.errors import UsageError
from hpcdp.forecast.inputs import (
    Fit,
    _header,
    fit_network,
    fits_of,
    measured_by_nodes,
    network_from_profile,
    network_warnings,
)
from hpcdp.forecast.model import Network
from hpcdp.forecast.predict import Prediction, predict
from hpcdp.forecast.published import known_error_per_doubling

DEFAULT_NODES = (1, 2, 4, 8, 16, 32, 64, 128)
TOKENS_PER_PARAM = 20
"""Default training length: 20 tokens per parameter (Hoffmann et al., 2022)."""


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
    # The published checks behind it run only where a fit has repeats, i.e. an interval to widen
    known_error = known_error_per_doubling() if any(len(f.step_s) > 1 for f in fits) else None
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
                ("cuda" if target.gpus_per_node else "cpu"), known_error=known_error))
    notes += _flags_and_notes(predictions, gpu_memory, known_error)
    return Forecast(source=str(folder), nodes=node_counts, tokens=total_tokens,
                    tokens_default=not tokens, fits=fits, networks=networks,
                    predictions=predictions, notes=notes,
                    target=target.name if target else None, gpu_memory_gb=gpu_memory,
                    billing=billing_info)


def _flags_and_notes(predictions: list[Prediction], gpu_memory: float | None,
                     known_error: tuple[float, float] | None) -> list[str]:
    """Flags a prediction over the GPU's memory; the notes the predictions as a whole need."""
    for p in predictions:
        if gpu_memory and p.memory_gb and p.memory_gb > gpu_memory:
            p.flags.append(f"exceeds {gpu_memory:.0f} GB per GPU")
    if known_error is None or not any(p.known_error for p in predictions):
        return []
    return [f"intervals beyond the fitted scale hold the model's known error on published "
            f"series, {known_error[0]:+.1%} to {known_error[1]:+.1%} per doubling of the GPUs "
            "(docs/forecast.md)"]


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
