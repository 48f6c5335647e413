"""What hpcdp reads of the local cluster's node network without starting anything (issue 45):
link rates checked before the script runs, the recorded mode, the profile's interface where
the nodes share the loopback, and nodes in namespaces counted as this machine's for run folders."""

from __future__ import annotations

from pathlib import Path

import pytest

from hpcdp import cluster, config, shared_fs
from hpcdp.errors import UsageError


@pytest.mark.parametrize("rate", ["1gbit", "250mbit", "1.5gbit", "8kbit", "none", "default"])
def test_rates_tc_takes_pass(rate):
    assert cluster.check_rate(rate) == rate


@pytest.mark.parametrize("rate", ["1gb", "fast", "1 gbit", "7kbit", "0mbit", "-1gbit", ""])
def test_other_rates_are_named_with_what_would_do(rate):
    with pytest.raises(UsageError, match=rf"link rate '{rate}' is not valid: give a rate such"):
        cluster.check_rate(rate)


def test_a_bad_link_state_is_refused_before_the_script_runs():
    with pytest.raises(UsageError, match="link state 'sideways' is not valid: give down or up"):
        cluster.set_link_state("node1", "sideways")


def _recorded(tmp_path: Path, monkeypatch, text: str | None) -> None:
    monkeypatch.setenv("HPCDP_CLUSTER_DIR", str(tmp_path))
    if text is not None:
        (tmp_path / "etc").mkdir()
        (tmp_path / "etc" / "network").write_text(text)


def test_namespace_mode_is_read_from_what_up_recorded(tmp_path, monkeypatch):
    _recorded(tmp_path, monkeypatch, "mode=namespaces\ninterface=hsn0\nsubnet=198.18.0.0/24\n")
    assert cluster.network_mode() == "namespaces"
    assert cluster.node_interface() == "hsn0"
    assert cluster.node_subnet() == "198.18.0.0/24"
    assert config.load_profile("local").network_interface == "hsn0"
    assert shared_fs.is_this_machine("198.18.0.2")
    assert not shared_fs.is_this_machine("198.19.0.2")


def test_on_the_loopback_the_local_profile_uses_lo_unless_told(tmp_path, monkeypatch):
    _recorded(tmp_path, monkeypatch, "mode=loopback\ninterface=lo\n")
    assert cluster.node_interface() == "lo" and cluster.node_subnet() == ""
    assert config.load_profile("local").network_interface == "lo"
    told = config.load_profile("local", {"network_interface": "eth0"})
    assert told.network_interface == "eth0"
    # Not the local cluster's profile: its interface is its own.
    assert config.load_profile("generic-gpu").network_interface != "lo"


def test_before_any_up_nothing_is_assumed(tmp_path, monkeypatch):
    _recorded(tmp_path, monkeypatch, None)
    assert cluster.network_mode() == "" and cluster.node_subnet() == ""
    assert cluster.node_interface() == "lo"
    assert config.load_profile("local").network_interface == "hsn0"
    assert not shared_fs.is_this_machine("198.18.0.2")
