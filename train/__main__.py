"""python -m train: `prepare` tokenizes an experiment's corpus once; `run` (the default) trains;
`allreduce` measures the all-reduce of one gradient (hpcdp compare's network baseline).

    python -m train prepare --experiment E [--set k=v ...]
    python -m train [run] --experiment E --strategy S --out DIR [--set k=v ...] [--resume]
                    [--expect-world N] [--expect-tasks-per-node N]
    python -m train allreduce (the same options as run; writes DIR/allreduce.json)
    python -m train export|sample|eval ... (the trained model out: train/export.py)

Nothing heavy is imported before the arguments are parsed. Bad input prints one line and exits 2.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import TYPE_CHECKING

from hpcdp import strategies
from hpcdp.errors import CLI_NAME, VIA_CLI, ArgumentParser, UsageError, one_line, positive_int
from train.imports import without_gc

if TYPE_CHECKING:
    from hpcdp.config import Experiment

INTERRUPTED_EXIT = 143
PROG = "python -m train"  # its name, unless hpcdp export|sample|eval exec'd it (VIA_CLI)


def _common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--experiment", required=True, metavar="E",
                        help="shipped experiment name (experiments/E.yaml) or a YAML path")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="override a field, e.g. train.steps=10 (YAML value; repeatable)")


def build_parser(prog: str = PROG) -> argparse.ArgumentParser:
    parser = ArgumentParser(
        prog=prog,
        description=f"GPT-2 pre-training with one of {len(strategies.NAMES)} data-parallel "
                    "strategies. "
                    "Commands: run (default), prepare, allreduce, export, sample, eval.",
    )
    sub = parser.add_subparsers(dest="command",
                                metavar="{run,prepare,allreduce,export,sample,eval}",
                                parser_class=ArgumentParser)
    prep = sub.add_parser("prepare", help="tokenize the experiment's corpus (once, idempotent)")
    _common(prep)
    _run_options(sub.add_parser("run", help="train (every process of the job runs this)"))
    _run_options(sub.add_parser("allreduce", help="time the all-reduce of one gradient over "
                                                  "the strategy's transport (every process)"))
    add_model_commands(sub)
    return parser


MODEL_COMMANDS = ("export", "sample", "eval")


def add_model_commands(sub) -> None:
    """export, sample, eval (train/export.py): `hpcdp export|sample|eval` run these."""
    exp = sub.add_parser("export", help="a run's checkpoint as a transformers folder")
    exp.add_argument("run_dir", metavar="RUN_DIR", help="the run folder (holding checkpoints/)")
    exp.add_argument("--to", required=True, metavar="DIR", help="the folder to write")
    exp.add_argument("--step", type=positive_int, metavar="N",
                     help="this step's checkpoint (default: the newest intact one)")
    exp.add_argument("--dtype", default="fp32", help="weights in fp32 (default), bf16 or fp16")
    exp.add_argument("--force", action="store_true", help="replace DIR if it exists")
    smp = sub.add_parser("sample", help="continue a prompt with transformers' generate")
    smp.add_argument("folder", metavar="DIR", help="an exported model folder")
    smp.add_argument("--prompt", required=True, metavar="TEXT")
    smp.add_argument("--max-new-tokens", type=positive_int, default=50, metavar="N")
    smp.add_argument("--seed", type=int, default=1234)
    smp.add_argument("--greedy", action="store_true", help="the likeliest token each time")
    ev = sub.add_parser("eval", help="perplexity on the run's held-out tokens, by transformers")
    ev.add_argument("source", metavar="RUN_DIR|DIR", help="a run folder or an exported folder")
    ev.add_argument("--step", type=positive_int, metavar="N", help="with a run folder: this step")
    ev.add_argument("--text", metavar="FILE",
                    help="instead: this text's perplexity (.jsonl: a \"text\" per line), "
                         "scored as lm-evaluation-harness's rolling loglikelihood does")
    ev.add_argument("--precision", choices=("run", "fp32"), default="run",
                    help="run (default): compute as the run evaluated (bf16 autocast for a bf16 "
                         "run), so the loss is the one it logged; fp32: full precision")
    ev.add_argument("--json", action="store_true")


def run_model_command(args) -> int:
    import json

    from train import export

    if args.command == "export":
        export.export(args.run_dir, args.to, args.step, args.dtype, args.force)
    elif args.command == "sample":
        print(export.sample(args.folder, args.prompt, args.max_new_tokens, args.seed,
                            args.greedy))
    elif args.text:
        result = export.evaluate_text(args.source, args.text)
        print(json.dumps(result, indent=2) if args.json else
              f"{result['documents']} document(s), {result['tokens']:,} tokens: perplexity "
              f"{result['token_perplexity']:.3f} per token, {result['byte_perplexity']:.4f} "
              "per byte")
    else:
        result = export.evaluate(args.source, args.step, args.precision,
                                 log=lambda line: print(line, file=sys.stderr))
        if args.json:
            print(json.dumps(result, indent=2))
        else:
            print(_eval_line(result))
    return 0


def _eval_line(result: dict) -> str:
    """The loss, in which precision it was computed, and the run's own figure beside it: a bf16
    run's loss computed in fp32 differs from the logged one by bf16's rounding (about 1e-3)."""
    logged, computed, run = (result["logged_val_loss"], result["precision"],
                             result["run_precision"])
    line = (f"step {result['step']}: validation loss {result['val_loss']:.4f} ({computed}), "
            f"perplexity {result['perplexity']:.2f} over {result['tokens']:,} held-out tokens")
    if logged is None:
        return line
    if computed == run:
        return line + f" (the run logged {logged:.4f})"
    return (line + f" (the run logged {logged:.4f} in {run}: the difference is {run}'s "
            "rounding; --precision run computes as the run did)")


def _run_options(run: argparse.ArgumentParser) -> None:
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


def _record_exit(out: str, code: int, env) -> None:
    """RUN_DIR/ranks/exit-RANK = "JOB CODE": the batch script tells a preemption (every rank
    stopped after a checkpoint, 143) from one rank failing and srun ending the others (which
    then stop with 143 too). A rank killed outright writes nothing, which counts as failed."""
    from pathlib import Path

    try:
        folder = Path(out) / "ranks"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"exit-{env.rank}").write_text(f"{env.job_id or 'manual'} {code}\n")
    except (OSError, UsageError) as exc:
        print(f"train: could not record the exit code: {exc}", file=sys.stderr)


def _record_error(out: str | None, line: str) -> None:
    """RUN_DIR/ranks/error-RANK = the line a rank refused to run with: srun can end the step
    before it forwards a failed task's last output, and the batch script then prints the line
    from here (base.sbatch.j2's ranks_said), so the job's log always says why. Only into a run
    folder that exists (a job's does: its script makes it): a mistyped command line does not
    leave a folder behind."""
    from pathlib import Path

    if not out or not Path(out).is_dir():
        return
    try:
        folder = Path(out) / "ranks"
        folder.mkdir(exist_ok=True)
        (folder / f"error-{_rank_from_env('0')}").write_text(line + "\n")
    except OSError:
        pass  # the line is on stderr already


def _rank_from_env(default: str) -> str:
    """This process's rank as its launcher set it, before any process group exists."""
    return next((os.environ[k] for k in ("RANK", "SLURM_PROCID", "OMPI_COMM_WORLD_RANK",
                                         "PMI_RANK") if k in os.environ), default)


def _hide_scipy() -> None:
    """transformers imports scipy.optimize whenever scipy is installed, for an object-detection
    loss GPT-2 never uses: about half a second of every rank's start on these CPUs. Only
    harvest needs scipy, never a rank, so a rank that is its own process hides it (a None in
    sys.modules makes find_spec answer "not installed" and `import scipy` fail cleanly)."""
    sys.modules.setdefault("scipy", None)


def main(argv: list[str] | None = None, reexec: bool = False) -> int:
    """`reexec`: this process is `python -m train` itself, and may re-execute itself to run with
    train.malloc's allocator (not when called from another program)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    # `run` is the default command: python -m train --experiment ... trains.
    if not argv or argv[0] not in ("run", "prepare", "allreduce", *MODEL_COMMANDS, "-h",
                                   "--help"):
        argv.insert(0, "run")
    via_cli = os.environ.pop(VIA_CLI, None) == "1"  # hpcdp export|sample|eval exec'd this
    args = None
    try:
        args = build_parser(CLI_NAME if via_cli else PROG).parse_args(argv)
        if args.command in MODEL_COMMANDS:
            return run_model_command(args)
        from hpcdp.config import load_experiment, split_overrides

        _, overrides = split_overrides(args.set)  # cluster.* does not change training
        exp = load_experiment(args.experiment, overrides)
        if args.command == "prepare":
            from train.data import prepare

            prepare(exp)
            return 0
        spec = strategies.get(args.strategy)  # a typo fails before torch loads
        if args.command == "allreduce":
            with without_gc():
                from train.allreduce import measure

            measure(exp, spec, args.out, expect_world=args.expect_world,
                    expect_tasks_per_node=args.expect_tasks_per_node)
            return 0
        if reexec:  # first: exec resets the signal handlers catch_early installs
            from train import malloc

            malloc.reexec_with(exp.train.malloc, uses_horovod=spec.needs_horovod)
            _hide_scipy()
        return _train(exp, args, spec)
    except UsageError as exc:
        if str(exc):  # AlreadySaid: another rank said it
            line = f"{CLI_NAME + ': ' if via_cli else ''}error: {one_line(str(exc))}"
            say_error(line)
            _record_error(getattr(args, "out", None), line)
        return exc.exit_code
    except Exception as exc:
        if not _said_a_peer_is_gone(exc):
            raise
        return 1


def _train(exp: Experiment, args: argparse.Namespace, spec: strategies.StrategySpec) -> int:
    """This process's rank of the run: 0 when it completed, INTERRUPTED_EXIT when a stop signal
    ended it after a checkpoint."""
    import socket

    from hpcdp import distenv, peaks
    from train import stop

    # A launch that started another world than the script asked for, a master address that
    # is not rank 0's node, or a bad HPCDP_PEAK_FLOPS is refused before torch loads: 0.3 s a
    # rank, not 5. The loop takes the strategy and environment as resolved here.
    env = distenv.detect()
    distenv.check_world(env, args.expect_world, args.expect_tasks_per_node)
    if spec.transport == "torch":  # DDP's family: rendezvous at it
        distenv.check_master_is_rank0_node(env, socket.gethostname())
    if os.environ.get(peaks.OVERRIDE):
        peaks.peak_flops_override(os.environ[peaks.OVERRIDE])
    stop.catch_early()  # before torch loads: a rank signalled while starting must not die
    with without_gc():  # torch and transformers: 0.7 s less per rank (train/imports.py)
        from train.loop import run

    code = 1
    try:
        summary = run(exp, spec, args.out, args.resume, env=env)
        # Stopped by SIGTERM/SIGUSR1 after a checkpoint: not finished, as 128 + SIGTERM.
        code = 0 if summary["status"] == "completed" else INTERRUPTED_EXIT
    finally:
        _record_exit(args.out, code, env)
    return code


def say_error(line: str) -> None:
    """`line` to stderr in one write: the ranks of a job share the pipe or log, and print()'s
    two writes (the text, then the newline) let another rank's line land between them, which
    glued two ranks' lines into one (and `hpcdp run` could not tell they were the same)."""
    sys.stderr.write(line + "\n")
    sys.stderr.flush()


# What a collective raises when another rank is gone (gloo, NCCL, Horovod).
PEER_GONE = ("Connection closed by peer", "Connection reset by peer", "remote worker crash",
             "remote process exited", "Horovod has been shut down")


def _said_a_peer_is_gone(exc: Exception) -> bool:
    """A rank that died (out of memory, a crash) takes its peers' next collective with it:
    their tracebacks buried the one line that says why (srun's, torchrun's or its own). Such
    an error is one line here; True when `exc` was one."""
    gone = next((text for text in PEER_GONE if text in str(exc)), None)
    if gone:
        rank = _rank_from_env("?")
        say_error(f"error: rank {rank} lost a peer ({type(exc).__name__}: {gone}): another "
                  "rank ended first; the line that says why is its own or its launcher's")
    return gone is not None


def exit_without_finalizing(code: int):
    """End the process with `code`: other threads are joined and the exit handlers run as on a
    normal exit, but Python's finalization (the last garbage collection, module teardown) does
    not. Why: after teardown, a gloo worker thread may still be releasing the last collective's
    tensors; if the interpreter is finalizing by then, the thread's bid for the GIL unwinds a
    destructor that may not throw and the process aborts ("terminate called without an active
    exception", SIGABRT): a run that finished and wrote everything ends as a FAILED job. Seen
    with fsdp, whose device mesh keeps the process group alive past destroy_process_group, on
    loaded cores (docs/troubleshooting.md). By now the run has
    closed its files and trackers, and the strategy has shut down Horovod or its process group:
    finalization had only memory left to free."""
    import atexit
    import threading

    # What Py_FinalizeEx does first, in its order: threading's own exit callbacks (they tell the
    # idle workers of a ThreadPoolExecutor, such as torch.compile's, to stop: joining those
    # first waits forever), the join of non-daemon threads, then the atexit handlers.
    threading._shutdown()
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed pipe: nothing more can be said
            pass
    os._exit(code)


if __name__ == "__main__":
    exit_without_finalizing(main(reexec=True))
