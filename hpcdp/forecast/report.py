"""A Forecast as text, markdown, JSON and a plot, with its ranking in the verdict's words."""

from __future__ import annotations

import statistics
from pathlib import Path

from hpcdp.forecast.build import TOKENS_PER_PARAM, Forecast, billing_rate


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


def headers(fc: Forecast) -> list[str]:
    """The table's columns. A forecast of CPU ranks (a CPU campaign on its own cluster, no
    --cluster) counts ranks and rank-hours, not GPUs: what it predicts is what ran."""
    cpu = fc.target is None and bool(fc.fits) and all(f.device == "cpu" for f in fc.fits)
    unit = "rank" if cpu else "GPU"
    return ["strategy", "prec", f"{unit}s", "tokens/s predicted [interval]", f"tok/s/{unit}",
            "exposed", "state GB", "mem GB", "time to train", f"{unit}-h / billing", "notes"]


def render_text(fc: Forecast, markdown: bool = False) -> str:
    lines = [f"Forecast from {fc.source}" + (f" for cluster {fc.target}" if fc.target else "")
             + f": {_si(fc.tokens)} tokens to train"
             + (f" ({TOKENS_PER_PARAM} per parameter)" if fc.tokens_default else "")
             + ". Predicted, not measured: ranks below are the model's, not a verdict."]
    for fit in fc.fits:
        lines.append(f"  fitted on {fit.strategy} {fit.precision}: {fit.nodes} node(s) x "
                     f"{fit.ranks_per_node}, {len(fit.step_s)} run(s), step "
                     f"{statistics.median(fit.step_s) * 1e3:.1f} ms"
                     + (f", ranks' work varies {fit.rank_spread:.1%} ({fit.rank_spread_source})"
                        if fit.rank_spread is not None else ""))
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
    columns = headers(fc)
    for n in fc.nodes:
        table = rows(fc, n)
        if not table or n in empty:
            continue
        lines.append("")
        lines.append(f"{n} node(s):")
        widths = [max(len(str(r[i])) for r in [columns, *table]) for i in range(len(columns))]
        if markdown:
            lines.append("| " + " | ".join(columns) + " |")
            lines.append("|" + "---|" * len(columns))
            lines += ["| " + " | ".join(r) + " |" for r in table]
        else:
            lines.append("  ".join(h.ljust(w) for h, w in zip(columns, widths)).rstrip())
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
