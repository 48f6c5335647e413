"""The two figures: throughput vs nodes (per strategy) and loss vs training time (per run).

matplotlib is imported here only, when a figure is drawn, and through its object API with the
Agg canvas: no pyplot state, no display needed, nothing global switched.
"""

from __future__ import annotations

from pathlib import Path

from hpcdp.errors import UsageError
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
    return label


def throughput_vs_nodes(results: list[RunResult], path: Path) -> Path:
    """tokens/s against nodes, one line per (strategy, precision); the ideal line is dashed."""
    fig = _figure()
    ax = fig.add_subplot(1, 1, 1)
    groups: dict[tuple, list[RunResult]] = {}
    for r in results:
        if r.tokens_per_s is not None and r.nodes:
            groups.setdefault((r.experiment, r.strategy, r.precision), []).append(r)
    several_experiments = len({k[0] for k in groups}) > 1
    for (experiment, _strategy, _precision), runs in groups.items():
        runs.sort(key=lambda r: r.nodes)
        label = _label(runs[0], with_nodes=False)
        if several_experiments:
            label = f"{experiment}: {label}"
        line, = ax.plot([r.nodes for r in runs], [r.tokens_per_s for r in runs], marker="o",
                        label=label)
        one = next((r for r in runs if r.nodes == 1), None)
        if one is not None and len(runs) > 1:  # ideal linear scaling from the 1-node run
            xs = [r.nodes for r in runs]
            ax.plot(xs, [one.tokens_per_s * n for n in xs], linestyle=":", color=line.get_color(),
                    alpha=0.5)
    nodes = sorted({r.nodes for rs in groups.values() for r in rs})
    if nodes:
        ax.set_xticks(nodes)
    ax.set_xlabel("nodes")
    ax.set_ylabel("throughput (tokens/s, median of steady steps)")
    ax.set_title("Throughput vs nodes (dotted: linear scaling from 1 node)")
    ax.grid(True, alpha=0.3)
    if groups:
        ax.legend(fontsize="small")
    fig.tight_layout()
    fig.savefig(path)
    return path


def loss_vs_time(results: list[RunResult], path: Path, target_loss: float | None) -> Path:
    """Training loss against training time, one line per run (the paper's comparison)."""
    fig = _figure()
    ax = fig.add_subplot(1, 1, 1)
    labels = [_label(r, with_nodes=True) for r in results]
    drawn = 0
    for r, label in zip(results, labels):
        if not r.curve_loss:
            continue
        if labels.count(label) > 1:  # two runs of one configuration: name their folders
            label += f" ({Path(r.run_dir).name})"
        ax.plot(r.curve_time_s, r.curve_loss, linewidth=1.0,
                label=label)
        drawn += 1
    if target_loss is not None:
        ax.axhline(target_loss, linestyle="--", color="grey", linewidth=0.8,
                   label=f"target {target_loss:.3f}")
    ax.set_xlabel("training time (s, summed over segments)")
    ax.set_ylabel("training loss")
    ax.set_title("Loss vs time")
    ax.grid(True, alpha=0.3)
    if drawn:
        ax.legend(fontsize="x-small", ncol=2)
    fig.tight_layout()
    fig.savefig(path)
    return path
