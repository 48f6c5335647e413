"""A minimal hand-written GPT-2 training loop, nanoGPT-style: the ceiling for hpcdp's overhead.

The same model (train.model.build_model, Hugging Face GPT-2 from a config), the same data
(the experiment's prepared tokens, random windows), AdamW (fused unless --no-fused), bf16
autocast with --precision bf16, torch.compile with --compile. Nothing else: no process group,
no metrics file, no stop signals. The loss is read on the host every --log-interval steps, as
hpcdp's loop does when it logs.

Prints one JSON line: {"step_time_s": seconds per step from step --skip-steps to the last}.

    python bench/minimal_loop.py --experiment smoke [--set k=v ...] [--steps 40] [--skip-steps 10]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np  # noqa: E402
import torch  # noqa: E402

from hpcdp import config  # noqa: E402
from hpcdp.config import Experiment  # noqa: E402
from train.data import open_data  # noqa: E402
from train.model import LanguageModel, build_model  # noqa: E402


class MinimalLoop:
    """Model, optimizer and data of one experiment, and `step_time` to train it a while."""

    def __init__(self, exp: Experiment, precision: str = "fp32", compile_: bool = False,
                 fused: bool = True, log_interval: int = 10) -> None:
        cfg = self.cfg = exp.train
        self.log_interval = log_interval
        data = open_data(exp)
        self.tokens = data.tokens("train")
        self.rng = np.random.default_rng(cfg.seed)
        torch.manual_seed(cfg.seed)
        model = LanguageModel(build_model(exp.model.preset, data.vocab_size, cfg.seq_len,
                                          exp.model.dropout, exp.model.attention))
        self.model = torch.compile(model) if compile_ else model
        decay = [q for q in model.parameters() if q.dim() >= 2]
        rest = [q for q in model.parameters() if q.dim() < 2]
        self.optimizer = torch.optim.AdamW(
            [{"params": decay, "weight_decay": cfg.weight_decay},
             {"params": rest, "weight_decay": 0.0}], lr=cfg.lr, fused=fused)
        self.autocast = ((lambda: torch.autocast("cpu", dtype=torch.bfloat16))
                         if precision == "bf16" else contextlib.nullcontext)

    def batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        cfg = self.cfg
        starts = self.rng.integers(0, len(self.tokens) - cfg.seq_len - 1, cfg.micro_batch_size)
        windows = np.stack([self.tokens[s:s + cfg.seq_len + 1] for s in starts])
        w = torch.from_numpy(windows.astype(np.int64))
        return w[:, :-1], w[:, 1:]

    def step_time(self, steps: int, skip_steps: int) -> float:
        """Train `steps` steps; seconds per step after the first `skip_steps`."""
        t_first = time.perf_counter()
        for step in range(1, steps + 1):
            x, y = self.batch()
            with self.autocast():
                loss = self.model(x, y).mean()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.cfg.grad_clip)
            self.optimizer.step()
            self.optimizer.zero_grad(set_to_none=True)
            if step % self.log_interval == 0:
                loss.item()
            if step == skip_steps:
                t_first = time.perf_counter()
        return (time.perf_counter() - t_first) / (steps - skip_steps)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--experiment", default="smoke")
    p.add_argument("--set", action="append", default=[], dest="sets", metavar="KEY=VALUE")
    p.add_argument("--precision", choices=["fp32", "bf16"], default="fp32")
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--skip-steps", type=int, default=10)
    p.add_argument("--compile", action="store_true")
    p.add_argument("--no-fused", action="store_true", help="AdamW's per-tensor loop")
    args = p.parse_args()
    exp = config.load_experiment(args.experiment, config.parse_overrides(args.sets))
    loop = MinimalLoop(exp, args.precision, compile_=args.compile, fused=not args.no_fused)
    print(json.dumps({"step_time_s": loop.step_time(args.steps, args.skip_steps)}))


if __name__ == "__main__":
    main()
