"""One process, one device: cuda:(local rank % GPUs), or the CPU. The paper's "Single GPU"."""

from __future__ import annotations

from train.strategies import Strategy, device_for


class SingleStrategy(Strategy):
    def setup(self, env, timeout_s: int) -> None:
        self.device = device_for(env)
