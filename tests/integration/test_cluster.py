"""The local Slurm cluster that `hpcdp cluster up` starts: real daemons, real jobs."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hpcdp import cluster

pytestmark = pytest.mark.slurm

NODES = ["node1", "node2", "node3", "node4"]
# Jobs here take well under a second; the deadlines only bound a hang.
JOB_TIMEOUT_S = 60
# slurmctld sends job records to slurmdbd every ~5 s, so sacct lags squeue.
SACCT_DEADLINE_S = 30


def run(*cmd: str, timeout: float = JOB_TIMEOUT_S, env: dict[str, str] | None = None):
    return subprocess.run(
        cmd, capture_output=True, text=True, timeout=timeout, env=env or os.environ.copy()
    )


def sbatch_wait(tmp_path: Path, *args: str) -> tuple[str, int]:
    """Submit a batch job, wait for it to end; return (job id, sbatch's exit code)."""
    result = run(
        "sbatch", "--parsable", "--wait", f"--output={tmp_path}/slurm-%j.out", *args
    )
    job_id = result.stdout.strip().split(";")[0]
    assert job_id.isdigit(), f"sbatch printed no job id: {result.stdout!r} {result.stderr!r}"
    return job_id, result.returncode


def sacct_final(job_id: str, fields: str) -> str:
    """Plain `sacct -j ID -X -n -o FIELDS`, polled until the job's record is final."""
    deadline = time.monotonic() + SACCT_DEADLINE_S
    line = ""
    while time.monotonic() < deadline:
        line = " ".join(run("sacct", "-j", job_id, "-X", "-n", "-o", fields).stdout.split())
        if line and line.split()[0] not in {"PENDING", "RUNNING", "COMPLETING"}:
            return line
        time.sleep(0.5)
    return line


def test_four_nodes_of_four_cpus_in_partition_debug(slurm_cluster: Path) -> None:
    result = run("sinfo", "-h", "-N", "-p", "debug", "-o", "%N %P %t %c")
    assert result.returncode == 0, result.stderr
    rows = sorted(line.split() for line in result.stdout.splitlines())
    assert [row[0] for row in rows] == NODES
    assert {row[1] for row in rows} == {"debug*"}, "debug must be the default partition"
    # idle, or busy with someone's job; never down, drained or not responding ('*').
    assert {row[2] for row in rows} <= {"idle", "mix", "alloc"}, rows
    assert {row[3] for row in rows} == {"4"}


def test_srun_runs_on_two_named_nodes_that_resolve_each_other(slurm_cluster: Path) -> None:
    result = run(
        "srun", "-N2", "--ntasks-per-node=1", "--nodelist=node1,node2",
        "bash", "-c", 'echo "$(hostname) $(getent hosts node2 | cut -d" " -f1) $(hostname -i)"',
    )
    assert result.returncode == 0, result.stderr
    rows = sorted(line.split() for line in result.stdout.splitlines())
    assert [row[0] for row in rows] == ["node1", "node2"], rows
    # node2 resolves to the same address on both nodes, and that is node2's own.
    assert rows[0][1] == rows[1][1] == rows[1][2] != rows[0][2], rows


# Each rank's view of its node, printed by a task: name, interfaces with an address, its own
# address, node2's, its cores, and whether any route leaves the node's subnet.
NODE_VIEW = (
    "import json, os, socket, subprocess; from hpcdp import distenv; "
    "print(json.dumps({'node': socket.gethostname(), 'interfaces': distenv.local_interfaces(), "
    "'address': socket.gethostbyname(socket.gethostname()), "
    "'node2': socket.gethostbyname('node2'), 'cores': sorted(os.sched_getaffinity(0)), "
    "'default_route': subprocess.run(['ip', 'route', 'show', 'default'], capture_output=True, "
    "text=True).stdout.strip()}))"
)


def namespaces_only() -> None:
    if cluster.network_mode() != "namespaces":
        pytest.skip("the cluster runs without its node network here (no network namespaces); "
                    "`hpcdp cluster up` said why")


def node_views(*nodes: str) -> dict[str, dict]:
    import json

    result = run("srun", f"-N{len(nodes)}", "--ntasks-per-node=1", f"--nodelist={','.join(nodes)}",
                 sys.executable, "-c", NODE_VIEW)
    assert result.returncode == 0, result.stderr
    views = [json.loads(line) for line in result.stdout.splitlines()]
    return {view["node"]: view for view in views}


def test_each_node_has_its_own_interface_address_and_core(slurm_cluster: Path) -> None:
    """Issue 45: one interface hsn0 per node, as on a real cluster, an address of its own, no
    route off the machine, and a core of its own (nodes share cores only beyond the count)."""
    namespaces_only()
    views = node_views("node1", "node2")
    for view in views.values():
        assert view["interfaces"] == ["lo", "hsn0"], view
        assert view["node2"] == views["node2"]["address"], view
        assert view["default_route"] == "", f"a route leaves the node: {view}"
        assert len(view["cores"]) == 1, view
    assert views["node1"]["address"] != views["node2"]["address"]
    if len(os.sched_getaffinity(0)) >= 2:
        assert views["node1"]["cores"] != views["node2"]["cores"], views
    status = run(sys.executable, "-m", "hpcdp", "cluster", "status").stdout
    row = next(line.split() for line in status.splitlines() if line.startswith("node1 "))
    assert row[1:4] == [views["node1"]["address"], "hsn0", str(views["node1"]["cores"][0])], row


def veth_bytes(node: str) -> int:
    """Bytes through NODE's link, both ways, as its end on the bridge counts them."""
    stats = Path(f"/sys/class/net/hpv-{node}/statistics")
    return sum(int((stats / f"{way}_bytes").read_text()) for way in ("rx", "tx"))


# A TCP stream of MB megabytes from the client to the server; the server prints what it got
# per second (bits), from its first byte to the last.
STREAM = """
import socket, sys, time
role, host, port = sys.argv[1], sys.argv[2], int(sys.argv[3])
if role == "server":
    s = socket.create_server(("", port)); c, _ = s.accept(); n = 0; t0 = None
    while (b := c.recv(1 << 20)):
        t0 = t0 or time.monotonic(); n += len(b)
    print(n * 8 / (time.monotonic() - t0))
else:
    for _ in range(100):
        try:
            c = socket.create_connection((host, port)); break
        except OSError:
            time.sleep(0.1)
    c.sendall(b"x" * (int(sys.argv[4]) << 20)); c.close()
"""


def stream_bits_per_s(tmp_path: Path, server: str, client: str, megabytes: int) -> float:
    """A plain TCP stream from `client` to `server` (nodes), as two job steps at once."""
    from free_port import free_port

    script = tmp_path / "stream.py"
    script.write_text(STREAM)
    port = str(free_port())
    serve = subprocess.Popen(["srun", "-N1", "-n1", f"--nodelist={server}", sys.executable,
                              str(script), "server", server, port], stdout=subprocess.PIPE,
                             text=True)
    send = run("srun", "-N1", "-n1", f"--nodelist={client}", sys.executable, str(script),
               "client", server, port, str(megabytes))
    out, _ = serve.communicate(timeout=JOB_TIMEOUT_S)
    assert send.returncode == 0 and serve.returncode == 0, send.stderr
    return float(out.strip())


def test_a_link_carries_its_rate_and_traffic_inside_a_node_stays_there(
        slurm_cluster: Path, tmp_path: Path) -> None:
    """node3 and node4 (only this stream of tests uses them, one test at a time), shaped to
    250 Mbit/s: a TCP stream between them gets 80-100% of it (Ethernet and TCP headers take
    ~5%; measured here 96%); a stream inside node3 never touches its link."""
    namespaces_only()
    assert cluster.set_link_rate("250mbit", ["node3", "node4"]) == 0
    try:
        rate = stream_bits_per_s(tmp_path, "node4", "node3", 16)
        assert 0.8 * 250e6 <= rate <= 1.0 * 250e6, f"{rate / 1e6:.0f} Mbit/s"
        before = veth_bytes("node3")
        inside = stream_bits_per_s(tmp_path, "node3", "node3", 16)
        assert veth_bytes("node3") - before < 1 << 20, "traffic inside node3 crossed its link"
        assert inside > 2 * rate, f"inside node3: {inside / 1e6:.0f} Mbit/s"
    finally:
        assert cluster.set_link_rate("default", ["node3", "node4"]) == 0


def test_a_cut_link_cuts_the_node_off_until_it_is_restored(slurm_cluster: Path) -> None:
    """`hpcdp cluster link node4 down` as a cable pulled at the switch: node3 cannot reach
    node4's slurmd port, status says DOWN; `up` restores it (seconds, well inside Slurm's
    SlurmdTimeout: node4 is never marked down)."""
    namespaces_only()
    conf = (slurm_cluster / "etc" / "slurm.conf").read_text()
    port = next(line.split("Port=")[1].split()[0] for line in conf.splitlines()
                if line.startswith("NodeName=node4 "))
    reach = ["srun", "-N1", "-n1", "--nodelist=node3", "bash", "-c",
             f"timeout 2 bash -c '</dev/tcp/node4/{port}' && echo reached"]
    assert "reached" in run(*reach).stdout
    cut = run(sys.executable, "-m", "hpcdp", "cluster", "link", "node4", "down")
    try:
        assert cut.returncode == 0 and "node4's link is down" in cut.stdout, cut.stdout
        assert "reached" not in run(*reach).stdout
        status = run(sys.executable, "-m", "hpcdp", "cluster", "status").stdout
        assert any(line.startswith("node4 ") and line.endswith("DOWN")
                   for line in status.splitlines()), status
    finally:
        restored = run(sys.executable, "-m", "hpcdp", "cluster", "link", "node4", "up")
    assert restored.returncode == 0
    assert "reached" in run(*reach).stdout


@pytest.mark.parametrize("args, said", [
    (["link", "--rate", "1gb"], "link rate '1gb' is not valid"),
    (["up", "--link", "fast"], "link rate 'fast' is not valid"),
    (["link", "node9", "down"], "no node 'node9' in this cluster"),
    (["link", "node1", "sideways"], "link state 'sideways' is not valid"),
    (["link", "node1"], "takes NODE down|up"),
])
def test_bad_link_input_is_one_line_and_exit_2(slurm_cluster: Path, args, said) -> None:
    result = run(sys.executable, "-m", "hpcdp", "cluster", *args)
    assert result.returncode == 2, result.stdout + result.stderr
    said_lines = (result.stdout + result.stderr).strip().splitlines()
    assert len(said_lines) == 1 and said in said_lines[0], said_lines


def test_two_node_batch_job_is_completed_in_sacct(slurm_cluster: Path, tmp_path: Path) -> None:
    job_id, code = sbatch_wait(tmp_path, "-N2", "--ntasks-per-node=1", "--wrap=srun hostname")
    assert code == 0
    assert sacct_final(job_id, "State") == "COMPLETED"
    hosts = (tmp_path / f"slurm-{job_id}.out").read_text().split()
    assert len(hosts) == 2 and set(hosts) <= set(NODES), hosts


def test_failing_job_is_failed_with_its_exit_code(slurm_cluster: Path, tmp_path: Path) -> None:
    job_id, code = sbatch_wait(tmp_path, "--wrap=exit 3")
    assert code == 3
    # Read from the text output: `sacct --json` reports 0 for plain non-zero exits in 22.05.
    assert sacct_final(job_id, "State,ExitCode") == "FAILED 3:0"


def test_mpi4py_over_pmix_spans_two_nodes(slurm_cluster: Path) -> None:
    env = {**os.environ, "OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1"}
    program = (
        "import os, socket; from mpi4py import MPI; c = MPI.COMM_WORLD; "
        "print(c.Get_rank(), c.Get_size(), socket.gethostname(), "
        "os.environ.get('OMPI_ALLOW_RUN_AS_ROOT'), "
        "os.environ.get('OMPI_ALLOW_RUN_AS_ROOT_CONFIRM'))"
    )
    result = run(
        "srun", "--mpi=pmix", "-N2", "-n2", "--ntasks-per-node=1",
        sys.executable, "-c", program, env=env,
    )
    assert result.returncode == 0, result.stderr
    rows = sorted(line.split() for line in result.stdout.splitlines())
    assert [row[:2] for row in rows] == [["0", "2"], ["1", "2"]], result.stdout
    assert len({row[2] for row in rows}) == 2, "the two ranks must run on two nodes"
    assert all(row[3:] == ["1", "1"] for row in rows), "OMPI root variables must reach the ranks"


def test_second_up_is_a_no_op(slurm_cluster: Path) -> None:
    pid_file = slurm_cluster / "run" / "slurmctld.pid"
    pid_before = pid_file.read_text().strip()
    result = cluster.run_script("up")
    assert result.returncode == 0
    assert "already up" in result.output
    assert pid_file.read_text().strip() == pid_before


# Run by a nested pytest with the project's conftest: one test kills node4's slurmd and fails
# the first time (as a Slurm crash under a job would), then needs all four nodes; the other
# fails with every daemon alive and must not get a second run.
DAEMON_DEATH_TESTS = """
import os, signal, subprocess
from pathlib import Path
from hpcdp import cluster

def test_a_daemon_dies_under_it(slurm_cluster, tmp_path_factory):
    marker = Path(os.environ["FIRST_RUN_MARKER"])
    if not marker.exists():
        marker.touch()
        os.kill(cluster.daemon_pids()["slurmd-node4"], signal.SIGKILL)
        raise AssertionError("the jobs of this test failed")
    srun = subprocess.run(["srun", "-N4", "hostname"], capture_output=True, text=True, timeout=60)
    assert srun.returncode == 0, srun.stderr

def test_fails_on_its_own(slurm_cluster):
    raise AssertionError("a real failure")
"""


def test_a_test_that_failed_as_a_daemon_died_runs_again_on_a_healed_cluster(
    slurm_cluster: Path, pytester: pytest.Pytester
) -> None:
    pytester.makeconftest((Path(__file__).parents[1] / "conftest.py").read_text())
    pytester.makepyfile(test_daemon_death=DAEMON_DEATH_TESTS)
    marker = pytester.path / "first-run"
    os.environ["FIRST_RUN_MARKER"] = str(marker)
    try:
        result = pytester.runpytest_subprocess("-q", "-p", "no:cacheprovider")
    finally:
        del os.environ["FIRST_RUN_MARKER"]
    assert marker.exists(), result.stdout.str()
    result.assert_outcomes(passed=1, failed=1)
    rerun = [line for line in result.outlines if line.startswith("RERUN ")]
    assert rerun == [
        "RERUN test_daemon_death.py::test_a_daemon_dies_under_it: it failed while slurmd-node4"
        " died; ran again on a healed cluster"
    ], result.stdout.str()
    assert "slurmd-node4" in cluster.daemon_pids()


def test_python_api_sees_the_running_cluster(slurm_cluster: Path) -> None:
    assert cluster.is_up()
    assert cluster.slurm_env() == {"SLURM_CONF": str(slurm_cluster / "etc" / "slurm.conf")}
    assert cluster.status() == 0
    shell = run("bash", "-c", f'eval "$(bash {cluster.SCRIPT} env)" && echo "$SLURM_CONF"')
    assert shell.stdout.strip() == str(cluster.slurm_conf_path())


def test_is_up_is_false_for_a_directory_without_a_cluster(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("HPCDP_CLUSTER_DIR", str(tmp_path))
    assert not cluster.is_up()
    assert cluster.slurm_env() == {}


def test_without_root_it_says_so_and_exits_3(tmp_path: Path) -> None:
    as_nobody = ["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups"]
    result = run(
        *(as_nobody if os.geteuid() == 0 else []), "bash", str(cluster.SCRIPT), "up",
        env={"PATH": os.environ["PATH"], "HPCDP_CLUSTER_DIR": str(tmp_path / "c")},
    )
    assert result.returncode == cluster.CANNOT_START
    assert "needs root" in result.stderr
    assert not (tmp_path / "c").exists()


@pytest.mark.skipif(os.geteuid() != 0, reason="as non-root the root check answers first")
def test_missing_commands_are_named_with_the_install_line(tmp_path: Path) -> None:
    # An empty PATH: every daemon is "missing"; bash itself is started by its full path.
    result = run(
        "/bin/bash", str(cluster.SCRIPT), "up",
        env={"PATH": str(tmp_path), "HPCDP_CLUSTER_DIR": str(tmp_path / "c")},
    )
    assert result.returncode == cluster.CANNOT_START
    assert result.stderr.count("\n") == 1, result.stderr
    assert "missing munged slurmctld slurmd slurmdbd mariadbd" in result.stderr
    assert "apt-get install slurm-wlm slurmdbd munge mariadb-server" in result.stderr
