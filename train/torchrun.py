"""`python -m train.torchrun ARGS`: torchrun (torch.distributed.run, same arguments) that ends a
failed launch in one line instead of ChildFailedError's 40-line traceback and failure table.

The ranks have already said why they failed (rank 0's one line; the others stay quiet when
rank 0 spoke for them, hpcdp/errors.py AlreadySaid): what is left to say is which rank failed
first and with what code. The exit code is that rank's (128 + N for a signal), not torchrun's
blanket 1, so `hpcdp run` reports it as a Slurm step would.
"""

from __future__ import annotations

import logging
import signal
import socket
import sys


def first_failure(failures: dict) -> tuple[int, int]:
    """(rank, exit code) of the failure torchrun observed first (`failures`: global rank to
    ProcessFailure, as ChildFailedError holds them); a signal N counts as 128 + N."""
    rank = min(failures, key=lambda r: failures[r].timestamp)
    code = failures[rank].exitcode
    return rank, (128 - code if code < 0 else code) or 1


def main(argv: list[str] | None = None) -> int:
    from train.imports import without_gc

    with without_gc():  # about 0.15 s less per launch (train/imports.py)
        from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
        from torch.distributed.run import parse_args, run

    # torchrun's warnings as it stops the other ranks repeat what the line below says.
    logging.getLogger("torch.distributed.elastic").setLevel(logging.CRITICAL)
    try:
        run(parse_args(argv))
    except ChildFailedError as exc:
        rank, code = first_failure(exc.failures)
        print(f"torchrun: rank {rank} exited first, with code {code}; "
              f"{len(exc.failures)} rank(s) failed (their own lines are above)", file=sys.stderr)
        if code == 128 + signal.SIGKILL:  # no rank says anything when the kernel kills it
            from hpcdp.job_end import SIGKILL_EVIDENCE, OutOfMemory
            said = OutOfMemory(str(rank), socket.gethostname(), SIGKILL_EVIDENCE,
                                   certain=False).line()
            print(f"torchrun: {said}", file=sys.stderr)
        return code
    return 0


if __name__ == "__main__":
    sys.exit(main())
