"""The model against published scaling figures (experiments/forecast-published.yaml)."""

from __future__ import annotations

import functools
import math
import re
from pathlib import Path

from hpcdp import PUBLISHED_FIGURES, PUBLISHED_SERIES
from hpcdp.config import NetworkConfig
from hpcdp.forecast.inputs import Fit, network_from_profile
from hpcdp.forecast.model import Model
from hpcdp.forecast.predict import predict


def published_checks(path: Path = PUBLISHED_FIGURES) -> list[dict]:
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
        check_gpus = int(case["check"]["gpus"])
        predicted = _per_gpu(case["strategy"], model, net, gpn, int(case["tokens_per_gpu_step"]),
                             fit_gpus, per_gpu, check_gpus).tokens_per_s / check_gpus
        published = float(case["check"]["tokens_per_s_per_gpu"])
        checks.append({"case": name, "what": f"tokens/s per GPU at {check_gpus} GPUs "
                       f"(fitted at {fit_gpus})", "predicted": predicted, "published": published,
                       "error": predicted / published - 1, "checked": True,
                       "tolerance": float(case["tolerance"])})
    return checks


def _per_gpu(strategy: str, model: Model, net, gpus_per_node: int, tokens: int, fit_gpus: int,
             per_gpu: float, gpus: int, reshard_after_forward: bool = True,
             shard_group: int | None = None, rank_spread: float | None = None):
    """The prediction at `gpus` of a series fitted at `fit_gpus`, where each GPU trained
    `tokens` per step at `per_gpu` tokens/s (one published figure: no spread; `rank_spread`:
    the ranks' spread to assume, which no published table gives)."""
    fit = Fit(strategy=strategy, precision="bf16", communication="published",
              nodes=max(1, fit_gpus // gpus_per_node), ranks_per_node=min(gpus_per_node, fit_gpus),
              step_s=[tokens / per_gpu], exposed_s=None, forward_s=None, backward_s=None,
              phases_s=None, tokens_per_step=tokens * fit_gpus, micro_batch=1, accum=1,
              scaling="weak", global_batch=fit_gpus, model=model, shapes=[],
              reshard_after_forward=reshard_after_forward, state_gb=None, peak_gb=None,
              memory_measured=None, shard_group=shard_group, rank_spread=rank_spread,
              rank_spread_source="assumed")
    return predict(fit, net, gpus // gpus_per_node, gpus_per_node, tokens=1.0, measured={},
                   billing_per_node_hour=None)


# The registry's strategy (and FSDP's reshard_after_forward) for what a series names: ZeRO-2
# (SHARD_GRAD_OP) keeps parameters gathered from forward to backward; the JAX recipes shard the
# model over 16 nodes or 128 GPUs and replicate beyond: fsdp with that shard group
# (_shard_group, from each point's `sharding`).
_STRATEGY = {"fsdp": ("fsdp", True), "fsdp+dp": ("fsdp", True),
             "fsdp_shard_grad_op": ("fsdp", False)}


def series_checks(path: Path = PUBLISHED_SERIES, most_ratio: float = 8.0,
                  same_settings: bool = True, rank_spread: float | None = None) -> list[dict]:
    """Each published series fitted at its smallest scale and predicted at each larger one up
    to `most_ratio` times it: one row per point (series, source, ratio, predicted and published
    tokens/s per GPU, the error, the interval's bounds and whether it holds the figure).
    `same_settings`: a point is predicted only from a fit with the same per-GPU settings, as
    the checks require (see _setting_groups); False fits every series at its smallest point.
    `rank_spread`: a spread of the ranks' work to assume (bench/forecast_spread.py asks what
    one would do; the checks themselves assume none, as no table gives one)."""
    from hpcdp.config import build

    figures, data = _read_series(path)
    networks = {name: network_from_profile(build(NetworkConfig, given["network"],
                                                 f"networks.{name}"), name)
                for name, given in figures.items()}
    rows = []
    for name, case in data.items():
        gpn = int(case["gpus_per_node"])
        params, d = float(case["params"]), int(case["d_model"])
        embeddings = int(case["vocab"]) * d * (1 if case.get("tied_embeddings", True) else 2)
        model = Model(n_params=int(params), grad_bytes=int(params * 4),
                      param_gather_bytes=int(params * 2), units=int(case["n_layer"]) + 1,
                      block_share=1 - embeddings / params)
        tokens = int(case["micro_batch_per_gpu"]) * int(case["seq_len"])
        strategy, reshard = _STRATEGY[case["strategy"]]
        groups = _setting_groups(case["points"], gpn) if same_settings \
            else [sorted(case["points"], key=lambda p: p["gpus"])]
        for first, *later in groups:
            for point in later:
                ratio = point["gpus"] / first["gpus"]
                if ratio > most_ratio:
                    continue
                p = _per_gpu(strategy, model, networks[case["network"]], gpn, tokens,
                             int(first["gpus"]), float(first["tokens_per_s_per_gpu"]),
                             int(point["gpus"]), reshard, _shard_group(first, gpn),
                             rank_spread)
                published = float(point["tokens_per_s_per_gpu"])
                rows.append({"series": name, "source": case["source_group"],
                             "fit_gpus": int(first["gpus"]), "gpus": int(point["gpus"]),
                             "ratio": ratio, "predicted": p.tokens_per_s / point["gpus"],
                             "published": published,
                             "error": p.tokens_per_s / point["gpus"] / published - 1})
    for row in rows:
        row["low"], row["high"] = _interval(row, rows)
        row["inside"] = (None if row["low"] is None
                         else row["low"] <= row["published"] <= row["high"])
    return rows


def _read_series(path: Path) -> tuple[dict, dict]:
    """(the node types' network figures, the series) of the published series' file."""
    from hpcdp.config import read_yaml

    data = read_yaml(Path(path), "published series")
    return data.pop("networks"), data


def _shard_group(point: dict, gpus_per_node: int) -> int | None:
    """GPUs one copy of the model is sharded over at a point whose `sharding` says so ('FSDP=128
    x DP=4': 128; 'FSDP=16 nodes x DP=2': 16 nodes); None where it is every GPU."""
    found = re.match(r"FSDP=(\d+)( nodes)?", point.get("sharding") or "")
    if not found:
        return None
    group = int(found[1]) * (gpus_per_node if found[2] else 1)
    return group if group < int(point["gpus"]) else None


def _setting_groups(points: list[dict], gpus_per_node: int) -> list[list[dict]]:
    """A series' points by their per-GPU settings beyond what a series fixes (model,
    micro-batch, sequence, precision, checkpointing, GPU), each group by GPU count: a group's
    smallest point is the fit for the others; a point alone in its group is predicted from
    nothing. Two settings change within series: llm-foundry's gradient accumulation (2-8
    micro-batches per step at the smallest scale, fewer beyond, which changes how much of a
    step the optimizer takes per token), and the JAX recipes' sharding, over every GPU up to
    128 or 256 and over 128 (16 nodes) with replicas beyond."""
    groups: dict[tuple, list[dict]] = {}
    for point in sorted(points, key=lambda p: p["gpus"]):
        key = (point.get("grad_accum"), _shard_group(point, gpus_per_node))
        groups.setdefault(key, []).append(point)
    return list(groups.values())


def series_set_aside(path: Path = PUBLISHED_SERIES) -> list[tuple[str, int]]:
    """(series, GPUs) of every published point that shares its per-GPU settings with no other
    point of its series: neither fitted nor predicted."""
    _, data = _read_series(path)
    return [(name, int(group[0]["gpus"])) for name, case in data.items()
            for group in _setting_groups(case["points"], int(case["gpus_per_node"]))
            if len(group) == 1]


INTERVAL = 0.90


def _interval(row: dict, rows: list[dict]) -> tuple[float | None, float | None]:
    """A published series has one figure per scale, so no spread of its own: its interval is
    the model's known error, measured on the OTHER series (leave one series out, so that no
    figure widens or centres its own interval; leaving a whole source out would leave
    llm-foundry's series, most of them, too few others). Errors grow with the distance from
    the fit, so each is taken per doubling of the GPUs (error / log2 ratio): every other
    figure, at 2x, 4x or 8x, then counts for every ratio, some 65 errors rather than the 7-35
    at one ratio, whose extremes alone would set the bounds. Their conformal bounds, times
    log2 of this figure's ratio; None under 10 other errors."""
    bounds = _conformal_bounds([r["error"] / math.log2(r["ratio"]) for r in rows
                                if r["series"] != row["series"]])
    if bounds is None:
        return None, None
    doublings = math.log2(row["ratio"])
    low_err, high_err = bounds[0] * doublings, bounds[1] * doublings
    return row["predicted"] / (1 + high_err), row["predicted"] / max(1 + low_err, 1e-9)


def _conformal_bounds(values: list[float]) -> tuple[float, float] | None:
    """Of n values, the floor((n+1) x 0.05)-th and the ceil((n+1) x 0.95)-th smallest, which
    hold a new exchangeable value with at least 90% probability; None under 10 values."""
    values, n = sorted(values), len(values)
    if n < 10:
        return None
    tail = (1 - INTERVAL) / 2
    return (values[max(1, math.floor((n + 1) * tail)) - 1],
            values[min(n, math.ceil((n + 1) * (1 - tail))) - 1])


@functools.cache
def known_error_per_doubling(path: Path = PUBLISHED_SERIES) -> tuple[float, float]:
    """The model's error per doubling of the GPUs beyond its fit, over every published figure
    (series_checks, error / log2 ratio), as its 90% conformal bounds (low, high): what a
    forecast beyond its fit adds to its interval. (-1.1%, +4.2%) on the series the project
    holds: the truth lies mostly below the point."""
    bounds = _conformal_bounds([r["error"] / math.log2(r["ratio"])
                                for r in series_checks(path)])
    assert bounds is not None, f"{path} holds under 10 published figures"
    return bounds


def series_summary(rows: list[dict]) -> dict:
    """What docs/forecast.md reports of series_checks: counts, the point's errors from 2x to 8x
    (median |error|, largest, how many above and below), and the intervals' coverage."""
    import statistics

    errors = [r["error"] for r in rows if 2 <= r["ratio"] <= 8]
    judged = [r for r in rows if r["inside"] is not None]
    return {"series": len({r["series"] for r in rows}),
            "sources": len({r["source"] for r in rows}), "points": len(rows),
            "median_abs_error": statistics.median(abs(e) for e in errors) if errors else None,
            "largest_abs_error": max((abs(e) for e in errors), default=None),
            "above": sum(e > 0 for e in errors), "below": sum(e < 0 for e in errors),
            "with_interval": len(judged),
            "coverage": sum(r["inside"] for r in judged) / len(judged) if judged else None,
            "median_half_width": _median_half_width(judged),
            "median_half_width_4x": _median_half_width([r for r in judged if r["ratio"] == 4])}


def _median_half_width(rows: list[dict]) -> float | None:
    import statistics

    return statistics.median((r["high"] - r["low"]) / 2 / r["predicted"] for r in rows) \
        if rows else None


def series_scale_table(rows: list[dict]) -> str:
    """series_summary per scale ratio and over all, as docs/forecast.md shows it."""
    import statistics

    lines = ["| scale | figures | median error (median abs) | largest abs | above / below "
             "| 90% interval holds | median half-width |", "|---|---|---|---|---|---|---|"]
    for ratio in sorted({r["ratio"] for r in rows}) + [None]:
        some = [r for r in rows if ratio is None or r["ratio"] == ratio]
        s = series_summary(some)
        median = statistics.median(r["error"] for r in some)
        lines.append(f"| {'all' if ratio is None else f'{ratio:g}x'} | {s['points']} | "
                     f"{median:+.1%} ({s['median_abs_error']:.1%}) | "
                     f"{s['largest_abs_error']:.1%} | {s['above']} / {s['below']} | "
                     f"{s['coverage']:.0%} | {s['median_half_width']:.1%} |")
    return "\n".join(lines) + "\n"


def series_table(rows: list[dict]) -> str:
    """Every figure of series_checks as a markdown table (docs/forecast.md holds it, and a
    test that it is this one): series, GPUs fitted and predicted, predicted and published
    tokens/s per GPU, the error and the interval."""
    lines = ["| series | GPUs (fitted at) | predicted | published | error | 90% interval | holds |",
             "|---|---|---|---|---|---|---|"]
    for r in sorted(rows, key=lambda r: (r["source"], r["series"], r["gpus"])):
        interval = (f"{r['low']:,.0f}-{r['high']:,.0f}" if r["low"] is not None else "-")
        lines.append(f"| {r['series']} | {r['gpus']} ({r['fit_gpus']}) | {r['predicted']:,.0f} "
                     f"| {r['published']:,.0f} | {r['error']:+.1%} | {interval} | "
                     f"{'-' if r['inside'] is None else 'yes' if r['inside'] else 'no'} |")
    return "\n".join(lines) + "\n"
