"""Slurm hostlist expansion: the grammar, broken inputs, and Slurm's own expansion as reference.

`scontrol show hostnames` needs no running controller, only a readable slurm.conf (checked with
Debian's Slurm 22.05: with none it dies with "Could not establish a configuration source").
The comparison test writes a throwaway one-node slurm.conf, so it runs wherever scontrol is
installed, cluster up or not.
"""

from __future__ import annotations

import shutil
import subprocess

import pytest

from hpcdp.errors import UsageError
from hpcdp.hostlist import HostlistError, expand_hostlist

VALID = [
    ("node1", ["node1"]),
    ("alpha,beta,gamma", ["alpha", "beta", "gamma"]),  # Lightning #5160
    ("a b,c", ["a", "b", "c"]),  # whitespace separates too
    ("  a\tb\nc  ", ["a", "b", "c"]),
    ("node[001-004,010]", ["node001", "node002", "node003", "node004", "node010"]),
    ("gpu-[01-03,07],cpu1", ["gpu-01", "gpu-02", "gpu-03", "gpu-07", "cpu1"]),
    ("a[1-2]b[3-4]", ["a1b3", "a1b4", "a2b3", "a2b4"]),
    ("rack[0-1]-n[01-02]", ["rack0-n01", "rack0-n02", "rack1-n01", "rack1-n02"]),
    ("n[8-10]", ["n8", "n9", "n10"]),
    ("n[9-12]", ["n9", "n10", "n11", "n12"]),
    ("n[009-011]", ["n009", "n010", "n011"]),
    ("n[01-3]", ["n01", "n02", "n03"]),  # padding comes from the start of a range
    ("n[1-03]", ["n1", "n2", "n3"]),
    ("linux[1,2]", ["linux1", "linux2"]),  # Lightning #14896
    ("nodes[006,011]", ["nodes006", "nodes011"]),  # scoop #26
    ("nodeA,nodeB[001,003],nodeC", ["nodeA", "nodeB001", "nodeB003", "nodeC"]),  # Megatron-Bridge
    ("n[1]", ["n1"]),
    ("n[2,1]", ["n2", "n1"]),  # order kept, as scontrol keeps it
    ("n[1-2],n[1-2]", ["n1", "n2", "n1", "n2"]),  # duplicates kept, as scontrol keeps them
    ("n[1-2][3-4]", ["n13", "n14", "n23", "n24"]),
    ("n[1-2]x[5]", ["n1x5", "n2x5"]),
    ("[1-2]", ["1", "2"]),
    ("a,,b", ["a", "b"]),
    ("n[1-3]-ib", ["n1-ib", "n2-ib", "n3-ib"]),  # suffix after the last bracket
    ("n[1-2]a,b", ["n1a", "n2a", "b"]),
    ("node-10-[1-2].ib", ["node-10-1.ib", "node-10-2.ib"]),
    ("n[99-101]", ["n99", "n100", "n101"]),
]

# Slurm 22.05's parser refuses a plain suffix after a single bracket group although pdsh and
# flux accept it and the expansion is unambiguous; hpcdp accepts it (a superset of that Slurm).
REFUSED_BY_SLURM_22 = {"n[1-3]-ib", "n[1-2]a,b", "node-10-[1-2].ib"}

BROKEN = [
    ("", "names no host"),
    ("   ", "names no host"),
    (" , ,", "names no host"),
    ("n[3-1]", "runs backwards"),  # submitit returns [] here
    ("n[", "'[' without ']'"),
    ("n[1-2", "'[' without ']'"),
    ("a]", "']' without '['"),
    ("n[1-2]]", "']' without '['"),
    ("n[[1]]", "nested"),
    ("n[]", "empty range"),
    ("n[1,,2]", "empty range"),
    ("n[1,]", "empty range"),
    ("n[1-]", "not N or N-M"),
    ("n[-3]", "not N or N-M"),
    ("n[a-b]", "not N or N-M"),
    ("n[1-2-3]", "not N or N-M"),
    ("n[0-65536]", "more than 65536"),
]


@pytest.mark.parametrize("text,expected", VALID, ids=[t for t, _ in VALID])
def test_expands(text: str, expected: list[str]) -> None:
    assert expand_hostlist(text) == expected


@pytest.mark.parametrize("text,why", BROKEN, ids=[repr(t) for t, _ in BROKEN])
def test_broken_input_raises_one_line_naming_it(text: str, why: str) -> None:
    with pytest.raises(HostlistError) as info:
        expand_hostlist(text)
    message = str(info.value)
    assert why in message
    assert repr(" ".join(text.split("\n"))) in message
    assert "\n" not in message


def test_hostlist_error_is_a_value_error_and_a_one_line_usage_error() -> None:
    with pytest.raises(ValueError):
        expand_hostlist("n[3-1]")
    assert issubclass(HostlistError, UsageError)


def test_largest_range_slurm_allows() -> None:
    hosts = expand_hostlist("n[1-65536]")
    assert len(hosts) == 65536 and hosts[-1] == "n65536"


def test_non_string_is_refused() -> None:
    with pytest.raises(HostlistError, match="must be a string"):
        expand_hostlist(None)  # type: ignore[arg-type]


# --------------------------------------------------------------------------------------------
# Slurm's own expansion as the reference


@pytest.fixture(scope="module")
def scontrol_conf(tmp_path_factory: pytest.TempPathFactory) -> str:
    if shutil.which("scontrol") is None:
        pytest.skip("scontrol is not installed (Debian package slurm-client / slurm-wlm)")
    folder = tmp_path_factory.mktemp("scontrol")
    conf = folder / "slurm.conf"
    # Enough for scontrol to start; nothing is contacted for `show hostnames`.
    conf.write_text(
        "ClusterName=hostlist\nSlurmctldHost=localhost\n"
        "NodeName=x CPUs=1 State=UNKNOWN\nPartitionName=p Nodes=x Default=YES\n"
    )
    return str(conf)


def _scontrol_hostnames(text: str, conf: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["scontrol", "show", "hostnames", text],
        env={"SLURM_CONF": conf, "PATH": "/usr/bin:/bin"},
        capture_output=True, text=True, timeout=30,
    )


@pytest.mark.parametrize("text,expected", VALID, ids=[t for t, _ in VALID])
def test_matches_scontrol_show_hostnames(text: str, expected: list[str],
                                        scontrol_conf: str) -> None:
    done = _scontrol_hostnames(text, scontrol_conf)
    output = done.stdout + done.stderr
    if "Could not establish a configuration source" in output:
        pytest.skip(f"scontrol cannot read the throwaway slurm.conf: {output.strip()}")
    if text in REFUSED_BY_SLURM_22 and "Invalid hostlist" in output:
        # Known difference; if a newer Slurm accepts it, the comparison below must hold.
        return
    assert "Invalid hostlist" not in output, output
    assert done.stdout.split() == expand_hostlist(text) == expected


def test_scontrol_also_refuses_backwards_and_empty_ranges(scontrol_conf: str) -> None:
    for text in ("n[3-1]", "n[]", "n[1,,2]", "n[a-b]", "n[1-2-3]", "n[0-65536]"):
        output = _scontrol_hostnames(text, scontrol_conf)
        assert "Invalid hostlist" in output.stdout + output.stderr, text
