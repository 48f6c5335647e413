"""hpcdp.distenv: real launcher environments -> DistEnv, and the fail-fast checks.

The environments below are real, written out as dicts (variables that nothing reads, such as
SLURM_TOPOLOGY_ADDR or SLURM_JOB_UID, are left out):
- SLURM_*: printed by `env` in the batch shell and in every srun task of jobs on a local
  Slurm 22.05 cluster with two slurmd nodes (node1, node2), jobs 16536-16544.
- torchrun: torch 2.13's `torchrun --standalone --nproc-per-node=2`, and the same inside
  `srun -N1 -n1`.
Written by hand, and said so where they are: horovodrun's Gloo mode (Horovod is not installed
here; the names and meanings are those of create_slot_env_vars in horovod/runner/gloo_run.py)
and `--gpus-per-task=1` (no GPU here; Slurm then gives each task CUDA_VISIBLE_DEVICES with one
entry, so every task sees device 0).

The tests marked `slurm` run real srun/sbatch jobs on the local cluster when it is up.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from hpcdp import PROJECT_ROOT
from hpcdp.distenv import (
    DEFAULT_MASTER_PORT,
    LAUNCHERS,
    PORT_RANGE_END,
    PORT_RANGE_START,
    DistEnv,
    DistEnvError,
    HostlistError,
    check_master_is_rank0_node,
    check_world,
    container_hint,
    container_in_use,
    detect,
    expand_hostlist,
    master_port_for_job,
    threads_per_process,
)
from hpcdp.errors import UsageError

# --------------------------------------------------------------------------------------------
# Real environments (see the module docstring)

N1X4_2 = {
    "ENVIRONMENT": "BATCH", "SLURMD_NODENAME": "node1", "SLURM_CPUS_ON_NODE": "4",
    "SLURM_DISTRIBUTION": "block", "SLURM_GTIDS": "0,1,2,3", "SLURM_JOBID": "16538",
    "SLURM_JOB_CPUS_PER_NODE": "4", "SLURM_JOB_ID": "16538", "SLURM_JOB_NODELIST": "node1",
    "SLURM_JOB_NUM_NODES": "1", "SLURM_LAUNCH_NODE_IPADDR": "127.0.0.1", "SLURM_LOCALID": "2",
    "SLURM_NNODES": "1", "SLURM_NODEID": "0", "SLURM_NODELIST": "node1", "SLURM_NPROCS": "4",
    "SLURM_NTASKS": "4", "SLURM_NTASKS_PER_NODE": "4", "SLURM_PROCID": "2",
    "SLURM_SRUN_COMM_HOST": "127.0.0.1", "SLURM_STEPID": "0", "SLURM_STEP_ID": "0",
    "SLURM_STEP_NODELIST": "node1", "SLURM_STEP_NUM_NODES": "1", "SLURM_STEP_NUM_TASKS": "4",
    "SLURM_STEP_TASKS_PER_NODE": "4", "SLURM_TASKS_PER_NODE": "4",
}

N1X4_BATCH = {
    "ENVIRONMENT": "BATCH", "SLURMD_NODENAME": "node1", "SLURM_CPUS_ON_NODE": "4",
    "SLURM_GTIDS": "0", "SLURM_JOBID": "16538", "SLURM_JOB_CPUS_PER_NODE": "4",
    "SLURM_JOB_ID": "16538", "SLURM_JOB_NODELIST": "node1", "SLURM_JOB_NUM_NODES": "1",
    "SLURM_LOCALID": "0", "SLURM_NNODES": "1", "SLURM_NODEID": "0", "SLURM_NODELIST": "node1",
    "SLURM_NPROCS": "4", "SLURM_NTASKS": "4", "SLURM_NTASKS_PER_NODE": "4", "SLURM_PROCID": "0",
    "SLURM_TASKS_PER_NODE": "4",
}

N2X4_0 = {
    "ENVIRONMENT": "BATCH", "SLURMD_NODENAME": "node1", "SLURM_CPUS_ON_NODE": "4",
    "SLURM_DISTRIBUTION": "block", "SLURM_GTIDS": "0,1,2,3", "SLURM_JOBID": "16539",
    "SLURM_JOB_CPUS_PER_NODE": "4(x2)", "SLURM_JOB_ID": "16539", "SLURM_JOB_NODELIST": "node[1-2]",
    "SLURM_JOB_NUM_NODES": "2", "SLURM_LAUNCH_NODE_IPADDR": "127.0.0.1", "SLURM_LOCALID": "0",
    "SLURM_NNODES": "2", "SLURM_NODEID": "0", "SLURM_NODELIST": "node[1-2]", "SLURM_NPROCS": "8",
    "SLURM_NTASKS": "8", "SLURM_NTASKS_PER_NODE": "4", "SLURM_PROCID": "0",
    "SLURM_SRUN_COMM_HOST": "127.0.0.1", "SLURM_STEPID": "0", "SLURM_STEP_ID": "0",
    "SLURM_STEP_NODELIST": "node[1-2]", "SLURM_STEP_NUM_NODES": "2", "SLURM_STEP_NUM_TASKS": "8",
    "SLURM_STEP_TASKS_PER_NODE": "4(x2)", "SLURM_TASKS_PER_NODE": "4(x2)",
}

N2X4_5 = {
    "ENVIRONMENT": "BATCH", "SLURMD_NODENAME": "node2", "SLURM_CPUS_ON_NODE": "4",
    "SLURM_DISTRIBUTION": "block", "SLURM_GTIDS": "4,5,6,7", "SLURM_JOBID": "16539",
    "SLURM_JOB_CPUS_PER_NODE": "4(x2)", "SLURM_JOB_ID": "16539", "SLURM_JOB_NODELIST": "node[1-2]",
    "SLURM_JOB_NUM_NODES": "2", "SLURM_LAUNCH_NODE_IPADDR": "127.0.0.1", "SLURM_LOCALID": "1",
    "SLURM_NNODES": "2", "SLURM_NODEID": "1", "SLURM_NODELIST": "node[1-2]", "SLURM_NPROCS": "8",
    "SLURM_NTASKS": "8", "SLURM_NTASKS_PER_NODE": "4", "SLURM_PROCID": "5",
    "SLURM_SRUN_COMM_HOST": "127.0.0.1", "SLURM_STEPID": "0", "SLURM_STEP_ID": "0",
    "SLURM_STEP_NODELIST": "node[1-2]", "SLURM_STEP_NUM_NODES": "2", "SLURM_STEP_NUM_TASKS": "8",
    "SLURM_STEP_TASKS_PER_NODE": "4(x2)", "SLURM_TASKS_PER_NODE": "4(x2)",
}

N2X4_BATCH = {
    "ENVIRONMENT": "BATCH", "SLURMD_NODENAME": "node1", "SLURM_CPUS_ON_NODE": "4",
    "SLURM_GTIDS": "0", "SLURM_JOBID": "16539", "SLURM_JOB_CPUS_PER_NODE": "4(x2)",
    "SLURM_JOB_ID": "16539", "SLURM_JOB_NODELIST": "node[1-2]", "SLURM_JOB_NUM_NODES": "2",
    "SLURM_LOCALID": "0", "SLURM_NNODES": "2", "SLURM_NODEID": "0", "SLURM_NODELIST": "node[1-2]",
    "SLURM_NPROCS": "8", "SLURM_NTASKS": "8", "SLURM_NTASKS_PER_NODE": "4", "SLURM_PROCID": "0",
    "SLURM_TASKS_PER_NODE": "4(x2)",
}

N5UNEVEN_3 = {
    "ENVIRONMENT": "BATCH", "SLURMD_NODENAME": "node1", "SLURM_CPUS_ON_NODE": "4",
    "SLURM_DISTRIBUTION": "block", "SLURM_GTIDS": "0,1,2,3", "SLURM_JOBID": "16540",
    "SLURM_JOB_CPUS_PER_NODE": "4,1", "SLURM_JOB_ID": "16540", "SLURM_JOB_NODELIST": "node[1-2]",
    "SLURM_JOB_NUM_NODES": "2", "SLURM_LAUNCH_NODE_IPADDR": "127.0.0.1", "SLURM_LOCALID": "3",
    "SLURM_NNODES": "2", "SLURM_NODEID": "0", "SLURM_NODELIST": "node[1-2]", "SLURM_NPROCS": "5",
    "SLURM_NTASKS": "5", "SLURM_PROCID": "3", "SLURM_SRUN_COMM_HOST": "127.0.0.1",
    "SLURM_STEPID": "0", "SLURM_STEP_ID": "0", "SLURM_STEP_NODELIST": "node[1-2]",
    "SLURM_STEP_NUM_NODES": "2", "SLURM_STEP_NUM_TASKS": "5", "SLURM_STEP_TASKS_PER_NODE": "4,1",
    "SLURM_TASKS_PER_NODE": "4,1",
}

N5UNEVEN_4 = {
    "ENVIRONMENT": "BATCH", "SLURMD_NODENAME": "node2", "SLURM_CPUS_ON_NODE": "1",
    "SLURM_DISTRIBUTION": "block", "SLURM_GTIDS": "4", "SLURM_JOBID": "16540",
    "SLURM_JOB_CPUS_PER_NODE": "4,1", "SLURM_JOB_ID": "16540", "SLURM_JOB_NODELIST": "node[1-2]",
    "SLURM_JOB_NUM_NODES": "2", "SLURM_LAUNCH_NODE_IPADDR": "127.0.0.1", "SLURM_LOCALID": "0",
    "SLURM_NNODES": "2", "SLURM_NODEID": "1", "SLURM_NODELIST": "node[1-2]", "SLURM_NPROCS": "5",
    "SLURM_NTASKS": "5", "SLURM_PROCID": "4", "SLURM_SRUN_COMM_HOST": "127.0.0.1",
    "SLURM_STEPID": "0", "SLURM_STEP_ID": "0", "SLURM_STEP_NODELIST": "node[1-2]",
    "SLURM_STEP_NUM_NODES": "2", "SLURM_STEP_NUM_TASKS": "5", "SLURM_STEP_TASKS_PER_NODE": "4,1",
    "SLURM_TASKS_PER_NODE": "4,1",
}

CPT2_1 = {
    "ENVIRONMENT": "BATCH", "SLURMD_NODENAME": "node2", "SLURM_CPUS_ON_NODE": "2",
    "SLURM_CPUS_PER_TASK": "2", "SLURM_DISTRIBUTION": "cyclic", "SLURM_GTIDS": "1",
    "SLURM_JOBID": "16541", "SLURM_JOB_CPUS_PER_NODE": "2(x2)", "SLURM_JOB_ID": "16541",
    "SLURM_JOB_NODELIST": "node[1-2]", "SLURM_JOB_NUM_NODES": "2",
    "SLURM_LAUNCH_NODE_IPADDR": "127.0.0.1", "SLURM_LOCALID": "0", "SLURM_NNODES": "2",
    "SLURM_NODEID": "1", "SLURM_NODELIST": "node[1-2]", "SLURM_NPROCS": "2", "SLURM_NTASKS": "2",
    "SLURM_NTASKS_PER_NODE": "1", "SLURM_PROCID": "1", "SLURM_SRUN_COMM_HOST": "127.0.0.1",
    "SLURM_STEPID": "0", "SLURM_STEP_ID": "0", "SLURM_STEP_NODELIST": "node[1-2]",
    "SLURM_STEP_NUM_NODES": "2", "SLURM_STEP_NUM_TASKS": "2", "SLURM_STEP_TASKS_PER_NODE": "1(x2)",
    "SLURM_TASKS_PER_NODE": "1(x2)",
}

REQUEUED_1 = {
    "ENVIRONMENT": "BATCH", "SLURMD_NODENAME": "node2", "SLURM_CPUS_ON_NODE": "1",
    "SLURM_DISTRIBUTION": "cyclic", "SLURM_GTIDS": "1", "SLURM_JOBID": "16543",
    "SLURM_JOB_CPUS_PER_NODE": "1(x2)", "SLURM_JOB_ID": "16543", "SLURM_JOB_NODELIST": "node[1-2]",
    "SLURM_JOB_NUM_NODES": "2", "SLURM_LAUNCH_NODE_IPADDR": "127.0.0.1", "SLURM_LOCALID": "0",
    "SLURM_NNODES": "2", "SLURM_NODEID": "1", "SLURM_NODELIST": "node[1-2]", "SLURM_NPROCS": "2",
    "SLURM_NTASKS": "2", "SLURM_NTASKS_PER_NODE": "1", "SLURM_PROCID": "1",
    "SLURM_RESTART_COUNT": "1", "SLURM_SRUN_COMM_HOST": "127.0.0.1", "SLURM_STEPID": "0",
    "SLURM_STEP_ID": "0", "SLURM_STEP_NODELIST": "node[1-2]", "SLURM_STEP_NUM_NODES": "2",
    "SLURM_STEP_NUM_TASKS": "2", "SLURM_STEP_TASKS_PER_NODE": "1(x2)",
    "SLURM_TASKS_PER_NODE": "1(x2)",
}

TORCHRUN_1 = {
    "GROUP_RANK": "0", "GROUP_WORLD_SIZE": "1", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2",
    "MASTER_ADDR": "localhost", "MASTER_PORT": "42349", "RANK": "1", "ROLE_RANK": "1",
    "ROLE_WORLD_SIZE": "2", "TORCHELASTIC_MAX_RESTARTS": "0", "TORCHELASTIC_RESTART_COUNT": "0",
    "TORCHELASTIC_RUN_ID": "4f1c154f-2784-4912-8951-989496a3e978",
    "TORCHELASTIC_USE_AGENT_STORE": "True", "WORLD_SIZE": "2",
}

TORCHRUN_IN_SRUN_0 = {
    "GROUP_RANK": "0", "GROUP_WORLD_SIZE": "1", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "2",
    "MASTER_ADDR": "localhost", "MASTER_PORT": "45323", "RANK": "0", "ROLE_RANK": "0",
    "ROLE_WORLD_SIZE": "2", "SLURMD_NODENAME": "node1", "SLURM_CPUS_ON_NODE": "1",
    "SLURM_GTIDS": "0", "SLURM_JOBID": "16544", "SLURM_JOB_CPUS_PER_NODE": "1",
    "SLURM_JOB_ID": "16544", "SLURM_JOB_NODELIST": "node1", "SLURM_JOB_NUM_NODES": "1",
    "SLURM_LAUNCH_NODE_IPADDR": "127.0.0.1", "SLURM_LOCALID": "0", "SLURM_NNODES": "1",
    "SLURM_NODEID": "0", "SLURM_NODELIST": "node1", "SLURM_NPROCS": "1", "SLURM_NTASKS": "1",
    "SLURM_PROCID": "0", "SLURM_SRUN_COMM_HOST": "127.0.0.1", "SLURM_STEPID": "0",
    "SLURM_STEP_ID": "0", "SLURM_STEP_NODELIST": "node1", "SLURM_STEP_NUM_NODES": "1",
    "SLURM_STEP_NUM_TASKS": "1", "SLURM_STEP_TASKS_PER_NODE": "1", "SLURM_TASKS_PER_NODE": "1",
    "TORCHELASTIC_MAX_RESTARTS": "0", "TORCHELASTIC_RESTART_COUNT": "0",
    "TORCHELASTIC_RUN_ID": "x", "TORCHELASTIC_USE_AGENT_STORE": "True", "WORLD_SIZE": "2",
}

# horovodrun -np 4 -H node1:2,node2:2 --gloo: the slot of rank 3, written from
# create_slot_env_vars + create_run_envs in horovod/runner/gloo_run.py (Horovod 0.28.1).
HOROVODRUN_GLOO_3 = {
    "HOROVOD_HOSTNAME": "node2", "HOROVOD_RANK": "3", "HOROVOD_SIZE": "4",
    "HOROVOD_LOCAL_RANK": "1", "HOROVOD_LOCAL_SIZE": "2", "HOROVOD_CROSS_RANK": "1",
    "HOROVOD_CROSS_SIZE": "2", "HOROVOD_GLOO_RENDEZVOUS_ADDR": "10.1.0.1",
    "HOROVOD_GLOO_RENDEZVOUS_PORT": "41234", "HOROVOD_CONTROLLER": "gloo",
    "HOROVOD_CPU_OPERATIONS": "gloo", "HOROVOD_GLOO_IFACE": "eth0", "NCCL_SOCKET_IFNAME": "eth0",
    "PYTHONUNBUFFERED": "1",
}


def with_changes(base: dict[str, str], **changes: str | None) -> dict[str, str]:
    """A copy of a real environment with some variables set (or removed with None)."""
    env = dict(base)
    for key, value in changes.items():
        if value is None:
            env.pop(key, None)
        else:
            env[key] = value
    return env


# --------------------------------------------------------------------------------------------
# Slurm tasks started by srun


def test_single_node_four_tasks() -> None:
    env = detect(N1X4_2)
    assert (env.launcher, env.in_step) == ("slurm", True)
    assert (env.rank, env.local_rank, env.world_size, env.local_world_size) == (2, 2, 4, 4)
    assert (env.node_rank, env.num_nodes) == (0, 1)
    assert env.hosts == ("node1",)
    assert env.master_addr == "node1"
    assert env.master_port == master_port_for_job("16538")
    assert env.job_id == "16538"
    assert env.tasks_per_node == (4,)
    assert (env.restart_count, env.cpus_per_task, env.network_interface) == (0, None, None)


def test_two_nodes_four_tasks_each() -> None:
    first, sixth = detect(N2X4_0), detect(N2X4_5)
    assert (first.rank, first.local_rank, first.node_rank) == (0, 0, 0)
    assert (sixth.rank, sixth.local_rank, sixth.node_rank) == (5, 1, 1)
    for env in (first, sixth):
        assert (env.world_size, env.local_world_size, env.num_nodes) == (8, 4, 2)
        assert env.hosts == ("node1", "node2")
        assert env.master_addr == "node1"
        assert "SLURM_STEP_NODELIST" in env.master_addr_source
    # Every task derives the same rendezvous without talking to the others.
    assert first.torch_env()["MASTER_PORT"] == sixth.torch_env()["MASTER_PORT"]
    assert sixth.torch_env() == {
        "MASTER_ADDR": "node1", "MASTER_PORT": str(master_port_for_job(16539)), "RANK": "5",
        "LOCAL_RANK": "1", "WORLD_SIZE": "8", "LOCAL_WORLD_SIZE": "4", "NODE_RANK": "1",
    }
    assert sixth.horovod_view() == {"rank": 5, "size": 8, "local_rank": 1, "local_size": 4,
                                    "cross_rank": 1, "cross_size": 2}


def test_ntasks_without_ntasks_per_node_fills_nodes_unevenly() -> None:
    # `sbatch -N2 --ntasks=5` + plain srun: Slurm put 4 tasks on node1 and 1 on node2.
    on_node1, on_node2 = detect(N5UNEVEN_3), detect(N5UNEVEN_4)
    assert on_node1.tasks_per_node == on_node2.tasks_per_node == (4, 1)
    assert (on_node1.node_rank, on_node1.local_rank, on_node1.local_world_size) == (0, 3, 4)
    assert (on_node2.node_rank, on_node2.local_rank, on_node2.local_world_size) == (1, 0, 1)
    assert on_node1.world_size == on_node2.world_size == 5
    # Local rank 3 exists on node1 only; local rank 0 on both nodes.
    assert on_node1.horovod_view()["cross_size"] == 1
    assert (on_node2.horovod_view()["cross_rank"], on_node2.horovod_view()["cross_size"]) == (1, 2)


@pytest.mark.parametrize(
    "layout,node_id,expected",
    [("3,2", "0", 3), ("3,2", "1", 2), ("2(x3)", "2", 2), ("2(x2),1", "1", 2),
     ("2(x2),1", "2", 1), ("1,3(x2)", "2", 3)],
)
def test_tasks_per_node_formats_are_indexed_by_node_id(layout: str, node_id: str,
                                                       expected: int) -> None:
    world = str(sum(int(p.split("(")[0]) * (int(p.split("x")[1][:-1]) if "x" in p else 1)
                    for p in layout.split(",")))
    env = detect(with_changes(N2X4_0, SLURM_GTIDS=None,
                              SLURM_STEP_TASKS_PER_NODE=None, SLURM_TASKS_PER_NODE=layout,
                              SLURM_NODEID=node_id, SLURM_NTASKS=world,
                              SLURM_STEP_NUM_TASKS=world, SLURM_JOB_NUM_NODES="3",
                              SLURM_STEP_NUM_NODES="3", SLURM_STEP_NODELIST="node[1-3]"))
    assert env.local_world_size == expected


def test_gpus_per_task_every_task_uses_its_only_visible_device() -> None:
    # Hand-made (no GPU here): `srun --gpus-per-task=1` gives each task one GPU, so the task
    # with local rank 3 sees CUDA_VISIBLE_DEVICES=3 and, inside, device 0 only.
    for local_rank in range(4):
        environ = with_changes(N2X4_5, SLURM_LOCALID=str(local_rank),
                               SLURM_PROCID=str(4 + local_rank),
                               CUDA_VISIBLE_DEVICES=str(local_rank))
        env = detect(environ)
        visible = len(environ["CUDA_VISIBLE_DEVICES"].split(","))
        assert env.device_index(visible) == 0
        assert env.device_index(4) == local_rank  # all 4 GPUs visible: local rank is the index
    assert detect(N2X4_5).device_index(0) == 0  # no devices: CPU


# (bound: CUDA_VISIBLE_DEVICES set for the task, visible GPUs, index of each of the node's 4
# local ranks, or None: refused before NCCL would find two ranks on one GPU)
BINDINGS = {
    "--gpus-per-task=1: each task sees its own one": (True, 1, [0, 0, 0, 0]),
    "--gpus-per-task=2 (or --gpu-bind): its own two": (True, 2, [0, 1, 0, 1]),
    "--gpus-per-node=4, no binding: all four shared": (False, 4, [0, 1, 2, 3]),
    "--gpu-bind=none with CUDA_VISIBLE_DEVICES=0,1,2,3": (True, 4, [0, 1, 2, 3]),
    "four ranks, two GPUs shared": (False, 2, None),
    "four ranks, one GPU shared": (False, 1, None),
    "no GPU: the CPU": (False, 0, [0, 0, 0, 0]),
}


@pytest.mark.parametrize("case", list(BINDINGS))
def test_device_choice_under_each_gpu_binding(case: str) -> None:
    bound, visible, expected = BINDINGS[case]
    for local_rank in range(4):
        env = detect(with_changes(N2X4_5, SLURM_LOCALID=str(local_rank),
                                  SLURM_PROCID=str(4 + local_rank)))
        if expected is None:
            with pytest.raises(DistEnvError, match=rf"4 ranks on this node share {visible} "
                                                   r"visible GPU\(s\).*gpus-per-task"):
                env.check_visible_devices(visible, bound)
            continue
        env.check_visible_devices(visible, bound)
        assert env.device_index(visible) == expected[local_rank]


def test_requeued_job_counts_restarts() -> None:
    env = detect(REQUEUED_1)
    assert env.restart_count == 1
    assert env.master_port == master_port_for_job(env.job_id)  # same id after a requeue


def test_cpus_per_task_sets_threads() -> None:
    env = detect(CPT2_1)
    assert env.cpus_per_task == 2
    assert threads_per_process(env, CPT2_1) == 2


def test_threads_without_cpus_per_task_share_the_node() -> None:
    env = detect(N1X4_2)
    assert threads_per_process(env, N1X4_2) == max(1, (os.cpu_count() or 1) // 4)
    crowded = dataclasses.replace(env, local_world_size=10_000, tasks_per_node=(10_000,))
    assert threads_per_process(crowded, N1X4_2) == 1


def test_an_explicit_omp_num_threads_wins() -> None:
    assert threads_per_process(detect(CPT2_1), {**CPT2_1, "OMP_NUM_THREADS": "3"}) == 3
    assert threads_per_process(detect(CPT2_1), {**CPT2_1, "OMP_NUM_THREADS": "x"}) == 2


# --------------------------------------------------------------------------------------------
# The batch shell without srun (pain point 1)


def test_batch_shell_is_rank_0_of_1_and_not_a_step() -> None:
    # sbatch's shell has SLURM_PROCID=0 too: only the missing step id tells it apart.
    assert N2X4_BATCH["SLURM_PROCID"] == "0" and "SLURM_STEP_ID" not in N2X4_BATCH
    env = detect(N2X4_BATCH)
    assert (env.launcher, env.in_step) == ("slurm", False)
    assert (env.rank, env.world_size, env.local_world_size, env.num_nodes) == (0, 1, 1, 1)
    assert env.job_num_tasks == 8
    assert env.hosts == ("node1", "node2")


def test_batch_shell_check_world_says_run_it_with_srun() -> None:
    env = detect(N1X4_BATCH)
    with pytest.raises(DistEnvError) as info:
        check_world(env, expected_world_size=4, expected_tasks_per_node=None)
    assert str(info.value) == (
        "started with 1 process but the job asked for 4; run it with srun inside the "
        "allocation (the rendered script does)"
    )
    # Even without an expectation, the job's own SLURM_NTASKS=4 gives it away.
    with pytest.raises(DistEnvError, match="asked for 4; run it with srun"):
        check_world(env, None, None)


def test_batch_shell_of_a_one_task_job_passes_check_world() -> None:
    environ = with_changes(N1X4_BATCH, SLURM_NTASKS="1", SLURM_NPROCS="1",
                           SLURM_TASKS_PER_NODE="1", SLURM_NTASKS_PER_NODE="1")
    check_world(detect(environ), 1, 1)


def test_special_step_ids_are_not_steps() -> None:
    for step_id in ("4294967291", "4294967292", "batch", "extern"):
        env = detect(with_changes(N2X4_5, SLURM_STEP_ID=step_id, SLURM_STEPID=step_id))
        assert env.in_step is False, step_id


def test_hand_made_environment_with_procid_only_counts_as_srun_task() -> None:
    environ = {"SLURM_JOB_ID": "77", "SLURM_PROCID": "1", "SLURM_LOCALID": "1",
               "SLURM_NODEID": "0", "SLURM_NTASKS": "2", "SLURM_JOB_NODELIST": "gpu-[01-02]",
               "SLURM_JOB_NUM_NODES": "1", "SLURM_TASKS_PER_NODE": "2"}
    env = detect(environ)
    assert (env.in_step, env.rank, env.world_size, env.master_addr) == (True, 1, 2, "gpu-01")


def test_check_world_matching_passes_and_wrong_layout_fails() -> None:
    check_world(detect(N2X4_5), 8, 4)
    with pytest.raises(DistEnvError, match="node 0 runs 4 tasks but the job asked for 2 per "
                                           r"node \(tasks per node: 4,1\)"):
        check_world(detect(N5UNEVEN_3), None, 2)
    with pytest.raises(DistEnvError, match="started with 8 processes but the job asked for 16"):
        check_world(detect(N2X4_5), 16, None)


# --------------------------------------------------------------------------------------------
# Other launchers


def test_torchrun_standalone() -> None:
    env = detect(TORCHRUN_1)
    assert env.launcher == "torchrun"
    assert (env.rank, env.local_rank, env.world_size, env.local_world_size) == (1, 1, 2, 2)
    assert (env.node_rank, env.num_nodes) == (0, 1)
    assert (env.master_addr, env.master_port) == ("localhost", 42349)
    assert "torchrun" in env.master_addr_source
    assert (env.job_id, env.hosts, env.restart_count) == (None, (), 0)


def test_torchrun_inside_srun_wins_over_slurm() -> None:
    env = detect(TORCHRUN_IN_SRUN_0)
    assert env.launcher == "torchrun"
    assert env.world_size == 2  # torchrun's workers, not srun's one task
    assert env.master_port == 45323
    assert (env.job_id, env.hosts) == ("16544", ("node1",))


def test_torchrun_restarts_count_outside_slurm() -> None:
    assert detect({**TORCHRUN_1, "TORCHELASTIC_RESTART_COUNT": "2"}).restart_count == 2


def test_horovodrun_gloo() -> None:
    env = detect(HOROVODRUN_GLOO_3)
    assert env.launcher == "horovodrun"
    assert (env.rank, env.local_rank, env.world_size, env.local_world_size) == (3, 1, 4, 2)
    assert (env.node_rank, env.num_nodes) == (1, 2)
    assert env.network_interface == "eth0"
    assert env.master_addr == "10.1.0.1"  # no Slurm, no MASTER_ADDR: horovodrun's host
    # The Horovod view gives back exactly what horovodrun set.
    view = env.horovod_view()
    assert {f"HOROVOD_{k.upper()}": str(v) for k, v in view.items()} == {
        k: v for k, v in HOROVODRUN_GLOO_3.items()
        if k in ("HOROVOD_RANK", "HOROVOD_SIZE", "HOROVOD_LOCAL_RANK", "HOROVOD_LOCAL_SIZE",
                 "HOROVOD_CROSS_RANK", "HOROVOD_CROSS_SIZE")
    }


def test_horovodrun_inside_slurm_takes_master_and_job_from_slurm() -> None:
    slurm = {k: v for k, v in N2X4_5.items() if k.startswith("SLURM_JOB")}
    env = detect({**HOROVODRUN_GLOO_3, **slurm})
    assert (env.launcher, env.master_addr, env.job_id) == ("horovodrun", "node1", "16539")


def test_plain_python() -> None:
    env = detect({"HOME": "/root", "PATH": "/usr/bin"})
    assert env.launcher == "none"
    assert (env.rank, env.local_rank, env.world_size, env.local_world_size) == (0, 0, 1, 1)
    assert (env.node_rank, env.num_nodes, env.in_step) == (0, 1, False)  # in no step at all
    assert (env.master_addr, env.master_port) == ("127.0.0.1", DEFAULT_MASTER_PORT)
    assert (env.job_id, env.hosts, env.restart_count) == (None, (), 0)
    check_world(env, 1, 1)
    check_master_is_rank0_node(env, "anyhost")


def test_detect_reads_os_environ_by_default() -> None:
    # A real process whose whole environment is a Slurm task's.
    code = "import json, hpcdp.distenv as d; print(json.dumps(d.detect().as_dict()))"
    environ = {**N2X4_5, "PATH": os.environ.get("PATH", "/usr/bin"),
               "PYTHONPATH": str(PROJECT_ROOT)}
    done = subprocess.run([sys.executable, "-c", code], env=environ, capture_output=True,
                          text=True, timeout=60, check=True)
    assert json.loads(done.stdout) == detect(N2X4_5).as_dict()


# --------------------------------------------------------------------------------------------
# Master address, port, network interface


def test_explicit_master_addr_is_kept_and_recorded() -> None:
    env = detect(with_changes(N2X4_5, MASTER_ADDR="10.0.0.7", MASTER_PORT="12345"))
    assert env.launcher == "slurm"  # MASTER_ADDR alone does not make it torchrun
    assert (env.master_addr, env.master_port) == ("10.0.0.7", 12345)
    assert "MASTER_ADDR" in env.master_addr_source and "set in the environment" in \
        env.master_addr_source
    assert "MASTER_PORT" in env.master_port_source


def test_network_interface_profile_wins_over_nccl_variable() -> None:
    env = detect(with_changes(N2X4_5, HPCDP_NETWORK_INTERFACE="ib0", NCCL_SOCKET_IFNAME="eth0"))
    assert env.network_interface == "ib0"
    assert env.torch_env()["NCCL_SOCKET_IFNAME"] == "ib0"
    assert env.torch_env()["GLOO_SOCKET_IFNAME"] == "ib0"
    assert detect(with_changes(N2X4_5, NCCL_SOCKET_IFNAME="eth0")).network_interface == "eth0"
    assert "NCCL_SOCKET_IFNAME" not in detect(N2X4_5).torch_env()


def test_nccl_exclusion_list_becomes_an_interface_gloo_can_read() -> None:
    # NCCL's "^lo,docker" means "anything but" (by prefix); Gloo only takes names, so each
    # node resolves it to its first interface with an address that no entry prefixes.
    env = detect(with_changes(N2X4_5, HPCDP_NETWORK_INTERFACE="^lo,docker"))
    assert env.gloo_interface(available=["lo", "docker0", "eth0", "ib0"]) == "eth0"
    assert env.torch_env()["NCCL_SOCKET_IFNAME"] == "^lo,docker"
    with pytest.raises(DistEnvError, match=r"'\^lo,docker' leaves Gloo no interface.*lo, docker0"):
        env.gloo_interface(available=["lo", "docker0"])
    exact = detect(with_changes(N2X4_5, HPCDP_NETWORK_INTERFACE="=eth0")).torch_env()
    assert (exact["NCCL_SOCKET_IFNAME"], exact["GLOO_SOCKET_IFNAME"]) == ("=eth0", "eth0")
    chosen = detect(with_changes(N2X4_5, HPCDP_NETWORK_INTERFACE="^lo", GLOO_SOCKET_IFNAME="ib1"))
    assert chosen.torch_env()["GLOO_SOCKET_IFNAME"] == "ib1"  # the user's own choice wins


def test_master_port_range_and_determinism() -> None:
    assert master_port_for_job(None) == DEFAULT_MASTER_PORT == 29500
    assert master_port_for_job("123") == master_port_for_job(123) == master_port_for_job(" 123 ")
    array_ports = {master_port_for_job(f"123_{i}") for i in range(50)}
    assert len(array_ports) == 50 and master_port_for_job(123) not in array_ports
    ports = [master_port_for_job(i) for i in range(100_000, 112_768)]
    assert len(set(ports)) == len(ports)  # consecutive jobs never share a port
    for job in (0, 1, 16539, 2**31, 10**12, "999999999_999999"):
        assert PORT_RANGE_START <= master_port_for_job(job) <= PORT_RANGE_END < 32768


@pytest.mark.parametrize("bad", ["abc", "123+0", "123_[1-3]", "12 3", "", "-5", -5, True, 1.5])
def test_master_port_refuses_what_is_not_a_job_id(bad: object) -> None:
    with pytest.raises(DistEnvError, match="job id"):
        master_port_for_job(bad)  # type: ignore[arg-type]


# --------------------------------------------------------------------------------------------
# Malformed environments give one line naming the variable and the value


@pytest.mark.parametrize(
    "changes,needle",
    [
        ({"SLURM_PROCID": "x"}, "SLURM_PROCID='x' is not a whole number"),
        ({"SLURM_LOCALID": "-1"}, "SLURM_LOCALID=-1 must be >= 0"),
        ({"SLURM_STEP_NUM_TASKS": "4.0"}, "SLURM_STEP_NUM_TASKS='4.0' is not a whole number"),
        ({"SLURM_RESTART_COUNT": "one"}, "SLURM_RESTART_COUNT='one'"),
        ({"SLURM_CPUS_PER_TASK": "0"}, "SLURM_CPUS_PER_TASK=0 must be >= 1"),
        ({"SLURM_STEP_TASKS_PER_NODE": "4(x2"}, "SLURM_STEP_TASKS_PER_NODE='4(x2' is malformed"),
        ({"SLURM_NODEID": "2"}, "SLURM_NODEID=2 has no entry in SLURM_STEP_TASKS_PER_NODE='4(x2)'"),
        ({"SLURM_PROCID": "8"}, "SLURM_PROCID=8 is outside SLURM_STEP_NUM_TASKS=8"),
        ({"SLURM_LOCALID": "4"}, "SLURM_LOCALID=4 is outside tasks on this node"),
        ({"MASTER_PORT": "70000"}, "MASTER_PORT=70000 is not a TCP port"),
        ({"MASTER_PORT": "http"}, "MASTER_PORT='http' is not a whole number"),
        ({"SLURM_JOB_ID": "12a"}, "job id '12a' is not a Slurm job id"),
        ({"SLURM_PROCID": "1\n2"}, "SLURM_PROCID='1 2' is not a whole number"),
    ],
)
def test_malformed_slurm_values_name_variable_and_value(changes: dict, needle: str) -> None:
    with pytest.raises(DistEnvError) as info:
        detect(with_changes(N2X4_5, **changes))
    assert needle in str(info.value)
    assert "\n" not in str(info.value)
    assert isinstance(info.value, ValueError) and isinstance(info.value, UsageError)


def test_malformed_torchrun_and_horovodrun_values() -> None:
    with pytest.raises(DistEnvError, match="WORLD_SIZE='two'"):
        detect({**TORCHRUN_1, "WORLD_SIZE": "two"})
    with pytest.raises(DistEnvError, match="RANK=2 is outside WORLD_SIZE=2"):
        detect({**TORCHRUN_1, "RANK": "2"})
    with pytest.raises(DistEnvError, match="HOROVOD_CROSS_RANK=5 is outside HOROVOD_CROSS_SIZE=2"):
        detect({**HOROVODRUN_GLOO_3, "HOROVOD_CROSS_RANK": "5"})


@pytest.mark.parametrize("launcher,environ", [("torchrun", TORCHRUN_1),
                                              ("horovodrun", HOROVODRUN_GLOO_3),
                                              ("slurm", N2X4_5)])
def test_every_required_variable_of_every_launcher_is_named_when_missing(
        launcher: str, environ: dict[str, str]) -> None:
    row = LAUNCHERS[launcher]
    assert detect(environ).launcher == launcher
    for field in row.required:
        # Drop every name the row accepts for this field, keeping what marks the launcher.
        names = [n for n in getattr(row, field) if n not in ("HOROVOD_RANK", "RANK")]
        if not names:
            continue
        with pytest.raises(DistEnvError, match=f"{launcher} environment without {names[0]}"):
            detect(with_changes(environ, **dict.fromkeys(getattr(row, field))))


def test_open_mpi_variables_inside_an_srun_task_are_read_as_the_slurm_task() -> None:
    # Horovod over MPI runs under `srun --mpi=...`; Open MPI may export OMPI_COMM_WORLD_* once
    # MPI is up. srun's variables say the same, and they are the ones read.
    env = detect({**N2X4_5, "OMPI_COMM_WORLD_RANK": "5", "OMPI_COMM_WORLD_SIZE": "8"})
    assert (env.launcher, env.rank, env.world_size, env.node_rank) == ("slurm", 5, 8, 1)


def test_bad_nodelist_names_the_variable() -> None:
    with pytest.raises(HostlistError, match=r"SLURM_STEP_NODELIST: hostlist 'node\[2-1\]'"):
        detect(with_changes(N2X4_5, SLURM_STEP_NODELIST="node[2-1]"))


# --------------------------------------------------------------------------------------------
# Rank 0 must run where MASTER_ADDR points (pain points 2 and 13)


def test_rank0_on_the_master_passes() -> None:
    env = detect(N2X4_0)
    check_master_is_rank0_node(env, "node1")
    check_master_is_rank0_node(env, "NODE1.cluster.example")  # short names compared


def test_rank0_elsewhere_fails_naming_both() -> None:
    env = detect(with_changes(N2X4_0, MASTER_ADDR="node2"))
    with pytest.raises(DistEnvError) as info:
        check_master_is_rank0_node(env, "node1")
    assert "'node1'" in str(info.value) and "'node2'" in str(info.value)
    assert "MASTER_ADDR (set in the environment)" in str(info.value)


def test_other_ranks_are_not_checked() -> None:
    check_master_is_rank0_node(detect(with_changes(N2X4_5, MASTER_ADDR="elsewhere")), "node2")


def test_loopback_master_is_fine_on_one_node_and_refused_across_nodes() -> None:
    single = detect(with_changes(N1X4_2, SLURM_PROCID="0", SLURM_LOCALID="0",
                                 MASTER_ADDR="127.0.0.1"))
    check_master_is_rank0_node(single, "node1")
    multi = detect(with_changes(N2X4_0, MASTER_ADDR="localhost"))
    with pytest.raises(DistEnvError, match="loopback address but the job spans 2 nodes"):
        check_master_is_rank0_node(multi, "node1-that-does-not-resolve")


def test_master_given_as_this_hosts_address_passes() -> None:
    hostname = socket.gethostname()
    try:
        addresses = {info[4][0] for info in socket.getaddrinfo(hostname, None)}
    except OSError:
        pytest.skip(f"this machine's hostname {hostname!r} does not resolve")
    one_node = dict(N1X4_2, SLURM_PROCID="0", SLURM_LOCALID="0")
    for address in addresses:
        check_master_is_rank0_node(detect({**one_node, "MASTER_ADDR": address}), hostname)
    routable = sorted(a for a in addresses if not a.startswith("127.") and a != "::1")
    if not routable:
        pytest.skip(f"{hostname!r} resolves to loopback only ({sorted(addresses)}): "
                    "no multi-node address to try")
    check_master_is_rank0_node(detect(with_changes(N2X4_0, MASTER_ADDR=routable[0])), hostname)


# --------------------------------------------------------------------------------------------
# Views


def test_describe_and_as_dict() -> None:
    env = detect(N2X4_5)
    text = env.describe()
    lines = text.splitlines()
    assert all(": " in line for line in lines)
    assert len(lines) == len(dataclasses.fields(DistEnv))
    assert "launcher: slurm" in lines and "hosts: node1,node2" in lines
    assert "cpus_per_task: -" in lines
    data = env.as_dict()
    assert json.loads(json.dumps(data)) == data
    assert data["hosts"] == ["node1", "node2"] and data["rank"] == 5


def test_describe_shortens_long_host_lists() -> None:
    env = detect(with_changes(N2X4_5, SLURM_STEP_NODELIST="n[001-100]"))
    assert "hosts: n001,n002,n003,n004,n005,n006,n007,n008,... (100 hosts)" in env.describe()
    assert len(env.hosts) == 100


def test_dist_env_is_frozen() -> None:
    env = detect({})
    with pytest.raises(dataclasses.FrozenInstanceError):
        env.rank = 1  # type: ignore[misc]


# --------------------------------------------------------------------------------------------
# A real Slurm cluster (skipped with the reason when it is not up)

SLURM_CONF = os.environ.get("SLURM_CONF") or "/tmp/hpcdp-slurm/etc/slurm.conf"
PRINT_ENV = (
    "import json, os, socket, hpcdp.distenv as d\n"
    "env = d.detect()\n"
    "record = env.as_dict()\n"
    "record['hostname'] = socket.gethostname()\n"
    "record['nodename'] = os.environ.get('SLURMD_NODENAME')\n"
    "record['nodelist'] = os.environ.get('SLURM_JOB_NODELIST')\n"
    "try:\n"
    "    d.check_master_is_rank0_node(env, socket.gethostname())\n"
    "    record['master_check'] = 'ok'\n"
    "except d.DistEnvError as exc:\n"
    "    record['master_check'] = str(exc)\n"
    "print(json.dumps(record), flush=True)\n"
)


@pytest.fixture(scope="module")
def slurm_env() -> dict[str, str]:
    if shutil.which("srun") is None or shutil.which("sinfo") is None:
        pytest.skip("Slurm client commands (srun, sinfo) are not installed")
    if not Path(SLURM_CONF).is_file():
        pytest.skip(f"local Slurm cluster is not up: no slurm.conf at {SLURM_CONF} "
                    "(start it with `hpcdp cluster up`, or export SLURM_CONF)")
    environ = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    environ.update(SLURM_CONF=SLURM_CONF, PYTHONPATH=str(PROJECT_ROOT))
    try:
        done = subprocess.run(["sinfo", "-h", "-o", "%D %t"], env=environ, capture_output=True,
                              text=True, timeout=20)
    except subprocess.TimeoutExpired:
        pytest.skip(f"local Slurm cluster is not up: sinfo timed out (SLURM_CONF={SLURM_CONF})")
    if done.returncode != 0:
        pytest.skip(f"local Slurm cluster is not up: sinfo failed: {done.stderr.strip()[:200]}")
    nodes = sum(int(line.split()[0]) for line in done.stdout.splitlines()
                if line.split() and line.split()[1].rstrip("*~#") in ("idle", "mix", "alloc"))
    if nodes < 2:
        pytest.skip(f"local Slurm cluster has {nodes} usable nodes, 2 needed: {done.stdout!r}")
    return environ


def _srun_records(environ: dict[str, str], *args: str) -> list[dict]:
    done = subprocess.run(
        ["srun", "--time=2", *args, sys.executable, "-c", PRINT_ENV],
        env=environ, cwd=PROJECT_ROOT, capture_output=True, text=True, timeout=120,
    )
    assert done.returncode == 0, done.stderr
    return sorted((json.loads(line) for line in done.stdout.splitlines()
                   if line.startswith("{")), key=lambda r: r["rank"])


@pytest.mark.slurm
def test_real_srun_two_nodes_two_tasks_each(slurm_env: dict[str, str]) -> None:
    records = _srun_records(slurm_env, "--nodes=2", "--ntasks-per-node=2")
    assert [r["rank"] for r in records] == [0, 1, 2, 3]
    hosts = expand_hostlist(records[0]["nodelist"])
    for r in records:
        assert (r["launcher"], r["in_step"], r["world_size"]) == ("slurm", True, 4)
        assert (r["local_world_size"], r["num_nodes"]) == (2, 2)
        assert r["hosts"] == hosts and r["master_addr"] == hosts[0]
        assert r["master_port"] == master_port_for_job(r["job_id"])
        # Node ids follow the host list, and local ranks count within each node.
        assert hosts[r["node_rank"]] == r["nodename"]
    assert {(r["node_rank"], r["local_rank"]) for r in records} == {(0, 0), (0, 1), (1, 0),
                                                                    (1, 1)}
    rank0 = records[0]
    assert rank0["nodename"] == rank0["master_addr"]
    if rank0["hostname"] == rank0["nodename"]:  # the cluster gives each node its own name
        assert rank0["master_check"] == "ok"


@pytest.mark.slurm
def test_real_srun_with_master_addr_on_another_node_fails_fast(slurm_env: dict[str, str]) -> None:
    records = _srun_records({**slurm_env, "MASTER_ADDR": "node2"}, "--nodes=2",
                            "--ntasks-per-node=1")
    rank0 = records[0]
    if rank0["hostname"] != rank0["nodename"]:
        pytest.skip("the cluster's nodes share the machine's hostname; cannot tell nodes apart")
    if rank0["nodename"] == "node2":
        pytest.skip("rank 0 landed on node2 itself")
    assert rank0["master_addr"] == "node2"
    assert f"rank 0 runs on {rank0['hostname']!r} but MASTER_ADDR is 'node2'" in \
        rank0["master_check"]
    assert records[1]["master_check"] == "ok"  # only rank 0 checks


@pytest.mark.slurm
def test_real_srun_uneven_layout(slurm_env: dict[str, str]) -> None:
    records = _srun_records(slurm_env, "--nodes=2", "--ntasks=3")
    assert [r["rank"] for r in records] == [0, 1, 2]
    for r in records:
        on_same_node = [o for o in records if o["node_rank"] == r["node_rank"]]
        assert r["local_world_size"] == len(on_same_node)
        assert sorted(o["local_rank"] for o in on_same_node) == list(range(len(on_same_node)))
        assert sum(r["tasks_per_node"]) == 3


@pytest.mark.slurm
def test_real_batch_shell_is_not_a_step_but_its_srun_is(slurm_env: dict[str, str],
                                                        tmp_path: Path) -> None:
    script = tmp_path / "job.sh"
    script.write_text(
        "#!/bin/bash\n"
        f"{sys.executable} -c \"$PRINT_ENV\" > {tmp_path}/batch.json\n"
        f"srun {sys.executable} -c \"$PRINT_ENV\" > {tmp_path}/tasks.json\n"
    )
    done = subprocess.run(
        ["sbatch", "--wait", "--time=2", "--nodes=2", "--ntasks-per-node=1",
         f"--output={tmp_path}/out.txt", str(script)],
        env={**slurm_env, "PRINT_ENV": PRINT_ENV}, cwd=PROJECT_ROOT, capture_output=True,
        text=True, timeout=300,
    )
    log = (tmp_path / "out.txt").read_text() if (tmp_path / "out.txt").exists() else ""
    assert done.returncode == 0, done.stderr + log
    batch = json.loads((tmp_path / "batch.json").read_text())
    assert (batch["in_step"], batch["world_size"], batch["job_num_tasks"]) == (False, 1, 2)
    tasks = [json.loads(line) for line in (tmp_path / "tasks.json").read_text().splitlines()]
    assert sorted(t["rank"] for t in tasks) == [0, 1]
    assert all(t["in_step"] and t["world_size"] == 2 for t in tasks)
    assert {t["master_port"] for t in tasks} == {batch["master_port"]}


def test_hpcdp_env_outside_any_job_says_no_launcher_and_not_in_a_step(tmp_path) -> None:
    """`hpcdp env` in a plain shell used to say in_step: true."""
    clean = {k: v for k, v in os.environ.items()
             if not k.startswith(("SLURM_", "OMPI_", "PMIX_", "HOROVOD_", "TORCHELASTIC_"))
             and k not in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "LOCAL_RANK")}
    run = [sys.executable, "-m", "hpcdp", "env"]
    as_json = subprocess.run([*run, "--json"], env=clean, capture_output=True, text=True,
                             check=True, cwd=tmp_path)
    view = json.loads(as_json.stdout)
    assert (view["launcher"], view["in_step"], view["world_size"]) == ("none", False, 1)
    text = subprocess.run(run, env=clean, capture_output=True, text=True, check=True,
                          cwd=tmp_path).stdout
    assert text.startswith("no launcher found") and "in_step: False" in text


# --------------------------------------------------------------------------------------------
# Which container a process runs in (`hpcdp env`'s container line, the metrics header's)

OCI_TASK = {**N1X4_2, "SLURM_CONTAINER": "/srv/bundle"}  # srun --container=/srv/bundle
# Apptainer sets both its own variable and the older name; Pyxis sets neither.
APPTAINER = {"APPTAINER_CONTAINER": "/img/a.sif", "SINGULARITY_CONTAINER": "/img/a.sif"}
SCRIPT = {"HPCDP_CONTAINER": "pyxis nvcr.io#nvidia/pytorch:24.05-py3"}  # the script's export


@pytest.mark.parametrize("environ, in_use, variable", [
    ({}, None, None),
    (N1X4_2, None, None),
    (SCRIPT, "pyxis nvcr.io#nvidia/pytorch:24.05-py3", "HPCDP_CONTAINER"),
    ({"SINGULARITY_CONTAINER": "/img/s.sif", **SCRIPT}, "apptainer /img/s.sif",
     "SINGULARITY_CONTAINER"),
    ({**APPTAINER, "SINGULARITY_CONTAINER": "/img/old.sif", **SCRIPT}, "apptainer /img/a.sif",
     "APPTAINER_CONTAINER"),
    ({**OCI_TASK, **APPTAINER, **SCRIPT}, "oci /srv/bundle", "SLURM_CONTAINER"),
    # An empty variable says nothing: the next one in the order tells.
    ({"SLURM_CONTAINER": "", "APPTAINER_CONTAINER": "", **SCRIPT},
     "pyxis nvcr.io#nvidia/pytorch:24.05-py3", "HPCDP_CONTAINER"),
])
def test_the_container_comes_from_the_runtime_s_own_variable_first_then_the_script_s(
        environ, in_use, variable) -> None:
    """SLURM_CONTAINER, APPTAINER_CONTAINER, SINGULARITY_CONTAINER, then HPCDP_CONTAINER: what
    the runtime itself set wins over what the script asked for (docs/containers.md)."""
    assert container_in_use(environ) == in_use
    hint = container_hint(environ)
    if variable is None:
        assert hint == "none seen (no container variable set)"
    else:
        assert hint == f"{in_use} ({variable})"


def test_the_container_is_read_from_the_process_environment_by_default(monkeypatch) -> None:
    for name in ("SLURM_CONTAINER", "APPTAINER_CONTAINER", "SINGULARITY_CONTAINER",
                 "HPCDP_CONTAINER"):
        monkeypatch.delenv(name, raising=False)
    assert container_in_use() is None
    monkeypatch.setenv("HPCDP_CONTAINER", "oci /srv/bundle")
    monkeypatch.setenv("SINGULARITY_CONTAINER", "/img/s.sif")
    assert container_in_use() == "apptainer /img/s.sif"
    assert container_hint() == "apptainer /img/s.sif (SINGULARITY_CONTAINER)"
