"""The figures: throughput vs nodes (per strategy), loss vs training time (per cell), and memory
per rank against throughput (per node count: the trade sharding makes).

matplotlib is imported here only, when a figure is drawn, and through its object API with the
Agg canvas: no pyplot state, no display needed, nothing global switched.
"""

from __future__ import annotations

from pathlib import Path

from hpcdp.errors import UsageError
from hpcdp.harvest import stats
from hpcdp.harvest.table import RunResult


def _figure():
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError:
        raise UsageError("plots need matplotlib: pip install 'hpcdp[harvest]' "
                         "(or use --no-plots)") from None
    fig = Figure(figsize=(7.5, 4.8), dpi=120)
    FigureCanvasAgg(fig)
    return fig


def _label(r: RunResult, with_nodes: bool) -> str:
    label = f"{r.strategy or '?'}"
    if r.precision and r.precision != "fp32":
        label += f" ({r.precision})"
    if with_nodes:
        label += f" {r.nodes}n"
        if r.world_size and r.nodes and r.world_size != r.nodes:
            label += f"/{r.world_size}"
    return label


def _span(interval) -> tuple[float, float]:
    return interval.low, interval.high


def throughput_vs_nodes(results: list[RunResult], path: Path) -> Path:
    """tokens/s against nodes, one line per (strategy, precision, ranks per node) through the
    median of each point's runs, with its 95% interval as error bars where a point has repeats
    (each repeat a hollow marker); dotted: linear scaling from 1 node."""
    fig = _figure()
    ax = fig.add_subplot(1, 1, 1)
    groups: dict[tuple, list[RunResult]] = {}
    for r in results:  # results come sorted: the first run of a point is the one compared
        if r.tokens_per_s is not None and r.nodes:
            groups.setdefault((r.experiment, r.source, r.strategy, r.precision,
                               r.tasks_per_node()), []).append(r)
    several_experiments = len({k[0] for k in groups}) > 1
    several_sources = len({k[1] for k in groups}) > 1  # campaigns and separate jobs: apart
    for (experiment, source, _strategy, _precision, per_node), runs in groups.items():
        by_nodes: dict[int, list[float]] = {}
        for r in runs:
            by_nodes.setdefault(r.nodes, []).append(r.tokens_per_s)
        xs = sorted(by_nodes)
        ys = [stats.median(by_nodes[n]) for n in xs]
        intervals = [_span(stats.median_interval(by_nodes[n])) for n in xs]
        label = _label(runs[0], with_nodes=False)
        if per_node and per_node > 1:
            label += f", {per_node}/node"
        if several_experiments:
            label = f"{experiment}: {label}"
        if several_sources:
            label += f" [{Path(source).name if source else 'separate jobs'}]"
        # Repeats: the median with its 95% interval (the range below 6 runs) as error bars,
        # each repeat a hollow marker.
        line = ax.errorbar(xs, ys, yerr=[[y - lo for y, (lo, _) in zip(ys, intervals)],
                                         [hi - y for y, (_, hi) in zip(ys, intervals)]],
                           marker="o", capsize=3, label=label).lines[0]
        spread = [(n, v) for n in xs if len(by_nodes[n]) > 1 for v in by_nodes[n]]
        if spread:
            ax.plot([n for n, _ in spread], [v for _, v in spread], marker="o", linestyle="none",
                    markerfacecolor="none", color=line.get_color(), alpha=0.6)
        if 1 in by_nodes and len(xs) > 1:
            ax.plot(xs, [ys[0] * n for n in xs], linestyle=":", color=line.get_color(),
                    alpha=0.5)
    nodes = sorted({r.nodes for rs in groups.values() for r in rs})
    if nodes:
        ax.set_xticks(nodes)
    ax.set_xlabel("nodes")
    ax.set_ylabel("tokens/s (median of steady steps; runs: median, 95% interval or range)")
    ax.set_title("Throughput vs nodes (dotted: linear scaling from 1 node)")
    ax.grid(True, alpha=0.3)
    if groups:
        ax.legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.01, 1.0))
    fig.savefig(path, bbox_inches="tight")
    return path


def memory_vs_throughput(results: list[RunResult], path: Path) -> Path | None:
    """Memory per rank against tokens/s, one panel per node count, one point per (source,
    strategy, precision) at the medians of its runs; None (nothing drawn) when no run
    recorded its memory. Lower right is better: less memory, more throughput."""
    groups: dict[tuple, list[RunResult]] = {}
    for r in results:
        if r.tokens_per_s is not None and r.peak_mem_gb is not None and r.nodes:
            groups.setdefault((r.nodes, r.source, r.strategy, r.precision), []).append(r)
    if not groups:
        return None
    nodes = sorted({k[0] for k in groups})
    several_sources = len({k[1] for k in groups}) > 1
    fig = _figure()
    fig.set_size_inches(max(7.5, 4.2 * len(nodes)), 4.8)
    measured = sorted({r.memory_measured for rs in groups.values() for r in rs
                       if r.memory_measured})
    for i, n in enumerate(nodes, start=1):
        ax = fig.add_subplot(1, len(nodes), i)
        for (k_nodes, source, _strategy, _precision), runs in groups.items():
            if k_nodes != n:
                continue
            label = _label(runs[0], with_nodes=False)
            if several_sources:
                label += f" [{Path(source).name if source else 'separate jobs'}]"
            ax.plot(stats.median([r.tokens_per_s for r in runs]),
                    stats.median([r.peak_mem_gb for r in runs]), marker="o", linestyle="none",
                    label=label)
        ax.set_title(f"{n} node(s)")
        ax.set_xlabel("tokens/s (median of runs)")
        ax.set_ylabel(f"memory per rank, GB ({', '.join(measured) or 'peak'}; largest rank)")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize="x-small")
    fig.suptitle("Memory per rank vs throughput (lower right is better)")
    fig.savefig(path, bbox_inches="tight")
    return path


LEGEND_ROWS = 20  # a longer legend goes into more columns, so the image keeps its height


def loss_vs_time(results: list[RunResult], path: Path, target_loss: float | None) -> Path:
    """Training loss against training time, one line per run (the paper's comparison)."""
    loss_vs_time_figure(results, target_loss).savefig(path, bbox_inches="tight")
    return path


def loss_vs_time_figure(results: list[RunResult], target_loss: float | None):
    """One colour and one legend entry per cell (strategy, precision, nodes): a campaign's
    repeats share theirs, so that 300 runs make a legend of their cells, not of 300 lines."""
    fig = _figure()
    ax = fig.add_subplot(1, 1, 1)
    cells: dict[str, list[RunResult]] = {}
    for r in results:
        if r.curve_loss:
            cells.setdefault(_label(r, with_nodes=True), []).append(r)
    colours = [f"C{i}" for i in range(10)]
    styles = ["-", "--", ":", "-."]  # past ten cells, the colours repeat with another line
    for i, (label, runs) in enumerate(cells.items()):
        colour, style = colours[i % len(colours)], styles[(i // len(colours)) % len(styles)]
        for j, r in enumerate(runs):
            ax.plot(r.curve_time_s, r.curve_loss, linewidth=1.0, color=colour, linestyle=style,
                    alpha=1.0 if len(runs) == 1 else 0.6,
                    label=(f"{label} ({len(runs)} runs)" if len(runs) > 1 else label)
                    if j == 0 else None)
    if target_loss is not None:
        ax.axhline(target_loss, linestyle="--", color="grey", linewidth=0.8,
                   label=f"target {target_loss:.3f}")
    ax.set_xlabel("training time (s, summed over segments)")
    ax.set_ylabel("training loss")
    ax.set_title("Loss vs time")
    ax.grid(True, alpha=0.3)
    if cells:  # beside the axes: with a dozen runs it would hide the curves
        entries = len(cells) + (target_loss is not None)
        ax.legend(fontsize="x-small", loc="upper left", bbox_to_anchor=(1.01, 1.0),
                  ncol=-(-entries // LEGEND_ROWS))
    return fig
