"""A network partition named from both sides (issues 45, 49): each rank that fires tries the
Slurm controller, and the summary names the nodes that could not reach it as cut off, not the
side that merely waited. Real sockets; the watchdog's summary written from real files."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest

from train.watchdog import Watchdog, describe_reach, slurm_controller


def test_the_controller_is_read_from_slurm_conf(tmp_path: Path) -> None:
    conf = tmp_path / "slurm.conf"
    conf.write_text("# local\nSlurmctldHost=localhost(198.18.0.254)  # the bridge\n"
                    "SlurmctldPort=41817\n")
    assert slurm_controller(str(conf)) == ("198.18.0.254", 41817)
    conf.write_text("SlurmctldHost=ctl1\nSlurmctldHost=ctl2\nSlurmctldPort=6817-6820\n")
    assert slurm_controller(str(conf)) == ("ctl1", 6817)
    assert slurm_controller(str(tmp_path / "none.conf")) is None


def test_outside_a_slurm_job_there_is_no_controller_to_ask(tmp_path, monkeypatch) -> None:
    conf = tmp_path / "slurm.conf"
    conf.write_text("SlurmctldHost=ctl1\n")
    monkeypatch.setenv("SLURM_CONF", str(conf))
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    assert slurm_controller() is None
    monkeypatch.setenv("SLURM_JOB_ID", "42")
    assert slurm_controller() == ("ctl1", 6817)


def test_reaching_it_is_a_real_connection() -> None:
    with socket.create_server(("127.0.0.1", 0)) as server:
        port = server.getsockname()[1]
        assert describe_reach(("127.0.0.1", port)) == (
            f"reaches the Slurm controller at 127.0.0.1:{port}")
    # The same port, closed now: refused at once.
    assert describe_reach(("127.0.0.1", port)).startswith(
        f"cannot reach the Slurm controller at 127.0.0.1:{port} (")
    assert describe_reach(None) == "no Slurm controller to try (no slurm.conf here)"


def _summary(tmp_path: Path, reach: dict[int, str]) -> tuple[str, str]:
    """Rank 0's summary where every rank in `reach` dumped, with that reach recorded."""
    watchdog = Watchdog(tmp_path, 0, 2, factor=10, floor_s=1e6, ceiling_s=1e6)
    watchdog.stop()
    for rank, node in ((0, "node1"), (1, "node2")):
        (tmp_path / "ranks" / f"rank-{rank}.json").write_text(
            json.dumps({"rank": rank, "pid": 1, "machine": node, "node": node}))
    (tmp_path / "hang").mkdir()
    for rank, said in reach.items():
        (tmp_path / "hang" / f"rank-{rank}.network").write_text(said + "\n")
        (tmp_path / "hang" / f"rank-{rank}.txt").write_text("stack\n")
    watchdog._write_summary("node1")
    hang = tmp_path / "hang"
    return (hang / "summary.txt").read_text(), (hang / "silent_nodes").read_text()


def test_the_side_that_cannot_reach_the_controller_is_the_one_cut_off(tmp_path: Path) -> None:
    summary, silent_nodes = _summary(tmp_path, {
        0: "reaches the Slurm controller at 198.18.0.254:41817",
        1: "cannot reach the Slurm controller at 198.18.0.254:41817 (TimeoutError)"})
    assert "silent ranks (stopped, dead, or stuck where no thread runs): []" in summary
    assert "cut off: node2 (its ranks [1] cannot reach the Slurm controller" in summary
    assert "ranks that only waited for it: [0] on node1" in summary
    assert silent_nodes == "node2\n"  # what train.on_hang: requeue excludes


@pytest.mark.parametrize("reach", ["reaches the Slurm controller at c:1",
                                   "no Slurm controller to try (no slurm.conf here)"])
def test_where_it_cannot_tell_it_says_both_sides_saw_each_other_silent(tmp_path, reach):
    summary, silent_nodes = _summary(tmp_path, {0: reach, 1: reach})
    assert "each side saw the others silent" in summary
    assert "cut off:" not in summary and silent_nodes == ""


def test_a_silent_rank_is_still_named_silent(tmp_path: Path) -> None:
    summary, silent_nodes = _summary(tmp_path, {0: "reaches the Slurm controller at c:1"})
    assert "silent ranks (stopped, dead, or stuck where no thread runs): [1]" in summary
    assert "silent nodes: node2" in summary and silent_nodes == "node2\n"


@pytest.mark.parametrize("stuck_s, dumps", [(60.0, True), (0.0, False)])
def test_sigterm_finds_a_stuck_rank_and_it_leaves_its_stack(tmp_path, stuck_s, dumps) -> None:
    """Slurm ending a job whose node failed sends the others SIGTERM, then SIGKILL KillWait
    seconds later, while they wait in a collective (whose Python handler would run only once
    it returns). A real SIGTERM to this process: the watchdog thread hears it through the
    interpreter's wakeup pipe and, the rank having made no progress for a minute, writes its
    stack into hang/ at once; a rank making progress (a preemption) writes nothing."""
    import os
    import signal
    import time

    heard = []
    previous = signal.signal(signal.SIGTERM, lambda *_: heard.append(1))  # as train/stop.py's
    watchdog = Watchdog(tmp_path, 0, 2, factor=10, floor_s=1e6, ceiling_s=1e6)
    try:
        watchdog.beat(step=7)
        watchdog._last -= stuck_s
        os.kill(os.getpid(), signal.SIGTERM)
        stack = tmp_path / "hang" / "rank-0.txt"
        deadline = time.monotonic() + (5 if dumps else 1.5)
        while not stack.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert heard == [1]  # the process's own handler still ran
        assert stack.exists() == dumps
        if dumps:
            text = stack.read_text()
            assert text.startswith("train: rank 0 on "), text
            assert "got SIGTERM after 60 s without progress (after step 7)" in text, text
            assert "test_sigterm_finds" in text, text  # the main thread's stack, where it waits
    finally:
        watchdog.stop()
        signal.signal(signal.SIGTERM, previous)


def test_an_evaluation_is_bounded_by_the_ceiling_not_by_steps(tmp_path) -> None:
    """The first evaluation under train.compile compiles its graph: a minute or more on a loaded
    CPU, where 20 steps' worth is seconds. The loop calls grace() before it; the next beat
    brings the step bound back (a CI run saw the watchdog end a compiling evaluation)."""
    watchdog = Watchdog(tmp_path, 0, 1, factor=10, floor_s=0.1, ceiling_s=100)
    watchdog.stop()
    for step in (1, 2, 3):
        watchdog.beat(step=step, step_time_s=0.01)
    assert watchdog.bound_s() == pytest.approx(0.1)
    watchdog.grace()
    assert watchdog.bound_s() == 100
    watchdog.beat()
    assert watchdog.bound_s() == pytest.approx(0.1)
