"""Issue 11 (d): each speed option on and off, on the minimal loop (bench/minimal_loop.py).

One option changes per case, against the baseline (fused AdamW, SDPA attention, fp32, eager,
glibc's malloc): AdamW's per-tensor loop instead of the fused kernel, eager attention instead
of SDPA, bf16 autocast, torch.compile, and tcmalloc or jemalloc preloaded (train.malloc; a case
whose library is not installed is left out). Each case is a fresh process; cases alternate
round after round; the number compared is seconds per step in the steady state (compilation
happens before it).

    python bench/speed_options.py [--model tiny|gpt2-124m] [--rounds 5] [--steps 40]
"""

from __future__ import annotations

import argparse
import functools
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import _common  # noqa: E402
from _common import PYTHON, ROOT  # noqa: E402
from overhead import MODEL_SETTINGS  # noqa: E402

OPTIONS = {  # name: (minimal_loop.py's flags, train.malloc)
    "baseline (fused AdamW, SDPA, fp32, eager, glibc malloc)": ([], "system"),
    "AdamW per-tensor loop": (["--no-fused"], "system"),
    "eager attention": (["--set", "model.attention=eager"], "system"),
    "bf16 autocast": (["--precision", "bf16"], "system"),
    "torch.compile": (["--compile"], "system"),
    "tcmalloc": ([], "tcmalloc"),
    "jemalloc": ([], "jemalloc"),
    "bf16 autocast + tcmalloc": (["--precision", "bf16"], "tcmalloc"),
}


def case(flags: list[str], env: dict, model: str, steps: int, skip: int) -> float:
    cmd = [PYTHON, str(ROOT / "bench" / "minimal_loop.py"), "--experiment", "smoke",
           "--steps", str(steps), "--skip-steps", str(skip), *flags,
           *[a for s in MODEL_SETTINGS[model] for a in ("--set", s)]]
    return _common.run_json(cmd, env=env, timeout=3600)["step_time_s"]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="tiny", choices=list(MODEL_SETTINGS))
    _common.add_timing_arguments(p, rounds=5, steps=40)
    args = p.parse_args()
    from train import malloc

    cases = {}
    for name, (flags, setting) in OPTIONS.items():
        if setting != "system" and malloc.find(setting) is None:
            print(f"bench: {setting} is not installed: no '{name}' case")
            continue
        env = {"OMP_NUM_THREADS": str(args.threads), **malloc.preload_env(setting)}
        cases[name] = functools.partial(case, flags, env, args.model, args.steps,
                                        args.skip_steps)
    values = _common.interleaved(cases, args.rounds,
                                 progress=lambda line: print(f"  {line}", flush=True))
    _common.print_table(f"{args.model}: step time of each option against the baseline",
                        _common.ratio_rows(values, next(iter(OPTIONS))), "step time ratio")


if __name__ == "__main__":
    main()
