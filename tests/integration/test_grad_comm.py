"""train.grad_comm on the local cluster: gradients all-reduced in bf16 (DDP's compression hook)
or fp16 (Horovod's compression, which has no bf16) train two-node runs to the loss of fp32
within harvest's parity tolerance, and the header shows half the bytes on the wire."""

from __future__ import annotations

import subprocess
import sys

import pytest
from horovod_probe import horovod_importable
from slurm_jobs import beside_partition, records, sets, submit, wait_all

from hpcdp import harvest
from hpcdp.harvest.table import LOSS_PARITY_RTOL

# Its jobs run beside the debug partition's tests (slurm_jobs.beside_partition).
pytestmark = [pytest.mark.slurm, pytest.mark.gpu_partition]

SETTINGS = sets("train.steps=12", "train.eval_interval=0", "train.checkpoint_interval=0")


def test_compressed_gradients_train_like_fp32_with_half_the_bytes(slurm_cluster, tmp_path):
    has_horovod = horovod_importable()
    cells = [("distributed-ps", "fp32"), ("distributed-ps", "bf16")]
    if has_horovod:  # DDP's fp32 run is its reference too: the same model, bytes and batch
        cells += [("horovod", "fp16")]
    partition = beside_partition()
    jobs = {cell: submit(tmp_path, cell[0], 2, tmp_path / f"{cell[0]}-{cell[1]}", *SETTINGS,
                         *sets(f"train.grad_comm={cell[1]}", f"cluster.partition={partition}"))
            for cell in cells}
    infos = wait_all([job_id for job_id, _ in jobs.values()], timeout_s=600)
    headers = {}
    for cell, (job_id, run_dir) in jobs.items():
        assert infos[job_id].state == "COMPLETED", (cell, infos[job_id])
        headers[cell] = next(r for r in records(run_dir) if r["kind"] == "header")
        assert headers[cell]["grad_comm"] == cell[1]
    full = headers[("distributed-ps", "fp32")]["grad_bytes_per_step"]
    for cell in (("distributed-ps", "bf16"), ("horovod", "fp16")):
        if cell in headers:
            assert headers[cell]["grad_bytes_per_step"] * 2 == full, cell
    runs = {r.communication: r for r in harvest.harvest([tmp_path], query_slurm=False)}
    assert "gloo/bf16" in runs and (not has_horovod or "horovod-mpi/fp16" in runs), sorted(runs)
    for comm, r in runs.items():
        if "/" in comm:
            assert r.parity_reference is not None, comm
            assert r.loss_drift is not None and r.loss_drift <= LOSS_PARITY_RTOL, (comm, r.notes)
            print(f"{comm}: loss drift {r.loss_drift:.2e} against {r.parity_reference}")
    if not has_horovod:
        pytest.skip("Horovod is not installed: only DDP was checked")


def test_horovod_with_bf16_gradients_is_refused_before_anything_is_written(tmp_path):
    done = subprocess.run([sys.executable, "-m", "hpcdp", "submit", "-s", "horovod", "-N", "2",
                           "--out", str(tmp_path / "runs"), *sets("train.grad_comm=bf16")],
                          cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert "train.grad_comm 'bf16': horovod sends gradients in fp32, fp16 only" in done.stderr
    assert not (tmp_path / "runs").exists()
    assert len(done.stderr.strip().splitlines()) == 1
