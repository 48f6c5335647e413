"""tests/cpu_log.py, the suite's per-test CPU account: sacct's times read right, and a real
test's record (run by pytester with HPCDP_TEST_CPU_LOG) holds the CPU of what it started."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("cpu_log", HERE / "cpu_log.py")
cpu_log = importlib.util.module_from_spec(spec)
spec.loader.exec_module(cpu_log)


@pytest.mark.parametrize("text,seconds", [("00:01.500", 1.5), ("01:02:03", 3723.0),
                                          ("1-00:00:02", 86402.0), ("12.25", 12.25)])
def test_sacct_times_are_read_in_seconds(text, seconds):
    assert cpu_log._seconds(text) == pytest.approx(seconds)


def test_a_test_that_burns_cpu_in_a_child_is_charged_for_it(pytester, tmp_path, monkeypatch):
    log = tmp_path / "cpu.jsonl"
    monkeypatch.setenv("HPCDP_TEST_CPU_LOG", str(log))
    pytester.makeconftest((HERE / "conftest.py").read_text())
    (pytester.path / "cpu_log.py").write_text((HERE / "cpu_log.py").read_text())
    pytester.makepyfile(test_burn="""
import subprocess, sys

def test_burns():
    subprocess.run([sys.executable, "-c", "sum(i * i for i in range(3_000_000))"], check=True)

def test_idle():
    pass
""")
    result = pytester.runpytest_subprocess("-q", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=2)
    rows = {r["test"].split("::")[1]: r for r in map(json.loads, log.read_text().splitlines())}
    assert rows["test_burns"]["children"] > 0.05 > rows["test_idle"]["children"], rows
    assert cpu_log.table(str(log)).splitlines()[1].endswith("test_burn.py::test_burns")
