"""hpcdp.slurm's parsers and its lag rule, on output captured from a real Slurm.

The strings below were printed by Debian's Slurm 22.05.8 with slurmdbd + MariaDB on this kind
of machine (one node, 2026-11-30), by exactly the commands hpcdp.slurm runs:
  sacct --noheader --parsable2 --duplicates --jobs=... \
        --format=JobID,State,ExitCode,ElapsedRaw,NodeList,NNodes,Start,End,MaxRSS
  squeue --noheader --jobs=... --Format=JobID:|,State:|,TimeUsed:|,NodeList:|,NumNodes:|,\
        StartTime:|,EndTime:|,RestartCnt:|
Jobs: 154350 `exit 0`; 154351 `exit 3`; 154352 scancel'ed while pending; 154353 `scontrol
requeue`d once, then rerun; 154354 two tasks with an srun step; 154356 scancel'ed while running
an srun step; 154357 `--time=1` running `sleep 300`; 154358 a short job.
"""

from __future__ import annotations

import pytest

from hpcdp import slurm

SACCT_FINISHED = """\
154350|COMPLETED|0:0|1|node1|1|2026-11-30T05:11:20|2026-11-30T05:11:21|
154350.batch|COMPLETED|0:0|1|node1|1|2026-11-30T05:11:20|2026-11-30T05:11:21|3244K
154351|FAILED|3:0|1|node1|1|2026-11-30T05:11:22|2026-11-30T05:11:23|
154351.batch|FAILED|3:0|1|node1|1|2026-11-30T05:11:22|2026-11-30T05:11:23|3300K
154352|CANCELLED by 0|0:0|0|None assigned|1|2026-11-30T05:11:18|2026-11-30T05:11:18|
154353|REQUEUED|0:0|4|node1|1|2026-11-30T05:11:25|2026-11-30T05:11:29|
154353.batch|COMPLETED|0:0|3|node1|1|2026-11-30T05:11:25|2026-11-30T05:11:28|3180K
154354|COMPLETED|0:0|2|node1|1|2026-11-30T05:11:30|2026-11-30T05:11:32|
154354.batch|COMPLETED|0:0|2|node1|1|2026-11-30T05:11:30|2026-11-30T05:11:32|10524K
154354.0|COMPLETED|0:0|2|node1|1|2026-11-30T05:11:30|2026-11-30T05:11:32|1680K
154353|COMPLETED|0:0|3|node1|1|2026-11-30T05:11:40|2026-11-30T05:11:43|
154353.batch|COMPLETED|0:0|3|node1|1|2026-11-30T05:11:40|2026-11-30T05:11:43|3236K
"""

# 154353 a second after `scontrol requeue`: the first run's record, and the new PENDING one.
SACCT_JUST_REQUEUED = """\
154353|REQUEUED|0:0|4|node1|1|2026-11-30T05:11:25|2026-11-30T05:11:29|
154354|PENDING|0:0|0|None assigned|1|Unknown|Unknown|
154353|PENDING|0:0|0|None assigned|1|Unknown|Unknown|
"""

SACCT_SIGNALS = """\
154356|CANCELLED by 0|0:0|8|node1|1|2026-11-30T05:15:07|2026-11-30T05:15:15|
154356.batch|CANCELLED|0:15|8|node1|1|2026-11-30T05:15:07|2026-11-30T05:15:15|10736K
154356.0|CANCELLED|0:15|8|node1|1|2026-11-30T05:15:07|2026-11-30T05:15:15|1560K
154357|TIMEOUT|0:0|87|node1|1|2026-11-30T05:15:15|2026-11-30T05:16:42|
154357.batch|CANCELLED|0:15|87|node1|1|2026-11-30T05:15:15|2026-11-30T05:16:42|3136K
"""

SACCT_LIVE = """\
154356|RUNNING|0:0|8|node1|1|2026-11-30T05:15:07|Unknown|
154356.batch|RUNNING|0:0|8|node1|1|2026-11-30T05:15:07|Unknown|
154356.0|RUNNING|0:0|8|node1|1|2026-11-30T05:15:07|Unknown|
154357|PENDING|0:0|0|None assigned|1|Unknown|Unknown|
154358|PENDING|0:0|0|None assigned|1|Unknown|Unknown|
"""

SQUEUE_LIVE = """\
154357|PENDING|0:00||1|2027-11-30T05:15:07|2027-11-30T05:16:07|0|
154358|PENDING|0:00||1|2027-11-30T05:15:07|NONE|0|
154356|RUNNING|0:08|node1|1|2026-11-30T05:15:07|NONE|0|
"""

SQUEUE_REQUEUED = "154353|PENDING|0:00||1|2026-11-30T05:11:40|NONE|1|\n"

def test_sacct_completed_failed_cancelled():
    jobs = slurm.parse_sacct(SACCT_FINISHED)
    assert jobs["154350"].state == "COMPLETED" and jobs["154350"].exit_code == 0
    assert jobs["154351"].state == "FAILED" and jobs["154351"].exit_code == 3
    cancelled = jobs["154352"]
    assert cancelled.state == "CANCELLED" and cancelled.raw_state == "CANCELLED by 0"
    assert cancelled.node_list is None  # "None assigned"
    assert all(j.source == "sacct" for j in jobs.values())


def test_sacct_requeue_is_the_rerun_with_one_restart():
    job = slurm.parse_sacct(SACCT_FINISHED)["154353"]
    assert (job.state, job.restarts, job.start) == ("COMPLETED", 1, "2026-11-30T05:11:40")
    assert job.max_rss == "3236K"  # the rerun's step, not the first run's 3180K
    # The run's time is both segments' (issue 48: status showed the last one's only).
    assert (job.elapsed_s, job.run_elapsed_s) == (3.0, 7.0)
    never = slurm.parse_sacct(SACCT_FINISHED)["154350"]
    assert never.restarts == 0 and never.run_elapsed_s == never.elapsed_s


def test_sacct_max_rss_is_the_largest_step():
    job = slurm.parse_sacct(SACCT_FINISHED)["154354"]
    assert job.max_rss == "10524K" and job.elapsed_s == 2.0 and job.num_nodes == 1


def test_sacct_signals_and_timeout():
    jobs = slurm.parse_sacct(SACCT_SIGNALS)
    assert jobs["154356"].state == "CANCELLED"
    assert jobs["154357"].state == "TIMEOUT" and jobs["154357"].elapsed_s == 87.0
    assert all(slurm.is_terminal(j.state) for j in jobs.values())


def test_squeue_live_states():
    jobs = slurm.parse_squeue(SQUEUE_LIVE)
    assert jobs["154356"].state == "RUNNING" and jobs["154356"].elapsed_s == 8.0
    assert jobs["154356"].node_list == "node1"
    assert jobs["154357"].state == "PENDING" and jobs["154357"].node_list is None
    assert jobs["154358"].end is None  # "NONE"
    assert slurm.parse_squeue(SQUEUE_REQUEUED)["154353"].restarts == 1


def test_merge_prefers_squeue_for_live_jobs_and_sacct_for_ended_ones():
    ids = ["154353", "154350", "999999"]
    table = slurm.merge(ids, slurm.parse_squeue(SQUEUE_REQUEUED), True,
                        slurm.parse_sacct(SACCT_FINISHED))
    assert table["154353"].source == "squeue" and table["154353"].state == "PENDING"
    assert table["154350"].source == "sacct" and table["154350"].state == "COMPLETED"
    assert table["999999"].state == "UNKNOWN" and table["999999"].source == "none"


def test_lag_rule_gone_from_squeue_but_running_in_sacct_is_ending():
    # squeue answered and no longer lists 154356, while sacct's record still reads RUNNING.
    table = slurm.merge(["154356", "154357"], {}, True, slurm.parse_sacct(SACCT_LIVE))
    assert table["154356"].state == slurm.ENDING
    assert table["154357"].state == slurm.ENDING
    assert not slurm.is_terminal(slurm.ENDING)


def test_without_squeue_sacct_states_stand():
    # squeue failed (controller down): nothing says the job left, so RUNNING stays RUNNING.
    table = slurm.merge(["154356"], {}, False, slurm.parse_sacct(SACCT_LIVE))
    assert table["154356"].state == "RUNNING"


def test_just_requeued_job_reads_pending_from_sacct():
    job = slurm.parse_sacct(SACCT_JUST_REQUEUED)["154353"]
    assert job.state == "PENDING" and job.restarts == 1 and job.start is None


@pytest.mark.parametrize("raw, state", [
    ("CANCELLED by 0", "CANCELLED"), ("CANCELLED+", "CANCELLED"), ("completed", "COMPLETED"),
    ("OUT_OF_MEMORY", "OUT_OF_MEMORY"), ("", "UNKNOWN"),
])
def test_normalize_state(raw, state):
    assert slurm.normalize_state(raw) == state


@pytest.mark.parametrize("state, terminal", [
    ("COMPLETED", True), ("FAILED", True), ("CANCELLED by 1000", True), ("TIMEOUT", True),
    ("NODE_FAIL", True), ("PREEMPTED", True), ("BOOT_FAIL", True), ("DEADLINE", True),
    ("OUT_OF_MEMORY", True), ("RUNNING", False), ("PENDING", False), ("REQUEUED", False),
    ("COMPLETING", False), ("ENDING", False), ("UNKNOWN", False),
])
def test_is_terminal(state, terminal):
    assert slurm.is_terminal(state) is terminal


@pytest.mark.parametrize("text, expected", [
    ("3:0", (3, None)), ("0:0", (0, None)), ("0:15", (0, 15)), ("", (None, None)),
])
def test_parse_exit_code(text, expected):
    assert slurm.parse_exit_code(text) == expected


@pytest.mark.parametrize("text, seconds", [
    ("0:08", 8.0), ("1:02:03", 3723.0), ("2-00:00:01", 172801.0), ("INVALID", None),
])
def test_parse_duration(text, seconds):
    assert slurm.parse_duration(text) == seconds


def test_rss_bytes_orders_units():
    assert slurm.rss_bytes("10524K") > slurm.rss_bytes("3244K") > slurm.rss_bytes("1000")
    assert slurm.rss_bytes("1.5G") == 1.5 * 1024 ** 3 and slurm.rss_bytes(None) == 0


def test_commands_missing(tmp_path, monkeypatch):
    # A machine without Slurm's clients: nothing to ask, no crash, accounting marked off.
    monkeypatch.setenv("PATH", str(tmp_path))
    table = slurm.query_jobs(["1"])
    assert table["1"].state == "UNKNOWN" and table["1"].source == "none"
    assert table.accounting_available is False and "not found" in table.accounting_message
