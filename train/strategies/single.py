"""One process, one device: cuda:device_index, or the CPU. The paper's "Single GPU"."""

from __future__ import annotations

import torch

from train.strategies import Strategy, local_device


class SingleStrategy(Strategy):
    def setup(self, env, timeout_s: int) -> None:
        n_gpus = torch.cuda.device_count()
        self.device = local_device(env.device_index(n_gpus) if n_gpus else 0)
