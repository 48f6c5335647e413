"""python -m train: `prepare` tokenizes an experiment's corpus once; `run` (the default) trains.

    python -m train prepare --experiment E [--set k=v ...]
    python -m train [run] --experiment E --strategy S --out DIR [--set k=v ...] [--resume]
                    [--expect-world N] [--expect-tasks-per-node N]

Nothing heavy is imported before the arguments are parsed. Bad input prints one line and exits 2.
"""

from __future__ import annotations

import argparse
import sys

from hpcdp import strategies
from hpcdp.errors import ArgumentParser, UsageError, one_line, positive_int

INTERRUPTED_EXIT = 143


def _common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--experiment", required=True, metavar="E",
                        help="shipped experiment name (experiments/E.yaml) or a YAML path")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="override a field, e.g. train.steps=10 (YAML value; repeatable)")


def build_parser() -> argparse.ArgumentParser:
    parser = ArgumentParser(
        prog="python -m train",
        description=f"GPT-2 pre-training with one of {len(strategies.NAMES)} data-parallel "
                    "strategies. "
                    "Commands: run (default), prepare.",
    )
    sub = parser.add_subparsers(dest="command", metavar="{run,prepare}",
                                parser_class=ArgumentParser)
    prep = sub.add_parser("prepare", help="tokenize the experiment's corpus (once, idempotent)")
    _common(prep)
    run = sub.add_parser("run", help="train (every process of the job runs this)")
    _common(run)
    run.add_argument("--strategy", required=True, metavar="S",
                     help=f"one of: {', '.join(strategies.NAMES)}")
    run.add_argument("--out", required=True, metavar="DIR",
                     help="run folder: metrics.jsonl and checkpoints/ go here")
    run.add_argument("--resume", action="store_true",
                     help="continue from the newest checkpoint in DIR/checkpoints (if any)")
    run.add_argument("--expect-world", type=positive_int, metavar="N",
                     help="fail at once unless the launcher started N processes in all")
    run.add_argument("--expect-tasks-per-node", type=positive_int, metavar="N",
                     help="fail at once unless this node runs N processes")
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    # `run` is the default command: python -m train --experiment ... trains.
    if not argv or argv[0] not in ("run", "prepare", "-h", "--help"):
        argv.insert(0, "run")
    try:
        args = build_parser().parse_args(argv)
        from hpcdp.config import load_experiment, split_overrides

        _, overrides = split_overrides(args.set)  # cluster.* does not change training
        exp = load_experiment(args.experiment, overrides)
        if args.command == "prepare":
            from train.data import prepare

            prepare(exp)
            return 0
        strategies.get(args.strategy)  # a typo fails before torch loads
        from train import stop

        stop.catch_early()  # before torch loads: a rank signalled while starting must not die
        from train.loop import run

        summary = run(exp, args.strategy, args.out, args.resume, expect_world=args.expect_world,
                      expect_tasks_per_node=args.expect_tasks_per_node)
        # Stopped by SIGTERM/SIGUSR1 after a checkpoint: not finished, as 128 + SIGTERM says.
        return 0 if summary["status"] == "completed" else INTERRUPTED_EXIT
    except UsageError as exc:
        print(f"error: {one_line(str(exc))}", file=sys.stderr)
        return exc.exit_code


if __name__ == "__main__":
    sys.exit(main())
