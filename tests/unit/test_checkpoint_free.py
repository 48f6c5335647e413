"""A failed sharded save's temporary folder is every rank's: each rank removes it, and one may
remove it while another walks it. Once, in a suite run, rank 1 of a 2-rank FSDP save through a
full disk listed the folder as rank 0 removed it, and its FileNotFoundError became a traceback
instead of the one line a full disk is (test_checkpoint_damage.py). That order cannot be
provoked on demand between two processes, so here the folder vanishes between the walk's look
at it and its listing of it, where it vanished then: a real folder, removed for real."""

from __future__ import annotations

import shutil
from pathlib import Path, PosixPath

from train import checkpoint


class _RemovedAsWalked(PosixPath):
    """A path whose folder another rank removes between the walk's look at it and its listing
    of it: the second time it is asked whether it is a folder (the first is _files' own), it
    still is, and then it is gone."""

    asked = 0

    def is_dir(self):
        _RemovedAsWalked.asked += 1
        answer = super().is_dir()
        if _RemovedAsWalked.asked == 2 and answer:
            shutil.rmtree(self)
        return answer


def test_a_temporary_folder_another_rank_removed_mid_walk_is_freed_quietly(tmp_path):
    folder = tmp_path / ".step-0000008.dcp.tmp-1"
    (folder / "sub").mkdir(parents=True)
    (folder / "__0_0.distcp").write_bytes(b"x" * 100)
    (folder / "sub" / "__1_0.distcp").write_bytes(b"y" * 100)
    _RemovedAsWalked.asked = 0
    vanishing = _RemovedAsWalked(folder)
    checkpoint._free(vanishing)  # raised FileNotFoundError before
    assert not folder.exists()


def test_a_temporary_folder_is_emptied_and_removed(tmp_path):
    folder = tmp_path / ".step-0000004.dcp.tmp-1"
    folder.mkdir()
    (folder / "__0_0.distcp").write_bytes(b"x" * 100)
    held = open(folder / "__0_0.distcp", "rb")  # a failed write's file, still open
    try:
        checkpoint._free(Path(folder))
        assert not folder.exists()
        import os

        assert os.fstat(held.fileno()).st_size == 0  # its blocks are free although it is open
    finally:
        held.close()
