"""The `hpcdp` command. Thin: parses arguments and calls the modules that do the work.

Start-up must stay fast: nothing here imports torch or transformers (a test checks it).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shlex
import sys
import time
from pathlib import Path

from hpcdp import __version__, config, run_folder, strategies
from hpcdp.errors import (
    CLI_NAME,
    VIA_CLI,
    ArgumentParser,
    ConfigErrors,
    UsageError,
    check_out_folder,
    one_line,
    positive_float,
    positive_int,
    positive_number,
)

DEFAULT_CLUSTER = "local"
DEFAULT_EXPERIMENT = "smoke"


def _add_selection(parser: argparse.ArgumentParser, strategy_required: bool = False,
                   one_cell: bool = True) -> None:
    """The options that pick profile, experiment and output; one_cell: --strategy, --nodes."""
    parser.add_argument("--cluster", "-c", default=os.environ.get("HPCDP_CLUSTER", DEFAULT_CLUSTER),
                        help="cluster profile: a shipped name (local, generic-gpu) or a YAML path "
                             "(default: $HPCDP_CLUSTER or local)")
    parser.add_argument("--experiment", "-e",
                        help="experiment: a shipped name (smoke, paper) or a YAML path "
                             f"(default: {DEFAULT_EXPERIMENT})")
    if one_cell:
        parser.add_argument("--strategy", "-s", required=strategy_required,
                            help=f"one of {', '.join(strategies.NAMES)} "
                                 f"(or {strategies.alias_hint()}); "
                                 "without it: the experiment's whole matrix")
        parser.add_argument("--nodes", "-N", type=int,
                            help="node count (with --strategy; default 1)")
        parser.add_argument("--resume-from", metavar="RUN_DIR",
                            help="continue the run in RUN_DIR from its newest checkpoint, in "
                                 "this job's own run folder: on another number of nodes or "
                                 "ranks, micro_batch_size set to keep its global batch")
    else:
        parser.set_defaults(strategy=None, nodes=None)
    parser.add_argument("--set", dest="overrides", action="append", default=[],
                        metavar="SECTION.KEY=VALUE",
                        help="override any field, e.g. train.steps=10 or cluster.partition=gpu")
    parser.add_argument("--out", help="output root for runs (default: the profile's output_dir)")
    parser.add_argument("--fresh", action="store_true",
                        help="a run folder that holds an earlier run: move it aside "
                             "(RUN_DIR.old-TIME) and start over, instead of continuing it")


def _load(args) -> tuple[config.ClusterProfile, config.Experiment]:
    """The profile and the experiment, with --set on top; the problems of both in one error,
    so that one run names them all."""
    cluster_over, experiment_over = config.split_overrides(args.overrides)
    resuming = getattr(args, "resume_from", None)
    problems: list[str] = []
    try:
        profile = config.load_profile(args.cluster, cluster_over)
    except UsageError as exc:
        if resuming:  # the earlier run's experiment is read for this profile's world
            raise
        problems += ConfigErrors.of(exc)
    else:
        if resuming:
            return profile, _continued_experiment(args, profile, experiment_over)
    try:
        experiment = config.load_experiment(args.experiment or DEFAULT_EXPERIMENT,
                                            experiment_over)
    except UsageError as exc:
        problems += ConfigErrors.of(exc)
    if problems:
        raise ConfigErrors(problems) from None
    return profile, experiment


def _continued_experiment(args, profile: config.ClusterProfile,
                          experiment_over: dict) -> config.Experiment:
    """--resume-from RUN_DIR: the earlier run's experiment, continued on this job's world
    (hpcdp/resume_from.py)."""
    from hpcdp import resume_from

    if args.experiment:
        raise UsageError("--resume-from continues the earlier run's own experiment; change its "
                         "settings with --set, not --experiment")
    if not args.strategy:
        raise UsageError("--resume-from needs --strategy (and --nodes): one job continues one "
                         "run")
    earlier = resume_from.read(Path(args.resume_from))
    spec = strategies.get(args.strategy)
    devices = getattr(args, "ranks", None) or profile.devices_per_node()
    world = (args.nodes or 1) * spec.tasks_per_node(devices)
    return config.load_experiment(str(earlier.run_dir / run_folder.EXPERIMENT_FILE),
                                  resume_from.overrides(earlier, world, experiment_over))


def _check_resume_from(args, jobs) -> None:
    """--resume-from: the rendered job continues the earlier run in a folder of its own."""
    if getattr(args, "resume_from", None):
        from hpcdp import resume_from

        earlier = resume_from.read(Path(args.resume_from))
        for job in jobs:
            resume_from.check(earlier, job.strategy, job.run_dir)


def _render_selection(args, profile, experiment, scripts_dir: Path | None = None,
                      one_node_only: bool = False):
    """Render the cells asked for; all validated before the caller writes anything."""
    from hpcdp import render

    if args.strategy:
        cells = [(strategies.get(args.strategy), 1 if args.nodes is None else args.nodes)]
    else:
        if args.nodes is not None:
            raise UsageError("--nodes needs --strategy; without --strategy the experiment's "
                             "matrix (matrix.nodes) decides the node counts")
        cells = experiment.matrix.cells(max_nodes=1 if one_node_only else None)
    jobs = []
    for strategy, nodes in cells:
        script_path = None
        if scripts_dir is not None:
            script_path = (scripts_dir / f"{render.job_name(experiment.name, strategy, nodes)}"
                           ".sbatch").absolute()
        jobs.append(render.render_job(profile, experiment, strategy, nodes,
                                      output_dir=args.out, script_path=script_path))
    return jobs


# ---------------------------------------------------------------------------------- commands

def cmd_render(args) -> int:
    from hpcdp import folder_checks, render, submit

    profile, experiment = _load(args)
    scripts_dir = Path(args.scripts_dir) if args.scripts_dir else None
    jobs = _render_selection(args, profile, experiment, scripts_dir)
    _check_resume_from(args, jobs)
    if args.stdout:
        for job in jobs:
            sys.stdout.write(job.text)
        return 0
    folder_checks.prepare(jobs, experiment, fresh=args.fresh)
    render.write_jobs(jobs, experiment)
    for job in jobs:
        submit.record_rendered(job, profile.name, experiment.name)  # jobs run from it by hand
        print(job.script_path)
    return 0


def _local_cluster_env(profile: config.ClusterProfile) -> None:
    """Point Slurm's commands at the local cluster's slurm.conf; say so when it is down."""
    if not profile.local_cluster:
        return
    from hpcdp import cluster

    if not cluster.is_up():
        raise UsageError(f"cluster profile {profile.name!r} is the local cluster, which is not "
                         "running; start it with: hpcdp cluster up")
    os.environ.update(cluster.slurm_env())


def _fallback_slurm_env() -> None:
    """For commands that read Slurm's accounting (status, harvest): with no SLURM_CONF and no
    system slurm.conf, use the local cluster's when it runs, as a user of it would expect."""
    if os.environ.get("SLURM_CONF") or Path("/etc/slurm/slurm.conf").exists():
        return
    from hpcdp import cluster

    if cluster.is_up():
        os.environ.update(cluster.slurm_env())


def _check_horovod(jobs, profile: config.ClusterProfile, controller: str | None = None) -> None:
    """Horovod strategies need Horovod where the job runs; checkable when that is this Python
    (not another interpreter, nor a container image's)."""
    if (profile.python or profile.container.active
            or not any(job.strategy.needs_horovod for job in jobs)):
        return
    from hpcdp import preflight

    preflight.check_horovod(controller or profile.horovod_controller)


def _warn_memory(jobs, profile: config.ClusterProfile, experiment: config.Experiment) -> None:
    """Say before queuing which cells cannot fit their GPUs' memory (hpcdp/forecast/memory.py)."""
    from hpcdp import forecast

    for line in forecast.memory_warnings(jobs, profile, experiment):
        print(line, file=sys.stderr)


def _check_partition_fits(jobs, profile: config.ClusterProfile, asked: int | None) -> None:
    """Refuse node counts the partition can never give (Slurm would leave the job PENDING
    with PartitionNodeLimit forever), where `scontrol show partition` can tell. `asked`: the
    --nodes given, else the node counts came from matrix.nodes."""
    from hpcdp import slurm

    limit = slurm.partition_node_limit(profile.partition)
    if limit is None:
        return
    partition, most, why = limit
    too_big = sorted({job.nodes for job in jobs if job.nodes > most})
    if too_big:
        raise UsageError(
            f"{'--nodes' if asked else 'matrix.nodes holds'} {too_big[-1]}: partition "
            f"{partition} gives a job at most {most} node(s) "
            f"({why}); Slurm would leave it PENDING (PartitionNodeLimit). Ask for at most "
            f"{most}, or another partition (--set cluster.partition=...)")


def _check_run_folders_visible(run_dirs: list[Path], profile: config.ClusterProfile) -> None:
    """Refuse a run folder the partition's nodes cannot see (hpcdp/shared_fs.py), where Slurm
    says which nodes they are."""
    from hpcdp import shared_fs, slurm

    addresses = slurm.partition_node_addresses(profile.partition) if run_dirs else None
    for run_dir in run_dirs:
        why = shared_fs.problem(run_dir, addresses)
        if why:
            raise UsageError(why)


def cmd_submit(args) -> int:
    from hpcdp import folder_checks, render, submit

    profile, experiment = _load(args)
    jobs = _render_selection(args, profile, experiment)
    _check_resume_from(args, jobs)
    # Several cells: their data is tokenized once, by a job they wait for, not by each cell.
    prepare = (render.render_prepare_job(profile, experiment, output_dir=args.out)
               if len(jobs) > 1 and experiment.data.corpus != "synthetic" else None)
    if not args.dry_run:  # a refusal comes alone, before the warnings
        _check_horovod(jobs, profile)
        _local_cluster_env(profile)
        _check_partition_fits(jobs, profile, args.nodes)
        _check_run_folders_visible([job.run_dir for job in jobs], profile)
    _warn_memory(jobs, profile, experiment)
    if args.dry_run:
        for job in ([prepare] if prepare else []) + jobs:
            after = " --dependency=afterok:<prepare job>" if prepare and job is not prepare else ""
            print(f"# would submit: sbatch{after} {job.script_path}  (nothing written, nothing "
                  "submitted)")
            sys.stdout.write(job.text)
        return 0
    ordered = ([prepare] if prepare else []) + jobs
    records: list[dict] = []
    # Check, write and submit under each run folder's lock: of two submits into one folder
    # at the same moment, the second finds the first's job and is refused.
    with submit.submit_lock([job.run_dir for job in ordered]):
        folder_checks.prepare(jobs, experiment, fresh=args.fresh, submitting=jobs)
        take_back = render.write_jobs(ordered, experiment)
        for i, job in enumerate(ordered):
            try:
                record = submit.submit_job(
                    job, profile.name, experiment.name,
                    label="prepare" if job is prepare else None,
                    after=records[0]["job_id"] if prepare and job is not prepare else None)
            except UsageError:
                for unsubmitted in ordered[i:]:  # a refused job leaves no files behind
                    take_back[unsubmitted.run_dir]()
                raise
            records.append(record)
    for job, record in zip(ordered, records):
        what = ("prepares the data; the cells start after it" if job is prepare
                else f"{job.strategy.name} on {job.nodes} node(s)")
        print(f"submitted job {record['job_id']}: {what}")
        print(f"  script: {record['script']}")
        print(f"  log:    {record['log']}")
        print(f"  run:    {record['run_dir']}")
    return _follow(records, args.timeout) if args.wait else 0


def _follow(records: list[dict], timeout: float | None) -> int:
    """--wait: until every job ends; 0 only when all COMPLETED."""
    from hpcdp import submit

    by_id = {r["job_id"]: r for r in records}

    def why_requeued(job_id: str, info) -> str | None:
        return _why_requeued(by_id[job_id], info)

    try:
        states, ended = submit.follow(list(by_id), timeout_s=timeout, why_requeued=why_requeued)
    except KeyboardInterrupt:  # Ctrl-C stops the following, not the jobs: say so
        ids = " ".join(r["job_id"] for r in records)
        print(f"hpcdp: stopped following; job(s) {ids} keep running: `hpcdp status`, "
              f"`hpcdp logs {records[0]['job_id']} --follow`, or `hpcdp cancel {ids}`",
              file=sys.stderr)
        return 130
    for record in records:
        job_id, state = record["job_id"], states[record["job_id"]]
        if job_id not in ended:
            print(f"hpcdp: gave up waiting after {timeout:.0f} s: job {job_id} "
                  f"({record['strategy']}) is still {state}; it goes on (hpcdp status, "
                  f"scancel {job_id})", file=sys.stderr)
        elif state != "COMPLETED":
            why = _why_ended(record, state)
            print(f"hpcdp: job {job_id} ({record['strategy']}) ended {state}"
                  + (f": {why}" if why else f"; see {record['log']}"), file=sys.stderr)
    return 0 if all(s == "COMPLETED" for s in states.values()) else 1


def _why_ended(record: dict, state: str, exit_code: int | None = None) -> str | None:
    """What a failed job's log says it died of (hpcdp/job_end.py), or that there is no log
    because its nodes could not see the run folder (hpcdp/shared_fs.py): for --wait, status."""
    from hpcdp import job_end, shared_fs

    if state == "COMPLETED":
        return None
    log, run_dir = Path(record["log"]), record["run_dir"]
    if exit_code == shared_fs.NOT_VISIBLE_EXIT:  # the job script's own check on the node
        return f"the node(s) could not see the run folder {run_dir} {shared_fs.WAY_OUT}"
    if state == "FAILED" and not log.exists():  # FAILED: it ran (a cancelled pending job has none)
        return f"no log at {log}; the node(s) may not see the run folder {run_dir} " \
               f"{shared_fs.WAY_OUT}"
    why = job_end.why_failed(log, state)
    return f"{why} (see {log})" if why else None


def _why_requeued(record: dict, info) -> str | None:
    """For a job Slurm requeued after one of its nodes stopped responding: the job script's
    line from its log, so that status shows why the job waits, or ran again."""
    from hpcdp import job_end

    if not info or not info.restarts:
        return None
    line = job_end.node_failure(job_end.read_tail(Path(record["log"])) or "")
    return f"requeued x{info.restarts}: {line}" if line else None


def cmd_compare(args) -> int:
    from hpcdp import campaign, folder_checks, submit

    profile, experiment = _load(args)
    plan = campaign.plan(profile, experiment, output_dir=args.out, repeats=args.repeats,
                         fresh=args.fresh)
    jobs = [c.job for c in plan.cells]
    if not args.render and not args.dry_run:  # a refusal comes alone, before the notes
        _check_horovod(jobs, profile)
        _local_cluster_env(profile)
        _check_partition_fits([plan.job], profile, args.nodes)
        _check_run_folders_visible([plan.folder], profile)
    for note in plan.notes:  # how the one allocator of every cell was chosen
        print(note, file=sys.stderr)
    experiment = plan.experiment
    from hpcdp import estimate

    for line in estimate.lines(plan, profile, experiment):  # will its time limit cover it?
        print(line, file=sys.stderr)
    _warn_memory([c.job for c in plan.cells], profile, experiment)
    if args.dry_run:
        print(f"# would submit: sbatch {plan.job.script_path}  ({len(plan.cells)} cells; "
              "nothing written, nothing submitted)")
        sys.stdout.write(plan.job.text)
        return 0
    # Check, write and submit under the folder's lock (see cmd_submit).
    with submit.submit_lock([plan.folder]):
        folder_checks.prepare(jobs, experiment, fresh=args.fresh, campaign=plan.folder,
                              submitting=None if args.render else [plan.job])
        take_back = campaign.write(plan)
        if args.render:  # the whole campaign on disk, for plain sbatch
            submit.record_rendered(plan.job, profile.name, experiment.name, label="compare")
            print(f"wrote the campaign of {len(plan.cells)} cells to {plan.folder}: "
                  f"{campaign.SCRIPT_NAME}, campaign.json and every cell's and probe's script")
            print(f"  run it with: sbatch {shlex.quote(str(plan.job.script_path))}")
            return 0
        try:
            record = submit.submit_job(plan.job, profile.name, experiment.name, label="compare")
        except UsageError:
            for undo in take_back.values():
                undo()
            raise
    print(f"submitted job {record['job_id']}: campaign of {len(plan.cells)} cells "
          f"({experiment.name}) on {plan.job.nodes} node(s)"
          + (f", order seed {plan.seed}" if plan.seed is not None else ", order as listed")
          + f", malloc {experiment.train.malloc}"
          + (", exclusive nodes" if plan.exclusive else ", nodes shared with other jobs"))
    print(f"  script: {record['script']}")
    print(f"  log:    {record['log']}")
    print(f"  run:    {plan.folder}")
    print(f"  then:   hpcdp harvest {shlex.quote(str(plan.folder))}")
    return _follow([record], args.timeout) if args.wait else 0


def cmd_run(args) -> int:
    from hpcdp import folder_checks, local_run, render, submit

    profile, experiment = _load(args)
    if args.nodes not in (None, 1):
        raise UsageError(f"--nodes {args.nodes}: `hpcdp run` uses this machine only (1 node); "
                         "use `hpcdp submit` for more")
    if args.ranks:  # this machine's ranks per node: what the checks (hsdp's 2) and script see
        devices = "gpus_per_node" if profile.gpus_per_node else "cpu_ranks_per_node"
        profile = dataclasses.replace(profile, **{devices: args.ranks})
    jobs = _render_selection(args, profile, experiment, one_node_only=True)
    _check_resume_from(args, jobs)
    _check_horovod(jobs, profile, controller=local_run.HOROVOD_CONTROLLER)
    folder_checks.prepare(jobs, experiment, fresh=args.fresh, queued=False)
    render.write_jobs(jobs, experiment)  # the same scripts, for a later sbatch
    for job in jobs:
        submit.record_rendered(job, profile.name, experiment.name)
    failed = []
    for job in jobs:
        code = local_run.run_locally(job.strategy, profile.devices_per_node(),
                                     job.experiment_file, job.run_dir)
        if code != 0:
            failed.append((job.strategy.name, code))
    if failed:
        print(f"hpcdp: failed: {', '.join(f'{name} (exit {code})' for name, code in failed)}",
              file=sys.stderr)
        # every trainer refused its input (exit 2): so does the command
        return 2 if all(code == 2 for _, code in failed) else 1
    return 0


def cmd_status(args) -> int:
    from hpcdp import slurm, submit

    records, others = submit.project_records(submit.read_records(), args.all_projects)
    if args.cluster_filter:
        records = [r for r in records if r.get("cluster") == args.cluster_filter]
    records = records[-args.last:]
    if not records:
        if others:
            print(_others_not_shown(others))
        print(f"no jobs submitted by hpcdp yet (records: {submit.state_file()})")
        return 0
    _fallback_slurm_env()
    redraw = args.watch and not args.json and sys.stdout.isatty()
    while True:
        infos = slurm.query_jobs([r["job_id"] for r in records])  # one call for all jobs
        frame, notes = _status_frame(records, infos, as_json=args.json, others=others)
        # A terminal: draw the whole frame again in place, the note on other checkouts in it.
        sys.stdout.write(("\033[H\033[J" if redraw else "") + frame)
        sys.stdout.flush()
        for note in notes:
            print(note, file=sys.stderr)
        if not args.watch or all(slurm.has_ended(i, infos.accounting_available)
                                 for i in infos.values()):
            return 0
        time.sleep(args.watch)
        if not redraw:
            print()


def _record_of(job_id: str, records: list[dict]) -> dict:
    """The record of a job hpcdp submitted (the newest, if an id repeats), or a usage error."""
    from hpcdp import submit

    found = [r for r in records if r["job_id"] == job_id]
    if not found:
        known = ", ".join(r["job_id"] for r in records[-5:]) or "none yet"
        raise UsageError(f"job {job_id!r} was neither submitted by hpcdp nor started from a "
                         f"script it rendered (records: {submit.state_file()}; latest: {known})")
    return found[-1]


def cmd_logs(args) -> int:
    from hpcdp import slurm, submit

    record = _record_of(args.job, submit.read_records())
    log = Path(record["log"])
    if args.follow:
        _fallback_slurm_env()
    offset = 0
    while True:
        if log.exists():
            with log.open("rb") as f:
                f.seek(offset)
                chunk = f.read()
            offset += len(chunk)
            sys.stdout.write(chunk.decode("utf-8", "replace"))
            sys.stdout.flush()
        elif not args.follow:
            raise UsageError(f"job {args.job}: no log yet at {log} (is it still PENDING? "
                             "`hpcdp status`; --follow waits for it)")
        if not args.follow:
            return 0
        infos = slurm.query_jobs([args.job])
        info = infos[args.job]
        # UNKNOWN: neither squeue nor sacct knows it any more; nothing will be written.
        if slurm.has_ended(info, infos.accounting_available) or info.state == slurm.UNKNOWN:
            return 0
        time.sleep(args.poll)


def cmd_cancel(args) -> int:
    from hpcdp import slurm, submit

    records = submit.read_records()
    if args.all == bool(args.jobs):
        raise UsageError("cancel what? name job ids, or --all (the jobs hpcdp submitted from "
                         "this checkout that have not ended)")
    _fallback_slurm_env()
    theirs: list[str] = []  # other checkouts' jobs that --all leaves alone
    if args.all:  # only this checkout's jobs, unless asked (the job registry is per user)
        mine, _ = submit.project_records(records, args.all_projects)
        wanted = list(dict.fromkeys(r["job_id"] for r in mine))
        theirs = [job for job in dict.fromkeys(r["job_id"] for r in records)
                  if job not in wanted]
    else:
        wanted = [_record_of(job, records)["job_id"] for job in args.jobs]
    infos = slurm.query_jobs(wanted + theirs)  # one squeue (+ sacct) for all of them

    def live(job: str) -> bool:
        return job in infos and infos[job].source == "squeue"

    ids = [job for job in wanted if live(job)]
    ended = [job for job in wanted if job not in ids]
    left_alone = sum(map(live, theirs))
    if ended and not args.all:
        print("hpcdp: already ended, nothing to cancel: " + ", ".join(
            f"{job} ({infos[job].state if job in infos else 'UNKNOWN'})" for job in ended))
    if not ids:
        print(("hpcdp: no job of hpcdp's is pending or running" if args.all_projects else
               "hpcdp: no job submitted from this checkout is pending or running")
              if args.all else "hpcdp: cancelled nothing")
    else:
        failed = slurm.cancel(ids)
        if failed:
            raise UsageError(f"scancel {' '.join(ids)} failed: {failed}")
        print(f"cancelled {len(ids)} job(s): {' '.join(ids)}")
    if left_alone:
        print(f"({left_alone} pending or running job(s) of other checkouts left alone: "
              "--all-projects cancels them too)")
    return 0


def _others_not_shown(others: int) -> str:
    return f"({others} job(s) of other checkouts not shown: --all-projects shows them)"


def _status_frame(records: list[dict], infos, as_json: bool,
                  others: int = 0) -> tuple[str, list[str]]:
    """One frame of `hpcdp status` (what --watch redraws): (its text for stdout, its notes
    for stderr). The count of other checkouts' jobs is in every frame: on a terminal each
    redraw clears the screen. With --json it is a note, so that stdout stays JSON."""
    from hpcdp import progress, slurm

    out, notes = [], []
    if others:
        (notes if as_json else out).append(_others_not_shown(others))
    rows, lines = [], []
    for record in records:
        info = infos.get(record["job_id"])
        done = progress.of_run_dir(Path(record["run_dir"]), record["job_id"])
        if done and info and info.state in slurm.TERMINAL_STATES:
            done = dataclasses.replace(done, eta_s=None)  # an ended job has no time left
        why = (_why_ended(record, info.state, info.exit_code)
               if info and info.state in slurm.TERMINAL_STATES else None)
        requeued = _why_requeued(record, info)
        by_hand = "started by hand (sbatch)" if record.get("by_hand") else None
        lines.append("; ".join(filter(None, [by_hand, done.line() if done else None, requeued,
                                             why])) or None)
        rows.append({**record, "state": info.state if info else "UNKNOWN",
                     "reason": info.reason if info else None,
                     "exit_code": info.exit_code if info else None,
                     "elapsed_s": info.run_elapsed_s if info else None,  # requeues included
                     "segment_elapsed_s": info.elapsed_s if info else None,
                     "restarts": info.restarts if info else None,
                     "progress": done.to_dict() if done else None, "why": why,
                     "requeued": requeued, "by_hand": bool(record.get("by_hand"))})
    if infos.accounting_available is False:
        notes.append(f"hpcdp: sacct is unavailable ({infos.accounting_message}); ended jobs "
                     "show UNKNOWN")
    if as_json:
        return json.dumps(rows, indent=2) + "\n", notes
    out.append(f"{'JOB':>10}  {'STATE':<12} {'STRATEGY':<20} {'NODES':>5}  {'ELAPSED':>8}  RUN"
               f"   ({time.strftime('%H:%M:%S')})")
    for row, line in zip(rows, lines):
        elapsed = "" if row["elapsed_s"] is None else f"{row['elapsed_s']:.0f}s"
        state = row["state"] + (f" x{row['restarts']}" if row["restarts"] else "")
        if row["reason"] and row["state"] == "PENDING":
            state += f" ({row['reason']})"
        out.append(f"{row['job_id']:>10}  {state:<12} {row['strategy']:<20} {row['nodes']:>5}  "
                   f"{elapsed:>8}  {row['run_dir']}")
        if line:
            out.append(f"{'':>10}  {line}")
    return "".join(f"{text}\n" for text in out), notes


def cmd_env(args) -> int:
    from hpcdp import distenv

    env = distenv.detect()
    if args.json:
        try:
            torch_env: dict | str = env.torch_env()
        except distenv.DistEnvError as exc:  # e.g. horovodrun across nodes, no master known
            torch_env = str(exc)
        print(json.dumps({**env.as_dict(), "horovod": env.horovod_view(),
                          "device": env.device_hint(os.environ.get("CUDA_VISIBLE_DEVICES")),
                          "container": distenv.container_hint(),
                          "torch_env": torch_env}, indent=2))
    else:
        if env.launcher == "none":
            print("no launcher found: not in a Slurm job step, nor started by torchrun "
                  "or horovodrun; train/ would run as one process (rank 0 of 1)")
        print(env.describe())
        print(f"device: {env.device_hint(os.environ.get('CUDA_VISIBLE_DEVICES'))}")
        print(f"container: {distenv.container_hint()}")
        print("horovod: " + " ".join(f"{k}={v}" for k, v in env.horovod_view().items()))
    return 0


def cmd_cluster(args) -> int:
    from hpcdp import cluster

    if args.action == "up":
        return cluster.up(args.link)
    if args.action == "link":
        if args.rate:
            return cluster.set_link_rate(args.rate, args.targets)
        if len(args.targets) != 2:
            raise UsageError("hpcdp cluster link takes NODE down|up, or --rate RATE [NODE...]")
        return cluster.set_link_state(*args.targets)
    if args.action == "down":
        return cluster.down(purge=args.purge)
    if args.action == "env":
        for key, value in cluster.slurm_env().items():
            print(f"export {key}={shlex.quote(value)}")  # for eval "$(hpcdp cluster env)"
        return 0
    return cluster.status()


def cmd_strategies(args) -> int:
    chosen = [s for s in strategies.STRATEGIES
              if not (args.without_horovod and s.needs_horovod) and (s.in_paper or not args.paper)]
    if args.names:  # for scripts: --set "matrix.strategies=[$(hpcdp strategies --names)]"
        print(", ".join(s.name for s in chosen))
        return 0
    print(f"{'NAME':<21} {'MECHANISM':<14} {'PROCESSES':<15} {'PRECISION':<10} {'NODES':<6} PAPER")
    for in_paper, title in ((True, None), (False, "beyond the paper (sharded data parallelism):")):
        rows = [s for s in chosen if s.in_paper == in_paper]
        if title and rows:
            print(title)
        for s in rows:
            print(f"{s.name:<21} {s.mechanism:<14} {s.launch:<15} "
                  f"{'mixed' if s.mixed_precision else 'fp32':<10} "
                  f"{'1' if s.max_nodes == 1 else 'any':<6} {s.paper_name}")
    return 0


def cmd_harvest(args) -> int:
    from hpcdp import harvest

    _fallback_slurm_env()
    return harvest.main(args)


def cmd_profile(args) -> int:
    """A cluster profile sketched from Slurm (hpcdp/new_profile.py): to stdout, or --out."""
    from hpcdp import new_profile, render

    out = Path(args.out) if args.out else None
    if out is not None:  # found before Slurm is asked
        if out.exists() and not args.force:
            raise UsageError(f"--out {args.out}: {args.out} exists; give another file, or "
                             "--force to replace it")
        if not out.parent.is_dir():
            raise UsageError(f"--out {args.out}: folder {str(out.parent)!r} does not exist")
    if args.name is not None:
        config.check_name(args.name, "--name")
    _fallback_slurm_env()
    text = new_profile.sketch(args.partition, args.name)
    if out is None:
        print(text, end="")
        return 0
    render.write_whole(out, text)
    print(f"wrote {out}; use it with --cluster {out} (check the lines marked CHECK)",
          file=sys.stderr)
    return 0


def cmd_forecast(args) -> int:
    from hpcdp import forecast

    if args.format not in ("table", "markdown", "json"):
        raise UsageError(f"--format {args.format!r}: give table, markdown or json")
    nodes = forecast.parse_nodes(args.nodes) if args.nodes else None
    fit_nodes = forecast.parse_nodes(args.fit_nodes) if args.fit_nodes else None
    tokens = None
    if args.tokens is not None:
        tokens = positive_number(args.tokens.replace("_", ""), f"--tokens {args.tokens!r} is "
                                 "not a positive number of tokens; e.g. 2.5e9")
    target = config.load_profile(args.cluster) if args.cluster else None
    if args.out:
        check_out_folder(Path(args.out))
    _fallback_slurm_env()
    result = forecast.make(args.run_dir, nodes=nodes, fit_nodes=fit_nodes, target=target,
                           tokens=tokens, query_slurm=not args.no_slurm)
    for line in forecast.network_warnings(target) if target else []:  # in its notes too
        print(f"hpcdp: warning: {line}", file=sys.stderr)
    if args.format == "json":
        print(json.dumps(forecast.as_json(result), indent=2))
    else:
        sys.stdout.write(forecast.render_text(result, markdown=args.format == "markdown"))
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "forecast.json").write_text(json.dumps(forecast.as_json(result), indent=2) + "\n")
        (out / "forecast.md").write_text(forecast.render_text(result, markdown=True))
        written = [out / "forecast.json", out / "forecast.md"]
        if not args.no_plots:
            written.append(forecast.plot(result, out / "forecast.png"))
        for path in written:
            print(f"wrote {path}", file=sys.stderr)
    return 0


def cmd_model(args) -> int:
    """export, sample, eval: torch and transformers work, done by `python -m train` (hpcdp names
    train/ only as a command: train/export.py), in this process's place."""
    from hpcdp import PROJECT_ROOT

    argv = [sys.executable, "-m", "train", args.command, *args.rest]
    env = {**os.environ, VIA_CLI: "1", "PYTHONPATH": os.pathsep.join(
        filter(None, [str(PROJECT_ROOT), os.environ.get("PYTHONPATH")]))}
    sys.stdout.flush()
    os.execve(sys.executable, argv, env)


MODEL_COMMANDS = {
    "export": "a run's checkpoint (any strategy, any world size) as a transformers folder: "
              "RUN_DIR --to DIR [--step N] [--dtype fp32|bf16|fp16] [--force]",
    "sample": "continue a prompt with an exported model: DIR --prompt TEXT "
              "[--max-new-tokens N] [--greedy]",
    "eval": "perplexity on the run's held-out tokens, by transformers: RUN_DIR|DIR [--step N] "
            "[--precision run|fp32] [--json]",
}


# ------------------------------------------------------------------------------------ parser

# sbatch's options as users type them to hpcdp, and the cluster profile's key for each; the
# rest of sbatch's options that a user may reach for go in cluster.extra_sbatch. (sbatch's -c
# is not here: hpcdp's -c is --cluster.)
SBATCH_KEYS = {"--partition": "partition", "-p": "partition", "--account": "account",
               "-A": "account", "--qos": "qos", "-q": "qos", "--time": "time_limit",
               "-t": "time_limit", "--mem": "mem", "--gpus-per-node": "gpus_per_node",
               "--cpus-per-task": "cpus_per_task"}
SBATCH_EXTRA = ("--constraint", "-C", "--reservation", "--exclusive", "--nodelist", "-w",
                "--exclude", "-x", "--gres", "--mail-user", "--mail-type", "--mem-per-cpu",
                "--mem-per-gpu", "--comment", "--wckey")
SUBMITTING = ("render", "submit", "compare")  # the commands whose --set reaches an sbatch script


def unrecognized(words: list[str], command: str, renders: bool) -> str:
    """argparse's "unrecognized arguments", and where an sbatch option typed to a command that
    renders a script (`renders`) goes instead."""
    said = f"{command}: unrecognized arguments: {' '.join(words)}"
    for i, word in enumerate(words):
        name, eq, value = word.partition("=")
        if not eq:  # `--partition gpu`: its value is the next word, unless that is an option
            following = words[i + 1] if i + 1 < len(words) else ""
            value = "" if following.startswith("-") else following
        if renders and name in SBATCH_KEYS:
            return (f"{said}; sbatch's {name} is the cluster profile's {SBATCH_KEYS[name]}: "
                    f"--set cluster.{SBATCH_KEYS[name]}={value or 'VALUE'} "
                    "(docs/configuration.md)")
        if renders and name in SBATCH_EXTRA:
            option = f"{name}={value}" if value else name
            return (f"{said}; sbatch's options go in the cluster profile: --set "
                    f"\"cluster.extra_sbatch=['{option}']\" (docs/configuration.md)")
    return f"{said}; `hpcdp {command} --help` lists its options"


def _add_follow_options(p: argparse.ArgumentParser, dry_run: str, follow: str,
                        success: str) -> None:
    """--dry-run, --wait and --timeout, shared by the commands that submit."""
    p.add_argument("--dry-run", action="store_true", help=f"{dry_run}; write and submit nothing")
    p.add_argument("--wait", action="store_true", help=f"follow {follow}; exit 1 unless {success}")
    p.add_argument("--timeout", type=positive_float, default=None,
                   help="stop --wait after N seconds")


def _add_submitting_commands(sub) -> None:
    """`submit` and `compare`: both render, write and submit through submitit."""
    p = sub.add_parser("submit", help="render and submit through submitit; --wait to follow")
    _add_selection(p)
    _add_follow_options(p, "print what would be submitted", "the jobs until they end",
                        "all COMPLETED")
    p.set_defaults(func=cmd_submit)

    p = sub.add_parser("compare", help="one job that runs every cell of the matrix, repeated, "
                                       "one after another (a fair comparison)")
    _add_selection(p, one_cell=False)
    p.add_argument("--repeats", type=positive_int,
                   help="runs of each cell (default: the experiment's compare.repeats)")
    p.add_argument("--render", action="store_true",
                   help="write the whole campaign (its script, every cell's and probe's script, "
                        "campaign.json) for plain sbatch; submit nothing")
    _add_follow_options(p, "print the campaign script", "the job until it ends", "COMPLETED")
    p.set_defaults(func=cmd_compare)


def _add_job_commands(sub) -> None:
    """`status`, `logs`, `cancel`: the jobs hpcdp submitted (its job registry)."""
    p = sub.add_parser("status", help="states of the jobs hpcdp submitted (one Slurm query)")
    p.add_argument("--json", action="store_true")
    p.add_argument("--last", type=positive_int, default=20,
                   help="show the last N jobs (default 20)")
    p.add_argument("--cluster", dest="cluster_filter", help="only jobs of this profile")
    p.add_argument("--watch", type=positive_float, metavar="SECONDS",
                   help="refresh every SECONDS until every job shown has ended")
    p.add_argument("--all-projects", action="store_true",
                   help="also jobs submitted from other checkouts of hpcdp (same user)")
    p.set_defaults(func=cmd_status)

    p = sub.add_parser("logs", help="print the log of a job hpcdp submitted")
    p.add_argument("job", help="its job id (`hpcdp status` lists them)")
    p.add_argument("--follow", "-f", action="store_true", help="keep printing until it ends")
    p.add_argument("--poll", type=positive_float, default=2.0, help=argparse.SUPPRESS)
    p.set_defaults(func=cmd_logs)

    p = sub.add_parser("cancel", help="cancel jobs hpcdp submitted (scancel)")
    p.add_argument("jobs", nargs="*", metavar="JOB", help="job ids")
    p.add_argument("--all", action="store_true",
                   help="every job submitted from this checkout not yet ended")
    p.add_argument("--all-projects", action="store_true",
                   help="with --all: from every checkout of hpcdp (same user)")
    p.set_defaults(func=cmd_cancel)


def _add_cluster_command(sub) -> None:
    """`hpcdp cluster up|down|status|env|link`: the local cluster, its links and their faults."""
    p = sub.add_parser("cluster", help="the local Slurm cluster on this machine: its nodes "
                                       "each have a network namespace, a shaped link and a core")
    actions = p.add_subparsers(dest="action", required=True, parser_class=ArgumentParser)
    a = actions.add_parser("up", help="start it (a no-op when it runs)")
    a.add_argument("--link", metavar="RATE", help="every node's link rate: 1gbit (the default), "
                   "250mbit, ..., or none (unshaped loopback speed)")
    a = actions.add_parser("down", help="stop it and remove its network")
    a.add_argument("--purge", action="store_true", help="delete its data too")
    actions.add_parser("status", help="its daemons, each node's address, cores and link, sinfo")
    actions.add_parser("env", help="export SLURM_CONF=..., for eval")
    a = actions.add_parser("link", help="change a running cluster's links: NODE down|up cuts "
                           "or restores a node's link; --rate RATE [NODE...] shapes them")
    a.add_argument("targets", nargs="*", metavar="NODE [down|up]")
    a.add_argument("--rate", metavar="RATE", help="e.g. 250mbit, default or none; for the "
                   "nodes named (default: every node)")
    p.set_defaults(func=cmd_cluster)


def build_parser() -> argparse.ArgumentParser:
    parser = ArgumentParser(prog=CLI_NAME, description="Data-parallel GPT-2 pre-training on Slurm.")
    parser.add_argument("--version", action="version", version=f"hpcdp {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=ArgumentParser)

    p = sub.add_parser("render", help="write sbatch scripts (one, or the experiment's matrix)")
    _add_selection(p)
    p.add_argument("--scripts-dir", help="write scripts here (named EXPERIMENT-STRATEGY-Nn.sbatch) "
                                         "instead of into each run directory")
    p.add_argument("--stdout", action="store_true", help="print the scripts, write nothing")
    p.set_defaults(func=cmd_render)

    _add_submitting_commands(sub)

    p = sub.add_parser("run", help="train on this machine as local processes, without Slurm")
    _add_selection(p)
    p.add_argument("--ranks", type=positive_int, help="processes for one-per-device strategies "
                                            "(default: the profile's devices per node)")
    p.set_defaults(func=cmd_run)

    _add_job_commands(sub)

    p = sub.add_parser("env", help="the distributed environment train/ derives in this shell")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_env)

    _add_cluster_command(sub)

    p = sub.add_parser("profile", help="a cluster profile sketched from what Slurm says about "
                                       "a partition (GPUs, CPUs, time limit)")
    p.add_argument("--partition", "-p", help="the partition (default: the cluster's default)")
    p.add_argument("--name", help="the profile's name (default: the partition's)")
    p.add_argument("--out", "-o", metavar="FILE", help="write FILE instead of printing it")
    p.add_argument("--force", action="store_true", help="replace FILE if it exists")
    p.set_defaults(func=cmd_profile)

    p = sub.add_parser("strategies", help="list the strategies")
    p.add_argument("--names", action="store_true", help="only the names, comma-separated")
    p.add_argument("--without-horovod", action="store_true",
                   help="leave out the strategies that need Horovod")
    p.add_argument("--paper", action="store_true",
                   help="only the paper's six (leave out the sharded strategies)")
    p.set_defaults(func=cmd_strategies)

    p = sub.add_parser("harvest", help="tables and plots from finished runs")
    from hpcdp import harvest  # light: matplotlib is imported only when plotting
    harvest.add_arguments(p)
    p.set_defaults(func=cmd_harvest)

    _add_model_commands(sub)
    return parser


def _add_model_commands(sub) -> None:
    """forecast (from a campaign to scale), and export, sample, eval (the model out)."""
    p = sub.add_parser("forecast", help="from a campaign: throughput, memory, time and cost of "
                                        "each strategy at the node counts you will train on")
    p.add_argument("run_dir", metavar="RUN_DIR", help="a campaign's folder (hpcdp compare)")
    p.add_argument("--nodes", help="node counts to forecast: 1,2,4 or 1-128 (powers of two; "
                                   "default 1-128 and the campaign's own)")
    p.add_argument("--fit-nodes", help="fit only on the cells of these node counts (the others "
                                       "then check the forecast)")
    p.add_argument("--cluster", metavar="TARGET", help="a cluster profile with a network: "
                   "section: forecast for that cluster instead of the campaign's")
    p.add_argument("--tokens", help="tokens to train (default: 20 per parameter)")
    p.add_argument("--format", "-f", default="table", help="table (default), markdown or json")
    p.add_argument("--out", "-o", metavar="DIR",
                   help="also write forecast.json, forecast.md and forecast.png here")
    p.add_argument("--no-slurm", action="store_true",
                   help="do not ask Slurm for billing weights and the campaign's billed TRES")
    p.add_argument("--no-plots", action="store_true", help="with --out: skip the PNG")
    p.set_defaults(func=cmd_forecast)
    for name, text in MODEL_COMMANDS.items():
        p = sub.add_parser(name, help=text, add_help=False)
        p.add_argument("rest", nargs=argparse.REMAINDER)
        p.set_defaults(func=cmd_model)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] in MODEL_COMMANDS:  # every option theirs, --help included
        return cmd_model(argparse.Namespace(command=argv[0], rest=argv[1:]))
    try:
        args, unknown = build_parser().parse_known_args(argv)
        if unknown:
            raise UsageError(unrecognized(unknown, args.command, args.command in SUBMITTING))
        return args.func(args)
    except UsageError as exc:
        print(f"hpcdp: error: {one_line(str(exc))}", file=sys.stderr)
        return UsageError.exit_code
    except KeyboardInterrupt:
        print("hpcdp: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # `hpcdp status | head`: the reader has what it wanted
        # Python would flush stdout again at exit and fail on the same pipe: point it nowhere.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


if __name__ == "__main__":
    raise SystemExit(main())
