"""One prediction: a Fit's measured step carried to N nodes x ranks per node, with its
interval, time, cost, memory and flags."""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field

from hpcdp import strategies as registry
from hpcdp.forecast.inputs import Fit
from hpcdp.forecast.model import (
    BACKWARD_SHARE,
    DDP_BUCKET_BYTES,
    OVERLAP_SLOWDOWN,
    Comm,
    Network,
    comm_terms,
    latency_s,
    split_step,
    state_bytes,
    straggler_s,
)


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
    """The step's parts in seconds: compute, the slowest-of-N wait, Comm's terms and the
    window that hides them; and, within the collectives, their latency."""
    sources: dict = field(default_factory=dict)
    """Where each term came from, in words."""
    allreduce_algorithm: str | None = None
    """What a gradient bucket's all-reduce takes at this size ("ring" or NCCL's "tree")."""
    known_error: tuple | None = None
    """(low, high): the model's known error at this distance from the fit, as shares of the
    point, which widen the interval (forecast.known_error_per_doubling x doublings)."""


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
            compute_scale: float = 1.0, target_device: str | None = None,
            known_error: tuple[float, float] | None = None) -> Prediction:
    """`known_error`: the model's error per doubling beyond the fit (_set_interval)."""
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
                          fit.reshard_after_forward, fit.device != "cpu", fit.shard_group) \
        if net and spec.transport != "none" else Comm()
    compute, window = split_step(step_med, comm_fit, fit.exposed_s, window_share(fit, spec))
    spread_lo, spread_hi = min(fit.step_s) / step_med, max(fit.step_s) / step_med
    scaled = _scale_compute(fit, gpus, out)
    if scaled is None:
        return out
    tokens_per_step, scale = scaled
    scale *= compute_scale
    if not (fit.exposed_s and comm_fit.total > 0):  # a window not measured moves with compute
        window *= scale
    compute *= scale
    comm = comm_terms(spec, fit.model, net, nodes, ranks_per_node, fit.reshard_after_forward,
                      streams, fit.shard_group) if needs_net else Comm()
    spread = net.spread if net else 0.0
    # The ranks' spread is the campaign's machine's: it carries to a target of that device type
    same_devices = target_device is None or target_device == fit.device
    wait = straggler_s(compute, fit.rank_spread if same_devices else None, gpus,
                       fit.nodes * fit.ranks_per_node)

    def step(c_scale: float, n_scale: float) -> float:
        return (compute + wait) * c_scale + comm.exposed(window, n_scale)

    out.step_s = step(1, 1)
    out.compute_s, out.comm_s, out.exposed_s = compute, comm.total, comm.exposed(window)
    out.terms = _terms(compute, wait, window, comm)
    _latency(out, spec, fit, net if needs_net else None, ranks_per_node, streams)
    out.sources = _sources(fit, net if needs_net else None, same_devices, scale)
    out.tokens_per_s = tokens_per_step / out.step_s
    out.hours = tokens / out.tokens_per_s / 3600
    if len(fit.step_s) > 1:
        _set_interval(out, fit, tokens, tokens_per_step / step(spread_hi, 1 + spread),
                      tokens_per_step / step(spread_lo, max(0.0, 1 - spread)), known_error)
    else:  # one run shows no spread: no interval, rather than one of zero width
        out.flags.append(ONE_RUN)
    out.gpu_hours = out.hours * gpus
    if billing_per_node_hour is not None:
        out.billing = billing_per_node_hour * nodes * out.hours
    _memory(out, spec, fit, ranks_per_node)
    out.flags += _flags(fit, net if needs_net else None, nodes, measured)
    return out


def _terms(compute: float, wait: float, window: float, comm: Comm) -> dict:
    """The step's parts, in seconds (the latency, inside the collectives, is added apart)."""
    return {"compute_s": compute, "straggler_s": wait, "window_s": window,
            "overlapped_s": comm.overlapped, "tail_s": comm.tail, "serial_s": comm.serial,
            "interference_s": comm.interference(window)}


def _set_interval(out: Prediction, fit: Fit, tokens: float, low: float, high: float,
                  per_doubling: tuple[float, float] | None) -> None:
    """The interval of tokens/s (and of the time): what the fit's spread gives, `low` to
    `high`; beyond the fit's ranks also the model's known error there, `per_doubling` (low,
    high) as shares per doubling of the ranks (published.known_error_per_doubling), since the
    spread measured at the fit does not hold what the model misses. An error e means the truth
    is the point / (1 + e)."""
    doublings = math.log2(out.gpus / (fit.nodes * fit.ranks_per_node))
    if per_doubling is not None and doublings > 0:
        out.known_error = (per_doubling[0] * doublings, per_doubling[1] * doublings)
        low /= 1 + max(out.known_error[1], 0.0)
        high /= max(1 + min(out.known_error[0], 0.0), 1e-9)
        out.sources["known_error"] = (
            f"the model's error on published series, {per_doubling[0]:+.1%} to "
            f"{per_doubling[1]:+.1%} per doubling of the GPUs beyond the fit (90%; "
            f"docs/forecast.md): {doublings:.3g} doubling(s) here")
    out.tokens_per_s_low, out.tokens_per_s_high = low, high
    out.hours_low, out.hours_high = tokens / high / 3600, tokens / low / 3600


def _latency(out: Prediction, spec: registry.StrategySpec, fit: Fit, net: Network | None,
             ranks_per_node: int, streams: bool) -> None:
    """The collectives' latency (within their terms, shown apart) and the algorithm a
    gradient bucket's all-reduce takes at this size."""
    out.terms["latency_s"] = latency_s(spec, fit.model, net, out.nodes, ranks_per_node,
                                       fit.reshard_after_forward, streams,
                                       fit.shard_group) if net else 0.0
    if net and spec.sharding not in ("full", "in-node"):
        out.allreduce_algorithm = net.collective("all_reduce", DDP_BUCKET_BYTES, out.gpus,
                                                 out.nodes)[2]


def _memory(out: Prediction, spec: registry.StrategySpec, fit: Fit, ranks_per_node: int
            ) -> None:
    """The state as this strategy shards it at N, plus what the campaign measured beyond its
    state (activations, buffers; the process itself on a CPU)."""
    out.state_gb = state_bytes(spec.sharding, fit.shapes, out.gpus, ranks_per_node) / 1e9
    if fit.peak_gb is not None and fit.state_gb is not None:
        out.memory_gb = out.state_gb + max(0.0, fit.peak_gb - fit.state_gb)


def _sources(fit: Fit, net: Network | None, same_devices: bool, scale: float) -> dict:
    """Where each of a prediction's terms came from."""
    compute = (f"{fit.strategy} {fit.precision}'s median step at {fit.nodes} node(s) x "
               f"{fit.ranks_per_node}, less the modelled communication it exposed"
               + (f", x {scale:.3g} (batch or device)" if scale != 1 else ""))
    if fit.rank_spread is None:
        straggler = "not measured (no step record holds two ranks' work): 0"
    elif not same_devices:
        straggler = f"not carried: measured on {fit.device}, the target's devices differ: 0"
    else:
        straggler = (f"ranks' work varies {fit.rank_spread:.1%} (one sd; "
                     f"{fit.rank_spread_source}); the slowest of N lies sd x E[max of N "
                     "normals] above the mean")
    window = ("the exposed communication measured (what hid is the window)"
              if fit.exposed_s else "the campaign's backward (and forward) share of compute")
    comm = f"network {net.source}" if net else "none: no collectives modelled"
    interference = (f"compute beside a collective runs {OVERLAP_SLOWDOWN:.1%} slower on a GPU "
                    "(Lee et al. 2025, arXiv 2507.03114: A100, H100, MI250, MI210), x the "
                    "overlapped time the window holds; 0 on a CPU")
    return {"compute_s": compute, "straggler_s": straggler, "window_s": window,
            "overlapped_s": comm, "tail_s": comm, "serial_s": comm, "latency_s": comm,
            "interference_s": interference}


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
