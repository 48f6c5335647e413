"""hpcdp/shared_fs.py: a run folder the partition's nodes cannot see is refused before
submitting, where that can be told (issue 36, item 6). The mount table is this machine's own
/proc/mounts, or lines in its format; the node addresses are what `scontrol show node` gives."""

from __future__ import annotations

from pathlib import Path

from hpcdp import shared_fs

MOUNTS = """\
/dev/sda1 / ext4 rw,relatime 0 0
tmpfs /dev/shm tmpfs rw,nosuid,nodev 0 0
nfs.site:/export/home /home nfs4 rw,relatime 0 0
tmpfs /scratch/fast tmpfs rw,size=1g 0 0
/dev/sdb1 /local\\040disk ext4 rw 0 0
"""
OTHER_NODES = ["10.1.0.11", "10.1.0.12", "10.1.0.13", "10.1.0.14"]


def test_the_filesystem_of_a_path_is_its_longest_mount_point(tmp_path):
    assert shared_fs.filesystem_of(Path("/home/ann/runs/x"), MOUNTS) == ("/home", "nfs4")
    assert shared_fs.filesystem_of(Path("/scratch/fast/a"), MOUNTS) == ("/scratch/fast", "tmpfs")
    assert shared_fs.filesystem_of(Path("/local disk/r"), MOUNTS) == ("/local disk", "ext4")
    assert shared_fs.filesystem_of(Path("/homework"), MOUNTS) == ("/", "ext4")  # not /home
    # this machine's own table, for a folder that does not exist yet: its nearest parent's
    point, kind = shared_fs.filesystem_of(tmp_path / "not" / "yet")
    assert Path(point) in [tmp_path, *tmp_path.parents] and kind != "unknown"


def test_a_folder_in_memory_or_under_tmp_is_refused_when_the_nodes_are_other_machines():
    said = shared_fs.problem(Path("/scratch/fast/runs"), OTHER_NODES, MOUNTS)
    assert said.startswith("run folder '/scratch/fast/runs' is on a tmpfs mounted at "
                           "/scratch/fast, in this machine's memory: the partition's nodes "
                           "(10.1.0.11, 10.1.0.12, 10.1.0.13, ...) cannot see it")
    assert "give --out a folder on a filesystem they share" in said
    under_tmp = shared_fs.problem(Path("/tmp/me/runs"), OTHER_NODES, MOUNTS)
    assert "is under /tmp, which every machine has its own of" in under_tmp
    assert shared_fs.problem(Path("/home/ann/runs"), OTHER_NODES, MOUNTS) is None


def test_nodes_on_this_machine_or_unknown_nodes_are_not_refused():
    local_cluster = ["127.0.100.1", "127.0.100.2"]  # scripts/local-slurm.sh's NodeAddr
    assert shared_fs.problem(Path("/tmp/me/runs"), local_cluster, MOUNTS) is None
    assert shared_fs.problem(Path("/tmp/me/runs"), ["localhost"], MOUNTS) is None
    assert shared_fs.problem(Path("/tmp/me/runs"), None, MOUNTS) is None  # Slurm did not say
    assert shared_fs.is_this_machine("127.0.0.1") and not shared_fs.is_this_machine("10.1.0.11")
