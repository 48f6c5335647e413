"""hpcdp/run_lock.py: one trainer per run folder, its lock released with the process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from hpcdp import run_lock


def test_a_claimed_folder_names_its_holder_until_released(tmp_path):
    assert run_lock.holder(tmp_path) is None
    held = run_lock.claim(tmp_path, "123")
    owner = json.loads((tmp_path / run_lock.OWNER_NAME).read_text())
    assert owner["job"] == "123" and owner["pid"] == os.getpid()
    assert run_lock.holder(tmp_path) == f"job 123 (pid {os.getpid()} on {owner['host']})"
    with pytest.raises(run_lock.RunFolderBusy, match=r"in use by a trainer: job 123 .*scancel 123"):
        run_lock.claim(tmp_path, "456", wait_s=0.3)
    with pytest.raises(run_lock.RunFolderBusy, match="in use by a trainer"):
        run_lock.check_free([tmp_path.parent])  # a folder below the one asked about
    held.close()
    assert run_lock.holder(tmp_path) is None
    run_lock.check_free([tmp_path.parent])
    run_lock.claim(tmp_path, None).close()
    assert run_lock.holder(tmp_path) is None


def test_a_killed_holder_leaves_no_claim(tmp_path):
    """flock goes with the process: SIGKILL cannot leave a stale claim."""
    code = textwrap.dedent(f"""
        import os, sys, time
        from hpcdp import run_lock
        held = run_lock.claim({str(tmp_path)!r}, None)  # kept: closing releases it
        print("held", flush=True)
        time.sleep(60)
    """)
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "held"
        assert run_lock.holder(tmp_path) == f"pid {proc.pid} on {os.uname().nodename}"
    finally:
        proc.kill()
        proc.wait()
    assert run_lock.holder(tmp_path) is None
    run_lock.claim(tmp_path, "7", wait_s=0).close()
