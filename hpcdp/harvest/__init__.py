"""`hpcdp harvest`: read run directories, ask Slurm once, print the comparison, write plots.

    harvest(paths, target_loss=None) -> list[RunResult]     the library entry
    collect(paths, ...) -> Harvest                          the same, with target and accounting
    add_arguments(parser); main(args) -> int                the CLI (wired in hpcdp/cli.py)

No torch; matplotlib only when plots are written. Columns and rules: docs/harvest.md.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from hpcdp import job_end, slurm
from hpcdp.errors import (
    UsageError,
    check_out_folder,
    did_you_mean,
    one_line,
    positive_number,
)
from hpcdp.harvest import layout, repeats
from hpcdp.harvest.read import (
    MetricsLog,
    StepColumns,
    find_baselines,
    find_run_dirs,
    read_metrics,
    read_submission,
    scan_slurm_logs,
)
from hpcdp.harvest.table import (
    RunResult,
    baseline_lines,
    fill_comparisons,
    render_csv,
    render_json,
    render_markdown,
    render_table,
    short_name,
    state_from_log,
    summarize_log,
)
from hpcdp.run_folder import METRICS_FILE

__all__ = ["FORMATS", "Harvest", "RunResult", "add_arguments", "collect", "harvest", "main",
           "write_outputs"]

FORMATS = ("table", "markdown", "csv", "json")


@dataclass
class Harvest:
    runs: list[RunResult]
    target_loss: float | None
    accounting: dict = field(default_factory=dict)
    """{"queried": bool, "available": bool|None, "message": str}."""
    cells: list = field(default_factory=list)
    """repeats.Cell per (strategy, nodes, ...) over its finished repeats."""
    baseline: list = field(default_factory=list)
    """The network-baseline probes of a campaign (allreduce.json records)."""
    campaigns: dict = field(default_factory=dict)
    """campaign.json of each campaign source, by its folder."""
    verdicts: list = field(default_factory=list)
    """repeats.verdicts(cells): one per source, comparison group, node count and conditions."""


CAMPAIGN_FILE = "campaign.json"  # hpcdp.campaign.CAMPAIGN_FILE, without importing render


def source_of(run_dir: Path) -> str:
    """The population a run belongs to: the campaign folder holding it
    (<campaign>/<strategy>-<N>n/repeat-<k>, beside campaign.json), else "" (a separate job)."""
    campaign = run_dir.absolute().parent.parent
    return str(campaign) if (campaign / CAMPAIGN_FILE).is_file() else ""


def campaign_record(folder: str) -> dict:
    """campaign.json of a campaign folder ({} where it cannot be read)."""
    import json

    try:
        record = json.loads((Path(folder) / CAMPAIGN_FILE).read_text())
    except (OSError, ValueError):
        return {}
    return record if isinstance(record, dict) else {}


def _job_id(log: MetricsLog, submission: dict) -> str | None:
    """The job of the last segment (the header knows it), else what hpcdp submit recorded."""
    for segment in reversed(log.segments):
        job = segment.header.get("slurm_job_id")
        if job not in (None, ""):
            return str(job)
    job = submission.get("job_id")
    return str(job) if job not in (None, "") else None


# States read from metrics.jsonl alone that mean the run is over (state_from_log).
_ENDED_BY_LOG = ("INCOMPLETE", "COMPLETED-by-log")


def _notes(r: RunResult, log: MetricsLog, info, scan) -> list[str]:
    notes = []
    if r.restarts:
        notes.append(f"requeued/resumed {r.restarts}x ({r.segments} segments)")
    if scan.node_failure:  # why Slurm requeued it: not a failure of the strategy
        notes.append(scan.node_failure)
    if log.corrupt_lines:
        recovered = (f", {log.recovered_records} record(s) recovered"
                     if log.recovered_records else "")
        notes.append(f"{log.corrupt_lines} corrupt line(s) skipped{recovered}")
    if log.truncated:
        notes.append("last line cut mid-write")
    if not log.segments or not log.header:
        notes.append("no header record")
    if r.steps == 0:
        notes.append("no step records")
    # One note for every run that ended short of its plan, whether training wrote an
    # "interrupted" summary (a signal) or nothing (killed, cut file).
    ended = slurm.is_terminal(r.state) or r.state in _ENDED_BY_LOG
    short = (r.last_step < r.planned_steps if r.planned_steps and r.last_step is not None
             else log.summary is None or log.summary.get("status") != "completed")
    if ended and r.steps and short:
        of = f" of {r.planned_steps}" if r.planned_steps else ""
        notes.append(f"stopped at step {r.last_step}{of}")
    if r.state == "ENDING":
        notes.append("state provisional (sacct not final yet)")
    said = job_end.out_of_memory("", r.state)  # sacct's OUT_OF_MEMORY, where the log had none
    oom = scan.out_of_memory or (said.line() if said else None)
    if oom:  # the cause: the peers' tracebacks and exit codes follow from it
        return [*notes, oom]
    if info is not None and info.source == "sacct":
        if r.state == "FAILED" or (r.exit_code not in (None, 0) and r.state != "COMPLETED"):
            notes.append(f"failed with exit code {r.exit_code}")
        elif info.signal:
            notes.append(f"ended by signal {info.signal}")
        if r.state == "COMPLETED" and log.summary is None:
            notes.append("Slurm says COMPLETED but metrics.jsonl has no summary")
    if scan.last_exception:
        notes.append(f"{scan.last_exception_file}: {scan.last_exception}")
    elif scan.tracebacks:
        notes.append(f"{scan.last_traceback_file}: traceback")
    if scan.error_lines and not scan.last_exception:
        notes.append(f"{scan.error_lines} error line(s) in slurm log, first: {scan.first_error}")
    return notes


def _read_run(run_dir: Path) -> tuple[RunResult, MetricsLog]:
    log = read_metrics(run_dir / METRICS_FILE)
    r = summarize_log(run_dir, log)
    log.columns, log.order = StepColumns(), []  # the numbers are in r now: free the rows
    r.job_id = _job_id(log, read_submission(run_dir))
    return r, log


# Below this many runs, starting worker processes costs more than it saves.
_PARALLEL_FROM_RUNS = 8


def _read_runs(run_dirs: list[Path]) -> list[tuple[RunResult, MetricsLog]]:
    """Read runs, in worker processes when there are many: parsing is CPU-bound Python and runs
    are independent (bench/harvest_bench.py measures the difference)."""
    workers = min(os.cpu_count() or 1, 8, len(run_dirs))
    if workers < 2 or len(run_dirs) < _PARALLEL_FROM_RUNS:
        return [_read_run(d) for d in run_dirs]
    from concurrent.futures import ProcessPoolExecutor

    with ProcessPoolExecutor(max_workers=workers) as pool:
        return list(pool.map(_read_run, run_dirs, chunksize=4))


def collect(paths: list[Path], target_loss: float | None = None, *, query_slurm: bool = True,
            env: Mapping[str, str] | None = None, now: float | None = None) -> Harvest:
    """Read every run under `paths`, ask Slurm once for all their jobs, fill the comparison.

    now: the time at which runs without Slurm's word are judged (RUNNING-by-log while their
    last record is recent); default: the current time.
    """
    run_dirs = find_run_dirs([Path(p) for p in paths])
    logs = _read_runs(run_dirs)
    job_ids = [r.job_id for r, _ in logs if r.job_id]
    infos: dict = {}
    accounting: dict = {"queried": False, "available": None, "message": ""}
    if query_slurm and job_ids:
        table = slurm.query_jobs(job_ids, env=env)  # one squeue + one sacct for all runs
        infos = dict(table)
        accounting = {"queried": True, "available": table.accounting_available,
                      "message": table.accounting_message}
    results = []
    for r, log in logs:
        job, run_dir = r.job_id, Path(r.run_dir)
        r.source = source_of(run_dir)
        info = infos.get(job) if job else None
        if r.source:
            # A campaign's cell: its job is the campaign's, whose state, exit code and restart
            # count are every cell's at once. The run's own log and segments tell its own.
            r.state = state_from_log(r, log, now)
            if r.state == "RUNNING-by-log" and info is not None and slurm.is_terminal(info.state):
                r.state = "INCOMPLETE"
            r.restarts = r.segments - 1 if r.segments else 0
            info = None
        elif info is not None and info.source != "none":
            r.state, r.state_source, r.exit_code = info.state, info.source, info.exit_code
            r.restarts = max(r.restarts, info.restarts or 0)
            r.max_rss = info.max_rss
        else:
            r.state = state_from_log(r, log, now)
        # Logs of every job that wrote this run (a requeue keeps the id; a resubmission not).
        jobs = [str(s.header["slurm_job_id"]) for s in log.segments
                if s.header.get("slurm_job_id") not in (None, "")]
        scan = scan_slurm_logs(run_dir, jobs or ([job] if job else None))
        r.notes = _notes(r, log, info, scan)
        results.append(r)
    results.sort(key=RunResult.key)
    used_target = fill_comparisons(results, target_loss,
                                   name_of=lambda r: short_name(r.run_dir, run_dirs))
    cells, baseline = repeats.cells_of(results), find_baselines([Path(p) for p in paths])
    repeats.attach_baseline(cells, baseline)
    campaigns = {c.source: campaign_record(c.source) for c in cells if c.source}
    return Harvest(runs=results, target_loss=used_target, accounting=accounting, cells=cells,
                   baseline=baseline, campaigns=campaigns,
                   verdicts=repeats.verdicts(cells, repeats.network_changes(baseline)))


def harvest(paths: list[Path], target_loss: float | None = None, *, query_slurm: bool = True,
            env: Mapping[str, str] | None = None, now: float | None = None) -> list[RunResult]:
    """One RunResult per run directory under `paths` (run dirs or roots searched recursively).

    target_loss: loss for "time to target"; None: the highest final loss among the runs.
    query_slurm: ask squeue/sacct (once for all runs) for job states; False: metrics only.
    """
    return collect(paths, target_loss, query_slurm=query_slurm, env=env, now=now).runs


def _check_format(fmt: str) -> None:
    if fmt not in FORMATS:
        raise UsageError(f"--format {fmt!r} is not valid{did_you_mean(fmt, FORMATS)}; "
                         f"valid: {', '.join(FORMATS)}")


def render(result: Harvest, fmt: str, width: int | None = None) -> str:
    """The harvest in `fmt`; a table within `width` characters (None: every column, as
    table.md and table.csv have them)."""
    _check_format(fmt)
    if fmt == "table":
        text = render_table(result.runs, width)
        if result.target_loss is not None:
            text += f"\n\ntarget loss for 'time to target': {result.target_loss:.4f}"
        for line in baseline_lines(result.runs):
            text += f"\n{line}"
        return layout.wrap_text(text + _campaign_text(result, False, width), width) + "\n"
    if fmt == "markdown":
        text = render_markdown(result.runs, result.target_loss)
        return text + _campaign_text(result, True) + "\n"
    if fmt == "csv":
        return render_csv(result.runs)
    return render_json(result.runs, result.target_loss, result.accounting,
                       cells=[c.to_dict() for c in result.cells],
                       verdict=result.verdicts, baseline=result.baseline)


def _campaign_text(result: Harvest, markdown: bool, width: int | None = None) -> str:
    """Under the per-run table: the network baseline and the cells over repeats, if any."""
    text = ""
    if result.baseline:
        text += "\n\n" + repeats.render_baseline(result.baseline, markdown, width)
    if repeats.has_repeats(result.cells):
        text += "\n\n" + repeats.render_text(result.cells, markdown, result.campaigns,
                                                   result.verdicts, width)
    return text


def write_outputs(result: Harvest, out_dir: Path, plots: bool = True) -> list[Path]:
    """OUT/table.md, table.csv, runs.json and (plots) throughput_vs_nodes.png, loss_vs_time.png,
    and memory_vs_throughput.png where runs recorded their memory."""
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UsageError(
            f"--out {str(out_dir)!r} cannot be created: {exc.strerror or exc}") from None
    written = []
    for name, text in (("table.md", render(result, "markdown")),
                       ("table.csv", render(result, "csv")),
                       ("runs.json", render(result, "json"))):
        path = out_dir / name
        path.write_text(text)
        written.append(path)
    if plots:
        from hpcdp.harvest import plots as figures

        written.append(figures.throughput_vs_nodes(result.runs,
                                                   out_dir / "throughput_vs_nodes.png"))
        written.append(figures.loss_vs_time(result.runs, out_dir / "loss_vs_time.png",
                                            result.target_loss))
        memory = figures.memory_vs_throughput(result.runs, out_dir / "memory_vs_throughput.png")
        if memory:
            written.append(memory)
    return written


def _target(text: str | None) -> float | None:
    if text is None:
        return None
    return positive_number(text, f"--target-loss {one_line(text)!r} must be a positive number, "
                           "e.g. 3.5")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of `hpcdp harvest` (values are checked in main, for one-line errors)."""
    parser.add_argument("paths", nargs="+", metavar="PATH",
                        help="run directories (holding metrics.jsonl) or folders searched "
                             "recursively, e.g. runs/paper")
    parser.add_argument("--format", "-f", default="table", metavar="FORMAT",
                        help=f"stdout format: {', '.join(FORMATS)} (default: table)")
    parser.add_argument("--out", "-o", metavar="DIR",
                        help="also write table.md, table.csv, runs.json and the plots here")
    parser.add_argument("--target-loss", metavar="LOSS",
                        help="loss for 'time to target' (default: the highest final loss among "
                             "the runs, so every run has a time)")
    parser.add_argument("--no-slurm", action="store_true",
                        help="do not ask squeue/sacct; states come from the metrics files")
    parser.add_argument("--no-plots", action="store_true", help="with --out: skip the PNGs")
    parser.add_argument("--wide", action="store_true",
                        help="print every column of the tables, however wide (default: the "
                             "columns that fit the terminal, COLUMNS; a file or pipe gets all)")
    parser.add_argument("--to", nargs=2, metavar=("TRACKER", "DIR"),
                        help="also export the runs into a tracker under DIR: tensorboard (event "
                             "files) or mlflow (a file store); runs already there are skipped")


def main(args: argparse.Namespace) -> int:
    """Run `hpcdp harvest` from parsed arguments; returns the exit code."""
    fmt = args.format
    _check_format(fmt)
    target = _target(args.target_loss)
    if args.out:
        check_out_folder(Path(args.out))
    if args.to:
        from hpcdp.harvest import to_tracker
        tracker, dest = args.to
        done, found = to_tracker.export([Path(p) for p in args.paths], tracker, Path(dest),
                                       lambda line: print(line, file=sys.stderr))
        print(f"exported {done} of {found} run(s) to {tracker} under {dest}", file=sys.stderr)
    result = collect([Path(p) for p in args.paths], target, query_slurm=not args.no_slurm)
    if result.accounting.get("available") is False:
        print(f"hpcdp: Slurm accounting unavailable ({result.accounting['message']}); "
              "states of ended jobs come from the metrics files", file=sys.stderr)
    sys.stdout.write(render(result, fmt, None if args.wide else layout.terminal_width()))
    if args.out:
        for path in write_outputs(result, Path(args.out), plots=not args.no_plots):
            print(f"wrote {path}", file=sys.stderr)
    return 0
