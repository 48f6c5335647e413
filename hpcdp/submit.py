"""Submit rendered scripts through submitit, record them, and follow them.

submitit's Slurm executor builds its own sbatch text in `_make_submission_file_text`; the
subclass below returns hpcdp's rendered script instead, so `hpcdp submit` and a plain `sbatch
job.sbatch` send byte-identical scripts (one source of truth). Following uses hpcdp.slurm, which
reads squeue while a job is live and sacct once it ended (sacct lags squeue by seconds).
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from hpcdp import slurm
from hpcdp.errors import UsageError

if TYPE_CHECKING:  # jinja2 is not needed by `hpcdp status`
    from hpcdp.render import RenderedJob


# The submitit hooks hpcdp relies on. None is public, and submitit has no public call that
# submits a given script text: `_make_submission_file_text` returns the sbatch text (overridden
# to return hpcdp's rendered script), `_make_submission_command` the sbatch command line
# (overridden to add --dependency), `_submit_command` writes the file and runs sbatch.
# Checked against the installed submitit before use; pyproject.toml pins the known-good range.
SUBMITIT_HOOKS = {"_make_submission_file_text": ("self", "command", "uid"),
                  "_make_submission_command": ("self", "submission_file_path"),
                  "_submit_command": ("self", "command")}
SUBMITIT_KNOWN_GOOD = ">=1.5,<1.6"


def check_submitit_hooks(executor_cls: type) -> None:
    """A one-line error, not a surprise mid-submission, when a submitit release changed the
    hooks this adapter overrides and calls."""
    import inspect

    for name, params in SUBMITIT_HOOKS.items():
        hook = getattr(executor_cls, name, None)
        found = tuple(inspect.signature(hook).parameters) if callable(hook) else None
        if found != params:
            import submitit

            raise UsageError(
                f"submitit {submitit.__version__} changed {executor_cls.__name__}.{name} "
                f"(expected parameters {params}, found {found}); hpcdp works "
                f"with submitit{SUBMITIT_KNOWN_GOOD}: pip install 'submitit{SUBMITIT_KNOWN_GOOD}'")


def _executor_class():
    import submitit  # imported here: submitit pulls in cloudpickle, not needed by `render`

    check_submitit_hooks(submitit.SlurmExecutor)

    class RenderedScriptExecutor(submitit.SlurmExecutor):
        """A SlurmExecutor whose sbatch file is hpcdp's rendered script, verbatim."""

        def __init__(self, folder: Path, script_text: str, sbatch_options: list[str]) -> None:
            super().__init__(folder=folder)
            self._script_text, self._sbatch_options = script_text, sbatch_options

        def _make_submission_file_text(self, command: str, uid: str) -> str:
            return self._script_text

        def _make_submission_command(self, submission_file_path: Path) -> list[str]:
            return ["sbatch", *self._sbatch_options, str(submission_file_path)]

    return RenderedScriptExecutor


PROJECT = str(Path(__file__).resolve().parents[1])
"""This checkout: the job registry is per user, so each record says which checkout submitted it,
and `status` and `cancel --all` keep to the current one."""


def project_records(records: list[dict], all_projects: bool = False) -> tuple[list[dict], int]:
    """(the records of this checkout, how many others were left out). Records from before
    `project` was recorded count as this checkout's."""
    if all_projects:
        return records, 0
    mine = [r for r in records if r.get("project", PROJECT) == PROJECT]
    return mine, len(records) - len(mine)


def state_file() -> Path:
    """The jobs hpcdp submitted, one JSON line each (read by `hpcdp status`)."""
    base = os.environ.get("HPCDP_STATE_DIR") or os.path.join(
        os.environ.get("XDG_STATE_HOME") or os.path.expanduser("~/.local/state"), "hpcdp")
    return Path(base) / "jobs.jsonl"


def submit_job(job: RenderedJob, cluster: str, experiment: str, label: str | None = None,
               after: str | None = None) -> dict:
    """Submit one rendered (and already written) job; returns its record. label: what
    `hpcdp status` shows as its strategy (a campaign: "compare"). after: a job id this one
    starts after, once it succeeded (sbatch --dependency=afterok; not in the script, which
    stays runnable by hand)."""
    executor_cls = _executor_class()
    folder = job.run_dir / ".submitit"
    made_folder = not folder.exists()
    folder.mkdir(parents=True, exist_ok=True)
    try:
        try:
            executor = executor_cls(folder, job.text,
                                    [f"--dependency=afterok:{after}", "--kill-on-invalid-dep=yes"]
                                    if after else [])
        except RuntimeError as exc:  # submitit: no srun on PATH
            raise UsageError(f"cannot submit: {exc} (install Slurm's client or use "
                             "`hpcdp render`)") from None
        # Only for submitit's bookkeeping (task count); the directives are in the script.
        executor.update_parameters(nodes=job.nodes, ntasks_per_node=job.tasks_per_node)
        try:
            # submitit prints sbatch's stderr itself when sbatch fails; hpcdp says it once.
            with contextlib.redirect_stderr(io.StringIO()):
                submitted = executor._submit_command("python -m train")  # the rendered script
        except Exception as exc:  # sbatch refused: its message is the useful part
            raise UsageError(f"sbatch refused {job.script_path}: {sbatch_message(exc)}") from None
    except UsageError:
        if made_folder:
            shutil.rmtree(folder, ignore_errors=True)
        raise
    record = {
        "job_id": str(submitted.job_id),
        "experiment": experiment,
        "strategy": label or job.strategy.name,
        "nodes": job.nodes,
        "tasks_per_node": job.tasks_per_node,
        "cluster": cluster,
        "run_dir": str(job.run_dir),
        "script": str(job.script_path),
        "log": str(job.run_dir / slurm.job_log_name(str(submitted.job_id))),
        "submitted_at": time.time(),
        "project": PROJECT,
        "after": after,
    }
    (job.run_dir / "submission.json").write_text(json.dumps(record, indent=2) + "\n")
    path = state_file()
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as fh:
        fh.write(json.dumps(record) + "\n")
    return record


def sbatch_message(exc: Exception) -> str:
    """sbatch's own words from submitit's error (its stderr), each line once, on one line."""
    lines = [" ".join(line.split()) for line in str(exc).splitlines()]
    return " ".join(dict.fromkeys(line for line in lines if line))[-400:]


CLAIM_WAIT_S = 60.0


@contextlib.contextmanager
def submit_lock(run_dirs: list[Path]):
    """Hold the submit lock of each run folder while it is checked, written and submitted: two
    `hpcdp submit`s into one folder at the same moment run one after the other, and the second
    then finds the first's job and is refused (folder_checks.prepare). The locks live in the
    state folder, so that a refused submit leaves no folder behind."""
    import fcntl
    import hashlib

    folder = state_file().parent / "locks"
    folder.mkdir(parents=True, exist_ok=True)
    held = []
    try:
        for run_dir in sorted({str(Path(d).absolute()) for d in run_dirs}):  # one order: no
            name = hashlib.sha256(run_dir.encode()).hexdigest()[:32] + ".lock"   # deadlock
            fh = open(folder / name, "w")  # noqa: SIM115 - closed in finally
            held.append(fh)
            deadline = time.monotonic() + CLAIM_WAIT_S
            while True:
                try:
                    fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if time.monotonic() > deadline:
                        raise UsageError(f"{run_dir} is being submitted by another hpcdp for "
                                         f"over {CLAIM_WAIT_S:.0f} s; try again, or give "
                                         "another --out") from None
                    time.sleep(0.1)
        yield
    finally:
        for fh in held:
            fh.close()  # closing releases the lock


def rendered_file() -> Path:
    """The job scripts hpcdp wrote without submitting them (render, compare --render, run), one
    JSON line each: a job started from one by hand with plain sbatch writes its log into the run
    folder, where read_records finds it (as in the folders of the jobs hpcdp submitted)."""
    return state_file().parent / "rendered.jsonl"


def record_rendered(job: RenderedJob, cluster: str, experiment: str,
                    label: str | None = None) -> None:
    """Remember a script written for plain sbatch, so that `hpcdp status`, `logs` and `cancel`
    know the jobs started from it by hand (the run folder knows them; hpcdp did not see them)."""
    record = {"run_dir": str(job.run_dir), "script": str(job.script_path),
              "experiment": experiment, "strategy": label or job.strategy.name,
              "nodes": job.nodes, "tasks_per_node": job.tasks_per_node, "cluster": cluster,
              "rendered_at": time.time(), "project": PROJECT}
    path = rendered_file()
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as fh:
        fh.write(json.dumps(record) + "\n")


def read_records() -> list[dict]:
    """Every job hpcdp knows, oldest first: those it submitted, and those started by hand from
    a script it rendered ("by_hand": true)."""
    submitted = _read_json_lines(state_file())
    return sorted(submitted + _started_by_hand(submitted), key=lambda r: r.get("submitted_at", 0.0))


def _started_by_hand(submitted: list[dict]) -> list[dict]:
    """The jobs whose logs (slurm-JOB.out) are in a run folder hpcdp wrote a script into (one it
    submitted, or one rendered for plain sbatch) and that hpcdp did not submit. Their time is
    the script's: sbatch's own is not in the folder."""
    known = {r["job_id"] for r in submitted}
    # The folder's newest record describes the script in it (a submitted job's, or a render's).
    folders = {r["run_dir"]: {**r, "rendered_at": r.get("submitted_at", 0.0)} for r in submitted}
    folders.update((r["run_dir"], r) for r in _read_json_lines(rendered_file()))
    found = []
    prefix, suffix = slurm.JOB_LOG.split("{job_id}")
    for run_dir, record in folders.items():
        for log in sorted(Path(run_dir).glob(slurm.job_log_name("*"))):
            job_id = log.name[len(prefix):len(log.name) - len(suffix)]
            if job_id.isdigit() and job_id not in known:
                found.append({**{k: v for k, v in record.items() if k not in _PER_JOB},
                              "job_id": job_id, "log": str(log), "by_hand": True,
                              "submitted_at": record["rendered_at"]})
    return sorted(found, key=lambda r: (r["submitted_at"], int(r["job_id"])))


_PER_JOB = ("rendered_at", "job_id", "log", "submitted_at", "after")
"""Fields of a record that belong to one job, not to the script its folder holds."""


def _read_json_lines(path: Path) -> list[dict]:
    try:
        text = path.read_text()
    except FileNotFoundError:
        return []
    records = []
    for line in text.splitlines():
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            continue  # a line cut by a crash: skip it, keep the rest
    return records


def follow(job_ids: list[str], *, poll_s: float = 2.0, timeout_s: float | None = None,
           echo: Callable[[str], None] = print,
           why_requeued: Callable[[str, object], str | None] | None = None
           ) -> tuple[dict[str, str], set[str]]:
    """Poll until every job reaches a final state (or timeout_s passes); print each change,
    with Slurm's reason while a job is pending, and, when Slurm requeues a job, why
    (why_requeued(job id, its JobInfo): a line, or None). Returns (id -> state, ids that
    ended)."""
    from hpcdp import slurm

    last: dict[str, str] = {}
    requeues: dict[str, int] = {}
    start = time.monotonic()
    deadline = None if timeout_s is None else start + timeout_s
    while True:
        infos = slurm.query_jobs(job_ids)  # one squeue + one sacct for all jobs
        for job_id in job_ids:
            info = infos.get(job_id)
            shown = info.shown_state() if info else "UNKNOWN"
            if info and info.exit_code and slurm.is_terminal(info.state):
                shown += f" (exit {info.exit_code})"
            if last.get(job_id) != shown:
                echo(f"job {job_id}: {shown}")
                last[job_id] = shown
            restarts = (info.restarts or 0) if info else 0
            if why_requeued and restarts > requeues.setdefault(job_id, restarts):
                said = why_requeued(job_id, info)  # None: not yet in the log, or a preemption
                if said:
                    echo(f"job {job_id}: {said}")
                    requeues[job_id] = restarts
        ended = {j for j in job_ids
                 if infos.get(j) and slurm.has_ended(infos[j], infos.accounting_available)}
        states = {j: (infos[j].shown_state() if infos.get(j) else "UNKNOWN") for j in job_ids}
        if len(ended) == len(job_ids):
            return states, ended
        if deadline is not None and time.monotonic() > deadline:
            return states, ended
        # Fast at first (a short job's end is seen within half a second), every poll_s after
        # about 15 s: one squeue and one sacct a poll.
        time.sleep(min(poll_s, 0.5 + 0.1 * (time.monotonic() - start)))
        sys.stdout.flush()
