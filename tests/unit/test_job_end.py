"""hpcdp/job_end.py: out of memory named from a job log's text. The Slurm-enforced and plain
SIGKILL logs below are lines the local cluster wrote (tests/integration/test_out_of_memory.py
makes them for real); the cgroup one is Slurm's wording on a site with cgroups, which this
machine does not have."""

from __future__ import annotations

import subprocess
import sys

import pytest

from hpcdp import job_end

OVER_LIMIT = """\
step 3/20 | loss 5.5 | 1000 tok/s
slurmstepd-node2: error: StepId=4538386.0 exceeded memory limit (339214336 > 314572800), being killed
srun: Job step aborted: Waiting up to 4 seconds for job step to finish.
slurmstepd-node1: error: *** STEP 4538386.0 ON node1 CANCELLED AT 2026-12-06T09:03:08 ***
slurmstepd-node1: error: StepId=4538386.0 exceeded memory limit (338694144 > 314572800), being killed
srun: error: node1: task 0: Killed
srun: error: node2: task 1: Killed
"""  # noqa: E501
CGROUP = """\
slurmstepd: error: Detected 1 oom-kill event(s) in StepId=812.0. Some of your processes may have been killed by the cgroup out-of-memory handler.
srun: error: gpu-a17: task 5: Out Of Memory
"""  # noqa: E501
SIGKILL = """\
[rank0]: RuntimeError: Connection closed by peer [127.0.0.1]:5284
srun: error: node3: task 7: Killed
srun: error: node1: task 0: Exited with exit code 1
"""


def test_slurms_memory_limit_names_the_rank_node_and_sizes():
    found = job_end.out_of_memory(OVER_LIMIT)
    assert (found.rank, found.node) == ("1", "node2")  # the first over the limit, and its task
    line = found.line()
    assert line.startswith("out of memory (rank 1 on node2): the step used 324 MiB, over the "
                           "job's memory limit of 300 MiB (--mem)")
    assert "fewer ranks per node" in line and "sharded strategy" in line
    assert "micro_batch_size" in line


def test_a_cgroup_kill_and_saccts_state_are_out_of_memory():
    assert job_end.out_of_memory(CGROUP).line().startswith("out of memory (rank 5 on gpu-a17): "
                                                           "Slurm's cgroup counted")
    said = job_end.out_of_memory("nothing in the log\n", state="OUT_OF_MEMORY").line()
    assert said.startswith("out of memory: Slurm reports OUT_OF_MEMORY;")


def test_an_unexplained_sigkill_is_named_as_likely_out_of_memory_and_says_why():
    """Issue 48, item 14: a SIGKILL alone (a kill -9 by hand looks the same) is not stated as
    out of memory: that is said flatly only where Slurm or the kernel says it."""
    line = job_end.out_of_memory(SIGKILL).line()
    assert line.startswith("killed by SIGKILL (rank 7 on node3): out of memory is the likely "
                           "cause: nothing else in the log explains the SIGKILL (no watchdog, ")
    assert not line.startswith("out of memory")
    ranges = job_end.out_of_memory("srun: error: node1: tasks 0-1: Killed\n")
    assert ranges.line().startswith("killed by SIGKILL (ranks 0-1 on node1)")


@pytest.mark.parametrize("text", [
    # a rank that failed first, then the others killed: its error is the cause
    "srun: error: node1: task 0: Exited with exit code 1\nsrun: error: node2: task 1: Killed\n",
    # the hang watchdog, a time limit, a cancel or a preemption also end ranks with SIGKILL
    "train: WATCHDOG: rank 1 on node2 saw no progress for 40 s\nsrun: error: node2: task 1: "
    "Killed\n",
    "slurmstepd: error: *** JOB 9 ON node1 CANCELLED AT 2026-12-06T09:03:08 DUE TO TIME LIMIT "
    "***\nsrun: error: node1: task 0: Killed\n",
    "hpcdp: SIGTERM (preemption or scancel): not requeueing\nsrun: error: node1: task 0: "
    "Killed\n",
    "srun: error: node1: task 0: Segmentation fault\n",
    "",
])
def test_other_deaths_are_not_called_out_of_memory(text):
    assert job_end.out_of_memory(text) is None


def test_the_job_scripts_command_prints_the_line_or_nothing(tmp_path):
    log = tmp_path / "slurm-5.out"
    log.write_text(OVER_LIMIT)
    said = subprocess.run([sys.executable, "-m", "hpcdp.job_end", str(log)],
                          capture_output=True, text=True, check=True).stdout
    assert said.startswith("hpcdp: out of memory (rank 1 on node2)") and said.count("\n") == 1
    log.write_text("srun: error: node1: task 0: Exited with exit code 1\n")
    quiet = subprocess.run([sys.executable, "-m", "hpcdp.job_end", str(log)],
                           capture_output=True, text=True, check=True)
    missing = subprocess.run([sys.executable, "-m", "hpcdp.job_end", str(tmp_path / "none")],
                             capture_output=True, text=True, check=True)
    assert quiet.stdout == missing.stdout == ""


# What a job's log held when node4's link was cut (the local cluster, 2026-12-07).
NODE_FAILURE_LOG = """\
srun: error: Node failure on node4
slurmstepd-node3: error: *** STEP 4618323.0 ON node3 CANCELLED AT 2026-12-07T05:25:35 \
DUE TO NODE FAILURE, SEE SLURMCTLD LOG FOR DETAILS ***
srun: Job step aborted: Waiting up to 4 seconds for job step to finish.
srun: error: node3: task 0: Killed
"""


def test_a_node_failure_is_named_and_never_out_of_memory_or_a_preemption():
    line = job_end.node_failure(NODE_FAILURE_LOG)
    assert line == "node4 stopped responding (Slurm: NODE_FAIL); not a failure of the strategy"
    assert job_end.out_of_memory(NODE_FAILURE_LOG) is None  # its SIGKILL has a cause
    said = NODE_FAILURE_LOG + ("hpcdp: node4 stopped responding (Slurm: NODE_FAIL); requeued by "
                               "Slurm, waiting for nodes: the rerun resumes\n")
    assert job_end.node_failure(said).startswith("node4 stopped responding (Slurm: NODE_FAIL); "
                                                 "requeued by Slurm")
    assert job_end.node_failure("", "NODE_FAIL").startswith("a node stopped responding")
    assert job_end.node_failure("srun: error: node1: task 0: Killed\n", "FAILED") is None


def test_why_failed_reads_a_node_failure_first(tmp_path):
    log = tmp_path / "slurm-1.out"
    log.write_text(NODE_FAILURE_LOG)
    assert job_end.why_failed(log, "NODE_FAIL").startswith("node4 stopped responding")
