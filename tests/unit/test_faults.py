"""HPCDP_FAULT, the test-only fault hook (train/faults.py): its forms, its one-line refusal, and
segv@start, which kills a rank by SIGSEGV once per run folder (the job script's relaunch of a
start-up crash is tested on Slurm, in tests/integration/test_hang_bounds.py)."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import pytest

from hpcdp.errors import UsageError
from train import faults

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(("raw", "expected"), [
    ("raise@3", faults.Fault("raise", 3, 0)),
    ("hang@12:1", faults.Fault("hang", 12, 1)),
    ("segv@start", faults.Fault("segv", faults.START, 0)),
    ("segv@start:3", faults.Fault("segv", faults.START, 3)),
])
def test_forms(raw, expected):
    assert faults.from_environment({faults.ENV_VAR: raw}) == expected


@pytest.mark.parametrize("raw", ["segv@2", "raise@start", "segv@start:x", "kill@0", "boom@1"])
def test_a_bad_form_is_refused_naming_the_valid_ones(raw):
    with pytest.raises(UsageError, match=rf"HPCDP_FAULT='{raw}' is not a fault; valid: .*"
                                         r"segv@start\[:RANK\]"):
        faults.from_environment({faults.ENV_VAR: raw})


def test_segv_at_start_fires_on_its_rank_once_per_run_folder(tmp_path):
    marker = tmp_path / ".fault-fired"
    code = ("import sys; from pathlib import Path; from train import faults; "
            "faults.Fault('segv', faults.START, 1).at_start(int(sys.argv[1]), Path(sys.argv[2]))")

    def start(rank: int) -> int:
        return subprocess.run([sys.executable, "-c", code, str(rank), str(marker)], cwd=ROOT,
                              capture_output=True).returncode

    assert start(0) == 0 and not marker.exists()  # another rank: nothing happens
    assert start(1) == -signal.SIGSEGV
    assert marker.read_text() == "segv@start:1\n"
    assert start(1) == 0  # the relaunch, in the same run folder
