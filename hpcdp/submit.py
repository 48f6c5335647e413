"""Submit rendered scripts through submitit, record them, and follow them.

submitit's Slurm executor builds its own sbatch text in `_make_submission_file_text`; the
subclass below returns hpcdp's rendered script instead, so `hpcdp submit` and a plain `sbatch
job.sbatch` send byte-identical scripts (one source of truth). Following uses hpcdp.slurm, which
reads squeue while a job is live and sacct once it ended (sacct lags squeue by seconds).
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Callable

from hpcdp.errors import UsageError

if TYPE_CHECKING:  # jinja2 is not needed by `hpcdp status`
    from hpcdp.render import RenderedJob


def _executor_class():
    import submitit  # imported here: submitit pulls in cloudpickle, not needed by `render`

    class RenderedScriptExecutor(submitit.SlurmExecutor):
        """A SlurmExecutor whose sbatch file is hpcdp's rendered script, verbatim."""

        def __init__(self, folder: Path, script_text: str) -> None:
            super().__init__(folder=folder)
            self._script_text = script_text

        def _make_submission_file_text(self, command: str, uid: str) -> str:
            return self._script_text

    return RenderedScriptExecutor


def state_file() -> Path:
    """The jobs hpcdp submitted, one JSON line each (read by `hpcdp status`)."""
    base = os.environ.get("HPCDP_STATE_DIR") or os.path.join(
        os.environ.get("XDG_STATE_HOME") or os.path.expanduser("~/.local/state"), "hpcdp")
    return Path(base) / "jobs.jsonl"


def submit_job(job: RenderedJob, cluster: str, experiment: str) -> dict:
    """Submit one rendered (and already written) job; returns its record."""
    executor_cls = _executor_class()
    folder = job.run_dir / ".submitit"
    folder.mkdir(parents=True, exist_ok=True)
    try:
        executor = executor_cls(folder, job.text)
    except RuntimeError as exc:  # submitit: no srun on PATH
        raise UsageError(f"cannot submit: {exc} (install Slurm's client or use `hpcdp render`)")
    # Only for submitit's bookkeeping (task count); the directives are in the script itself.
    executor.update_parameters(nodes=job.nodes, ntasks_per_node=job.tasks_per_node)
    try:
        submitted = executor._submit_command("python -m train")  # the text is the rendered script
    except Exception as exc:  # sbatch refused: its message is the useful part
        message = " ".join(str(exc).split())
        raise UsageError(f"sbatch refused {job.script_path}: {message[-400:]}") from None
    record = {
        "job_id": str(submitted.job_id),
        "experiment": experiment,
        "strategy": job.strategy.name,
        "nodes": job.nodes,
        "tasks_per_node": job.tasks_per_node,
        "cluster": cluster,
        "run_dir": str(job.run_dir),
        "script": str(job.script_path),
        "log": str(job.run_dir / f"slurm-{submitted.job_id}.out"),
        "submitted_at": time.time(),
    }
    (job.run_dir / "submission.json").write_text(json.dumps(record, indent=2) + "\n")
    path = state_file()
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as fh:
        fh.write(json.dumps(record) + "\n")
    return record


def check_run_dirs_free(jobs: list[RenderedJob]) -> None:
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
    from hpcdp import slurm

    infos = slurm.query_jobs(list(earlier.values()))  # one squeue (+ sacct) for all of them
    for job, job_id in earlier.items():
        info = infos.get(job_id)
        if info is not None and info.source == "squeue":
            raise UsageError(
                f"{job.run_dir} already belongs to job {job_id}, which is {info.state}; wait "
                f"for it, `scancel {job_id}`, or give another --out")


def read_records() -> list[dict]:
    path = state_file()
    if not path.exists():
        return []
    records = []
    for line in path.read_text().splitlines():
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            continue  # a line cut by a crash: skip it, keep the rest
    return records


def follow(job_ids: list[str], *, poll_s: float = 2.0, timeout_s: float | None = None,
           echo: Callable[[str], None] = print) -> dict[str, str]:
    """Poll until every job reaches a final state; print each change. Returns id -> state."""
    from hpcdp import slurm

    last: dict[str, str] = {}
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    while True:
        infos = slurm.query_jobs(job_ids)  # one squeue + one sacct for all jobs
        for job_id in job_ids:
            info = infos.get(job_id)
            state = info.state if info else "UNKNOWN"
            shown = state + (f" (exit {info.exit_code})" if info and info.exit_code
                             and slurm.is_terminal(state) else "")
            if last.get(job_id) != shown:
                echo(f"job {job_id}: {shown}")
                last[job_id] = shown
        if all(infos.get(j) and slurm.has_ended(infos[j], infos.accounting_available)
               for j in job_ids):
            return {j: infos[j].state for j in job_ids}
        if deadline is not None and time.monotonic() > deadline:
            echo(f"hpcdp: stopped waiting after {timeout_s:.0f} s; jobs go on (hpcdp status)")
            return {j: (infos[j].state if infos.get(j) else "UNKNOWN") for j in job_ids}
        time.sleep(poll_s)
        sys.stdout.flush()
