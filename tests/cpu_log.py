"""Where the suite's CPU goes, per test (a pytest plugin that tests/conftest.py loads).

The suite is CPU-bound on 2 cores, so a test's wall time says more about what ran beside it than
about what it costs. With HPCDP_TEST_CPU_LOG=FILE each test appends one JSON line to FILE: its
wall seconds, the CPU seconds of the pytest process and of the processes it started and waited for
(ranks under torchrun or horovodrun included: each launcher waits for its own), and of the Slurm
jobs it submitted (sacct's TotalCPU of every step, summed; those ranks run under slurmd, not under
pytest). `python tests/cpu_log.py FILE` prints the table, costliest first."""

from __future__ import annotations

import json
import os
import re
import resource
import subprocess
import sys
import time

import pytest

_COUNTED: set[str] = set()  # jobs already counted (sacct -S lists jobs still running since)


def _cpu(who: int) -> float:
    usage = resource.getrusage(who)
    return usage.ru_utime + usage.ru_stime


def _seconds(sacct_time: str) -> float:
    """sacct's [DD-][HH:]MM:SS[.mmm]."""
    days, _, clock = sacct_time.rpartition("-")
    total = 0.0
    for part in clock.split(":"):
        total = total * 60 + float(part or 0)
    return total + 86400 * int(days or 0)


def _slurm_cpu(since: str, folder: str) -> float:
    """Steps' TotalCPU of the jobs that ran since `since` whose working folder is under `folder`
    (this pytest process's temporary tree; one test at a time runs in it), each job once."""
    try:
        done = subprocess.run(["sacct", "-n", "-P", "-S", since, "-o", "JobID,TotalCPU,WorkDir"],
                              capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return 0.0
    folders, cpu = {}, {}
    for line in done.stdout.splitlines():
        job, total, workdir = (line.split("|") + ["", ""])[:3]
        base = re.split(r"[._]", job)[0]
        if workdir:
            folders[base] = workdir
        if "." in job:
            cpu[base] = cpu.get(base, 0.0) + _seconds(total)
    mine = [job for job in cpu if folders.get(job, "").startswith(folder)
            and job not in _COUNTED]
    _COUNTED.update(mine)
    return sum(cpu[job] for job in mine)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None):
    log = os.environ.get("HPCDP_TEST_CPU_LOG")
    if not log:
        yield
        return
    since = time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(time.time() - 2))
    wall, own, children = time.monotonic(), _cpu(resource.RUSAGE_SELF), _cpu(
        resource.RUSAGE_CHILDREN)
    yield
    record = {"test": item.nodeid, "wall": time.monotonic() - wall,
              "pytest": _cpu(resource.RUSAGE_SELF) - own,
              "children": _cpu(resource.RUSAGE_CHILDREN) - children}
    if "slurm_cluster" in getattr(item, "fixturenames", ()):
        time.sleep(1.5)  # sacct's record of a step lags its end
        record["slurm_jobs"] = _slurm_cpu(since, str(item.config._tmp_path_factory.getbasetemp()))
    with open(log, "a") as out:
        out.write(json.dumps(record) + "\n")


def table(path: str) -> str:
    rows = [json.loads(line) for line in open(path)]
    for row in rows:
        row["cpu"] = row["pytest"] + row["children"] + row.get("slurm_jobs", 0.0)
    rows.sort(key=lambda r: -r["cpu"])
    lines = [f"{'cpu s':>7} {'wall s':>7}  test   (total {sum(r['cpu'] for r in rows):.0f} CPU s)"]
    lines += [f"{row['cpu']:7.1f} {row['wall']:7.1f}  {row['test']}" for row in rows]
    return "\n".join(lines)


if __name__ == "__main__":
    print(table(sys.argv[1]))
