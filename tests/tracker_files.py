"""Reading back what the trackers wrote, each with its own reader: TensorBoard's event
accumulator, MLflow's client, and W&B's offline run files (the .wandb transaction log that
`wandb sync` uploads, read record by record)."""

from __future__ import annotations

import json
import os
import struct
from pathlib import Path


def tensorboard_scalars(logdir: Path, tag: str) -> list[tuple[int, float]]:
    """(step, value) of every event of `tag` in a TensorBoard log dir, all event files."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    acc = EventAccumulator(str(logdir), size_guidance={"scalars": 0})
    acc.Reload()
    return [(e.step, e.value) for e in acc.Scalars(tag)]


def mlflow_runs(store: Path, experiment: str) -> dict[str, dict]:
    """run name -> {'id', 'status', 'history': [(step, value)] of train/loss} in a file store."""
    os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
    from mlflow.tracking import MlflowClient
    client = MlflowClient(tracking_uri=store.resolve().as_uri())
    found = client.get_experiment_by_name(experiment)
    assert found is not None, f"no MLflow experiment {experiment!r} in {store}"
    runs = {}
    for run in client.search_runs([found.experiment_id]):
        history = client.get_metric_history(run.info.run_id, "train/loss")
        runs[run.info.run_name] = {
            "id": run.info.run_id, "status": run.info.status, "params": run.data.params,
            "history": sorted((m.step, m.value) for m in history)}
    return runs


def _wandb_records(path: Path):
    """The protobuf records of one .wandb file: a LevelDB-style log (7-byte header ':W&B',
    magic, version; then 32 KiB blocks of chunks: crc32c, length, type, data)."""
    from wandb.proto import wandb_internal_pb2
    data = path.read_bytes()
    assert data[:4] == b":W&B", path
    block, pos, pending = 32768, 7, b""
    while pos + 7 <= len(data):
        if block - pos % block < 7:  # a block's tail too short for a chunk header: padding
            pos += block - pos % block
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        chunk = data[pos + 7:pos + 7 + length]
        pos += 7 + length
        if kind == 0 and length == 0:
            continue
        pending += chunk
        if kind in (1, 4):  # FULL, LAST
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            pending = b""
            yield record


def wandb_runs(wandb_dir: Path) -> list[dict]:
    """Each offline run folder under RUN_DIR/wandb: its id, group and logged (step, loss)."""
    runs = []
    for folder in sorted(wandb_dir.glob("offline-run-*")):
        (log,) = folder.glob("run-*.wandb")
        info = {"folder": folder.name, "id": None, "group": None, "history": []}
        for record in _wandb_records(log):
            which = record.WhichOneof("record_type")
            if which == "run":
                info["id"], info["group"] = record.run.run_id, record.run.run_group
            elif which == "history":
                items = {i.key or "/".join(i.nested_key): json.loads(i.value_json)
                         for i in record.history.item}
                if "train/loss" in items:
                    info["history"].append((int(items["_step"]), float(items["train/loss"])))
        runs.append(info)
    return runs
