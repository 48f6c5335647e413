"""The one place that decides whether a run folder may be written, continued or moved aside,
before anything is written: `prepare`, used by render, submit, compare (--render too) and run.
The trainer's own claim on the folder, when it starts, is hpcdp/run_lock.py's."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import yaml

from hpcdp import run_folder, run_lock, slurm
from hpcdp.config import Experiment, as_dict, build, load_yaml_text
from hpcdp.errors import UsageError
from hpcdp.render import RenderedJob, experiment_yaml
from hpcdp.run_folder import holds_a_run


def prepare(jobs: list[RenderedJob], experiment: Experiment, *, fresh: bool,
            queued: bool = True, submitting: list[RenderedJob] | None = None,
            campaign: Path | None = None) -> None:
    """Every check for every folder, then the one change (--fresh moves earlier runs aside):
    - submitting (the jobs about to be queued): refused while an earlier job of the folder is
      queued or running;
    - a folder where a trainer runs (run_lock) is never touched, --fresh or not;
    - fresh: an earlier run (a campaign: the whole campaign folder) becomes NAME.old-TIME;
    - otherwise an earlier run is continued only when trained alike, and a queued job (queued:
      render, submit, compare; not `hpcdp run`, whose trainer says so at once) must have
      something left to train."""
    if submitting:
        _refuse_queued(submitting)
    run_lock.check_free([campaign] if campaign else [job.run_dir for job in jobs])
    if fresh:
        if campaign:
            _move_campaign_aside(campaign)
        else:
            _move_aside(jobs)
    else:
        check_continuable(jobs, experiment, queued)


# What an earlier run in the same folder may differ in and still be continued by --resume:
# how often things are logged, evaluated, saved or timed out, not what is trained.
CONTINUABLE = ("name", "description", "matrix.", "train.log_interval", "train.eval_interval",
               "train.eval_batches", "train.checkpoint_interval", "train.checkpoint_every_s",
               "train.keep_checkpoints", "train.dist_timeout_s", "train.warmup_log_steps",
               "train.hang_factor", "train.hang_floor_s", "train.on_hang", "train.stop_check_s",
               "train.resume_from", "compare.")


def _flat(tree: dict, prefix: str = "") -> dict[str, object]:
    out: dict[str, object] = {}
    for key, value in tree.items():
        if isinstance(value, dict):
            out |= _flat(value, f"{prefix}{key}.")
        else:
            out[f"{prefix}{key}"] = value
    return out


def finished_at(run_dir: Path) -> int | None:
    """The step a run in `run_dir` completed at (its last record, the summary, says so), or
    None: not there, or not finished."""
    _, tail = run_folder.head_and_tail(run_dir)
    if not tail:
        return None
    record = tail[-1]
    done = record.get("kind") == "summary" and record.get("status") == "completed"
    return int(record["steps"]) if done and isinstance(record.get("steps"), int) else None


def _earlier_settings(experiment_file: Path) -> dict[str, object]:
    """An earlier run's settings, with today's defaults for fields added since it was written
    (an older hpcdp's run folder must not differ in a setting it never had)."""
    try:
        raw = load_yaml_text(experiment_file.read_text()) or {}
    except (OSError, yaml.YAMLError):
        return {}
    try:
        return _flat(as_dict(build(Experiment, dict(raw), "")))
    except UsageError:  # a field since removed or renamed: compare what the file says
        return _flat(raw)


def check_continuable(jobs: list[RenderedJob], experiment: Experiment,
                      queued: bool = True) -> None:
    """Refuse to write into a run folder whose earlier run was trained otherwise: the rendered
    script always resumes, so it would continue that run with other settings. One line names
    the first difference and the ways out. queued (render, submit, compare: a job to wait for):
    also refuse folders whose runs all finished already, which would train nothing; `hpcdp run`
    starts at once, and its trainer says "nothing to do" as soon."""
    new = _flat(load_yaml_text(experiment_yaml(experiment)))
    for job in jobs:
        if not holds_a_run(job.run_dir):
            continue
        old = _earlier_settings(job.experiment_file)
        differ = [k for k in sorted(set(old) | set(new))
                  if not k.startswith(CONTINUABLE) and old.get(k) != new.get(k)]
        if differ:
            k = differ[0]
            more = f" and {len(differ) - 1} more setting(s)" if len(differ) > 1 else ""
            raise UsageError(
                f"{job.run_dir} holds a run trained with {k}={old.get(k)!r}, not "
                f"{new.get(k)!r}{more}; resubmit it unchanged to continue it, add --fresh to "
                "move it aside and start over, or give another --out")
    finished = [(job, finished_at(job.run_dir)) for job in jobs]
    if queued and jobs and all(step is not None and step >= experiment.train.steps
                               for _, step in finished):
        # Queued, it would train nothing and count as a resume (a campaign with some cells
        # still to train goes on: its finished cells say so themselves).
        job, step = finished[0]
        where = str(job.run_dir) if len(jobs) == 1 else f"every run folder ({job.run_dir}, ...)"
        raise UsageError(f"{where} already finished at step {step} (train.steps "
                         f"{experiment.train.steps}): nothing to train; to train it further, "
                         "continue it in another folder (--resume-from RUN_DIR --set "
                         "train.steps=N --out OTHER), or add --fresh to start over")


def _move_aside(jobs: list[RenderedJob]) -> None:
    """--fresh: each run folder that holds a run becomes RUN_DIR.old-TIMESTAMP."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    for job in jobs:
        if holds_a_run(job.run_dir):
            target = job.run_dir.with_name(f"{job.run_dir.name}.old-{stamp}")
            job.run_dir.rename(target)
            print(f"hpcdp: moved the earlier run aside: {target}", file=sys.stderr)


def _move_campaign_aside(folder: Path) -> None:
    """--fresh: an earlier campaign in `folder` (cells and all) becomes compare.old-TIMESTAMP."""
    if folder.exists() and any(folder.iterdir()):
        target = folder.with_name(f"{folder.name}.old-{time.strftime('%Y%m%d-%H%M%S')}")
        folder.rename(target)
        print(f"hpcdp: moved the earlier campaign aside: {target}", file=sys.stderr)


def _refuse_queued(jobs: list[RenderedJob]) -> None:
    """Refuse to submit into a run directory whose earlier job is still queued or running: two
    jobs would append to one metrics file and race on its checkpoints."""
    earlier = {}
    for job in jobs:
        try:
            earlier[job] = json.loads((job.run_dir / "submission.json").read_text())["job_id"]
        except (OSError, ValueError, KeyError, TypeError):
            continue
    if not earlier:
        return
    infos = slurm.query_jobs(list(earlier.values()))  # one squeue (+ sacct) for all of them
    for job, job_id in earlier.items():
        info = infos.get(job_id)
        if info is not None and info.source == "squeue":
            raise UsageError(
                f"{job.run_dir} already belongs to job {job_id}, which is {info.state}; wait "
                f"for it, `scancel {job_id}`, or give another --out")
