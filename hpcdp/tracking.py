"""Experiment trackers (TensorBoard, MLflow, Weights & Biases) fed from metrics.jsonl's records.

metrics.jsonl stays the source of truth; a tracker is a copy of it where users already look.
The same mapping serves two callers: rank 0 of a training run (train/metrics.py hands every
record it writes to `TrackedRun.feed`) and `hpcdp harvest --to` (which replays the records of
runs that trained without a tracker). Nothing here imports torch; a tracker's package is
imported only when a run asks for it.

Rules (docs/tracking.md):
- One tracked run per run folder. Its identity (W&B id, MLflow run id) is kept in the run
  folder's tracking.json, so a requeued, preempted or resumed job continues the same run.
- Append only, every step once: a segment that redoes steps after a resume from an earlier
  checkpoint does not send them again (trackers keep the first value; metrics.jsonl's last
  record wins, and on the same world and seed the two are bit-identical).
- Offline first: W&B runs with WANDB_MODE=offline unless the environment says otherwise, and
  MLflow writes a file store under the run (or campaign) folder unless MLFLOW_TRACKING_URI is
  set. A profile's `env` is where a site says otherwise.
- A tracker that is missing or fails never stops training: one warning line, and the run's
  summary says what each tracker wrote.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hpcdp import run_folder
from hpcdp.errors import UsageError
from hpcdp.run_folder import METRICS_FILE

TRACKERS = ("tensorboard", "mlflow", "wandb")
INSTALL = {"tensorboard": "pip install 'hpcdp[tensorboard]'",
           "mlflow": "pip install 'hpcdp[mlflow]'", "wandb": "pip install 'hpcdp[wandb]'"}
STATE_FILE = "tracking.json"
TENSORBOARD_DIR = "tensorboard"
CAMPAIGN_FILE = "campaign.json"  # hpcdp compare's record at a campaign's root

# step record field -> tracker key. phases_s is spread into time/<phase>.
STEP_SCALARS = {"loss": "train/loss", "lr": "train/lr", "grad_norm": "train/grad_norm",
                "loss_scale": "train/loss_scale", "tokens_per_s": "perf/tokens_per_s",
                "step_time_s": "perf/step_time_s", "mfu": "perf/mfu",
                "tokens_seen": "train/tokens_seen", "max_mem_gb": "memory/max_mem_gb",
                "exposed_comm_s": "comm/exposed_s", "allreduce_s": "comm/allreduce_s"}
HEADER_PARAMS = ("strategy", "paper_name", "precision", "world_size", "nodes", "tasks_per_node",
                 "device", "device_name", "model_preset", "n_params", "seq_len",
                 "micro_batch_size", "grad_accum_steps", "scaling", "global_batch_size",
                 "communication", "grad_comm", "launcher", "malloc", "threads_per_process",
                 "cpus_per_process", "experiment", "slurm_job_id")


def check_names(names: Iterable[str], where: str = "train.trackers") -> None:
    for name in names:
        if name not in TRACKERS:
            raise UsageError(f"{where} {name!r} is not a tracker; valid: {', '.join(TRACKERS)}")


# ---- what a record becomes -----------------------------------------------------------------

def step_scalars(record: dict) -> dict[str, float]:
    """The numbers of a step (or eval) record, under the trackers' keys; nulls left out."""
    if record.get("kind") == "eval":
        value = record.get("val_loss")
        return {"val/loss": float(value)} if isinstance(value, (int, float)) else {}
    out = {key: float(record[name]) for name, key in STEP_SCALARS.items()
           if isinstance(record.get(name), (int, float)) and not isinstance(record[name], bool)}
    for phase, seconds in (record.get("phases_s") or {}).items():
        if isinstance(seconds, (int, float)):
            out[f"time/{phase}_s"] = float(seconds)
    return out


def flatten(tree: Any, prefix: str = "") -> dict[str, Any]:
    """{'train': {'lr': 1}} -> {'train.lr': 1}: trackers take flat parameters."""
    if not isinstance(tree, dict):
        return {prefix: tree}
    out: dict[str, Any] = {}
    for key, value in tree.items():
        out.update(flatten(value, f"{prefix}.{key}" if prefix else str(key)))
    return out


def header_params(header: dict) -> dict[str, Any]:
    """The run's parameters: the header's description of the run and the resolved config."""
    params = {k: header.get(k) for k in HEADER_PARAMS if k in header}
    params.update(flatten(header.get("config") or {}, "config"))
    return params


def summary_values(summary: dict) -> dict[str, float]:
    out = {k: float(v) for k, v in flatten(summary).items()
           if isinstance(v, (int, float)) and not isinstance(v, bool)}
    out.pop("time", None)
    return out


# ---- which run, which group ----------------------------------------------------------------

@dataclass
class RunIdentity:
    """What keeps one tracked run across segments, and where its records go."""

    run_dir: Path
    name: str
    """The run's name in the tracker: its path under the campaign (cell/repeat-N) or folder."""
    group: str
    """The campaign's folder name (W&B group, MLflow experiment); 'hpcdp' outside campaigns."""
    tensorboard_dir: Path
    mlflow_uri: str
    """MLFLOW_TRACKING_URI, else a file store in the campaign's folder (or the run's)."""
    state: dict = field(default_factory=dict)
    persist: bool = True
    """Keep ids in RUN_DIR/tracking.json (training); an export leaves the run folder alone."""

    @classmethod
    def of(cls, run_dir: Path, export_to: Path | None = None) -> RunIdentity:
        run_dir = run_dir.resolve()
        campaign = next((p for p in (run_dir.parent, run_dir.parent.parent)
                         if (p / CAMPAIGN_FILE).is_file()), None)
        if campaign is not None:
            name, group, root = str(run_dir.relative_to(campaign)), campaign.name, campaign
        else:
            name, group, root = run_dir.name, "hpcdp", run_dir
        if export_to is not None:  # hpcdp harvest --to: everything under DIR
            export_to = export_to.resolve()
            return cls(run_dir, name, group, export_to / group / name, export_to.as_uri(),
                       persist=False)
        state: dict = {}
        try:
            state = json.loads((run_dir / STATE_FILE).read_text())
        except (OSError, ValueError):
            pass
        uri = os.environ.get("MLFLOW_TRACKING_URI") or (root / "mlruns").as_uri()
        return cls(run_dir, name, group, run_dir / TENSORBOARD_DIR, uri,
                   state if isinstance(state, dict) else {})

    def remember(self, **values: Any) -> None:
        """Keep ids in tracking.json (written whole, then renamed: never half a file)."""
        self.state.update(values)
        if not self.persist:
            return
        tmp = self.run_dir / f".{STATE_FILE}.tmp-{os.getpid()}"
        tmp.write_text(json.dumps(self.state, indent=1, sort_keys=True) + "\n")
        os.replace(tmp, self.run_dir / STATE_FILE)

    def wandb_id(self) -> str:
        if not re.fullmatch(r"[a-z0-9]{8,64}", str(self.state.get("wandb_id", ""))):
            self.remember(wandb_id=secrets.token_hex(8))
        return self.state["wandb_id"]


# ---- the trackers --------------------------------------------------------------------------

class Tracker:
    """One back-end. Methods may raise: TrackedRun turns a failure into one warning."""

    name = ""

    def open(self, ident: RunIdentity, params: dict[str, Any], resumed: bool) -> None:
        raise NotImplementedError

    def log(self, step: int, scalars: dict[str, float], wall_time: float) -> None:
        raise NotImplementedError

    def close(self, summary: dict[str, float], status: str) -> None:
        """status: completed, interrupted (stopped by a signal; its requeue continues the run)
        or failed."""

    def where(self) -> str:
        """Where its records went, for the run's summary and log."""
        return ""

    @staticmethod
    def holds(ident: RunIdentity) -> bool:
        """Whether this run is already there (`hpcdp harvest --to` exports a run once)."""
        return False


class TensorBoardTracker(Tracker):
    """Event files in RUN_DIR/tensorboard, written with tensorboard's own writer (no torch,
    no TensorFlow): `tensorboard --logdir runs/` then shows every run, a folder per cell."""

    name = "tensorboard"

    def open(self, ident, params, resumed):
        from tensorboard.compat.proto.event_pb2 import Event
        from tensorboard.compat.proto.summary_pb2 import Summary
        from tensorboard.summary.writer.event_file_writer import EventFileWriter
        self._event, self._summary = Event, Summary
        self.logdir = ident.tensorboard_dir
        self._writer = EventFileWriter(str(self.logdir))
        if not resumed:
            table = "\n".join(f"| {k} | {v} |" for k, v in sorted(params.items()))
            self._text("config", "| parameter | value |\n|---|---|\n" + table, 0)

    def _text(self, tag: str, text: str, step: int) -> None:
        from tensorboard.compat.proto.summary_pb2 import SummaryMetadata
        from tensorboard.compat.proto.tensor_pb2 import TensorProto
        from tensorboard.compat.proto.tensor_shape_pb2 import TensorShapeProto
        meta = SummaryMetadata(plugin_data=SummaryMetadata.PluginData(plugin_name="text"))
        tensor = TensorProto(dtype=7, string_val=[text.encode()],  # 7: DT_STRING
                             tensor_shape=TensorShapeProto(dim=[TensorShapeProto.Dim(size=1)]))
        value = self._summary.Value(tag=tag, metadata=meta, tensor=tensor)
        self._writer.add_event(self._event(wall_time=time.time(), step=step,
                                           summary=self._summary(value=[value])))

    def log(self, step, scalars, wall_time):
        values = [self._summary.Value(tag=k, simple_value=v) for k, v in scalars.items()]
        self._writer.add_event(self._event(wall_time=wall_time, step=step,
                                           summary=self._summary(value=values)))
        self._writer.flush()

    def close(self, summary, status):
        self._writer.close()

    def where(self):
        return str(self.logdir)

    @staticmethod
    def holds(ident):
        return ident.tensorboard_dir.is_dir() and any(ident.tensorboard_dir.iterdir())


class MLflowTracker(Tracker):
    """One MLflow run per run folder, in an experiment per campaign. Default store: a file
    store under the campaign (or run) folder, which compute nodes can write without a server;
    MLFLOW_TRACKING_URI points elsewhere (an http server, a shared file store)."""

    name = "mlflow"

    def open(self, ident, params, resumed):
        uri = ident.mlflow_uri
        # MLflow 3 keeps its file store in maintenance and refuses it unless told; the
        # alternative, SQLite, is unsafe on the shared file systems clusters write to.
        os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
        from mlflow.entities import Param
        from mlflow.tracking import MlflowClient
        self.client, self.uri = MlflowClient(tracking_uri=uri), uri
        experiment = self.client.get_experiment_by_name(ident.group)
        experiment_id = (experiment.experiment_id if experiment is not None
                         else self.client.create_experiment(ident.group))
        key = f"mlflow_run_id:{uri}"  # one id per store: another URI is another run
        run_id = ident.state.get(key)
        if run_id:
            self.client.update_run(run_id, status="RUNNING")
        else:
            run = self.client.create_run(experiment_id, run_name=ident.name,
                                         tags={"hpcdp.run_dir": str(ident.run_dir)})
            run_id = run.info.run_id
            ident.remember(**{key: run_id})
            # MLflow's parameters are write-once: logged with the run's first segment.
            items = [Param(k, str(v)[:6000]) for k, v in params.items()]
            for i in range(0, len(items), 100):  # log_batch takes 100 parameters at a time
                self.client.log_batch(run_id, params=items[i:i + 100])
        self.run_id = run_id

    def log(self, step, scalars, wall_time):
        from mlflow.entities import Metric
        ms = int(wall_time * 1000)
        self.client.log_batch(self.run_id, metrics=[Metric(k, v, ms, step)
                                                    for k, v in scalars.items()])

    def close(self, summary, status):
        from mlflow.entities import Metric
        ms = int(time.time() * 1000)
        if summary:
            self.client.log_batch(self.run_id, metrics=[
                Metric(f"summary/{k}", v, ms, 0) for k, v in summary.items()])
        # An interrupted run is continued by its requeued job (the run's status goes back to
        # RUNNING then); KILLED meanwhile.
        final = {"completed": "FINISHED", "failed": "FAILED"}.get(status, "KILLED")
        self.client.set_terminated(self.run_id, status=final)

    def where(self):
        return f"{self.uri} (run {self.run_id})"

    @staticmethod
    def holds(ident):
        os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
        from mlflow.tracking import MlflowClient
        client = MlflowClient(tracking_uri=ident.mlflow_uri)
        experiment = client.get_experiment_by_name(ident.group)
        if experiment is None:
            return False
        runs = client.search_runs([experiment.experiment_id], max_results=50000)
        return any(r.data.tags.get("hpcdp.run_dir") == str(ident.run_dir) for r in runs)


class WandbTracker(Tracker):
    """A W&B run with the run folder's id (resume='allow'), grouped by campaign, offline unless
    WANDB_MODE says otherwise: `wandb sync RUN_DIR/wandb/offline-run-*` from a login node."""

    name = "wandb"

    def open(self, ident, params, resumed):
        os.environ.setdefault("WANDB_MODE", "offline")
        os.environ.setdefault("WANDB_SILENT", "true")
        import wandb
        settings = wandb.Settings(console="off", save_code=False, x_disable_stats=True)
        self.run = wandb.init(project=os.environ.get("WANDB_PROJECT", "hpcdp"),
                              group=ident.group, name=ident.name, id=ident.wandb_id(),
                              resume="allow", dir=str(ident.run_dir), config=params,
                              settings=settings)
        self.dir = ident.run_dir / "wandb"

    def log(self, step, scalars, wall_time):
        self.run.log(scalars, step=step)

    def close(self, summary, status):
        self.run.summary.update(summary)
        self.run.finish(exit_code=1 if status == "failed" else 0)

    def where(self):
        return f"{self.dir} ({os.environ.get('WANDB_MODE')})"


BACKENDS: dict[str, Callable[[], Tracker]] = {
    "tensorboard": TensorBoardTracker, "mlflow": MLflowTracker, "wandb": WandbTracker}


# ---- a run's trackers together ------------------------------------------------------------

def _last_step_written(metrics_path: Path) -> int:
    """The highest step an earlier segment recorded: what the trackers already hold."""
    try:
        _, records, _ = replay(metrics_path)
    except OSError:
        return 0  # a fresh run
    return max((r["step"] for r in records), default=0)


class TrackedRun:
    """The trackers of one run: fed every record, each failure contained."""

    def __init__(self, names: Iterable[str], run_dir: Path, log: Callable[[str], None],
                 already_sent: int | None = None, ident: RunIdentity | None = None) -> None:
        self.names = list(dict.fromkeys(names))  # a tracker named twice writes once
        self.run_dir, self.log, self.ident = run_dir, log, ident
        self.active: list[Tracker] = []
        self.report: dict[str, str] = {}
        self.sent = {name: 0 for name in self.names}
        if already_sent is None:  # read the file only where a tracker will need it
            already_sent = _last_step_written(run_dir / METRICS_FILE) if self.names else 0
        self.already_sent = already_sent
        self._opened = False

    def feed(self, record: dict) -> None:
        """A metrics record: the header opens the trackers, steps and evals are logged (the
        summary is given to `close`, which says what each tracker wrote)."""
        kind = record.get("kind")
        if kind == "header":
            self._open(record)
        elif kind in ("step", "eval") and self.active:
            step = record.get("step")
            if not isinstance(step, int) or step <= self.already_sent:
                return  # sent by an earlier segment
            scalars = step_scalars(record)
            if scalars:
                self._each("log", step, scalars, record.get("time") or time.time())
            if kind == "step":
                for tracker in self.active:
                    self.sent[tracker.name] += 1

    def _open(self, header: dict) -> None:
        if self._opened or not self.names:
            return
        self._opened = True
        ident = self.ident or RunIdentity.of(self.run_dir)
        params = header_params(header)
        resumed = bool(header.get("start_step")) or self.already_sent > 0
        for name in self.names:
            tracker = BACKENDS[name]()
            try:
                tracker.open(ident, params, resumed)
            except ImportError:
                self._fail(name, f"not installed ({INSTALL[name]})")
                continue
            except Exception as exc:  # noqa: BLE001 - a tracker never stops training
                self._fail(name, f"failed to start: {_brief(exc)}")
                continue
            self.active.append(tracker)
        if self.active:
            self.log("train: tracking to " + ", ".join(f"{t.name} ({t.where()})"
                                                        for t in self.active))

    def _each(self, method: str, *args: Any) -> None:
        for tracker in list(self.active):
            try:
                getattr(tracker, method)(*args)
            except Exception as exc:  # noqa: BLE001 - a tracker never stops training
                self.active.remove(tracker)
                self._fail(tracker.name, f"failed: {_brief(exc)}; stopped writing to it")

    def _fail(self, name: str, why: str) -> None:
        self.report[name] = why
        self.log(f"train: warning: tracker {name} {why}; training goes on without it")

    def close(self, summary: dict | None = None, status: str = "completed") -> dict[str, str]:
        """Finish every tracker with the run's summary record; what each wrote."""
        active = list(self.active)
        self._each("close", summary_values(summary or {}), status)
        for tracker in active:
            if tracker in self.active:
                self.report[tracker.name] = (f"wrote {self.sent[tracker.name]} step(s) to "
                                             f"{tracker.where()}")
        self.active = []
        return dict(self.report)


def _brief(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return f"{type(exc).__name__}: {text[:200]}" if text else type(exc).__name__


def replay(metrics_path: Path) -> tuple[dict, list[dict], dict | None]:
    """The first header, every step and eval (the last record of each step, in step order)
    and the last summary: what a tracker would have received had it run with the job."""
    header, summary, latest = None, None, {}
    if not Path(metrics_path).is_file():
        raise FileNotFoundError(metrics_path)
    for record in run_folder.read_metrics(metrics_path):  # lines cut by a kill: harvest says
        kind = record["kind"]
        if kind == "header" and header is None:
            header = record
        elif kind in ("step", "eval") and isinstance(record.get("step"), int):
            latest[(record["step"], kind == "eval")] = record
        elif kind == "summary":
            summary = record
    return header or {}, [latest[k] for k in sorted(latest)], summary
