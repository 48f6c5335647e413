"""torch.nn.DataParallel: one process drives every visible GPU of its node.

The paper's "Single Parameter Server": the main GPU scatters each batch, replicates the model,
gathers outputs and reduces gradients onto itself every step. The batch of one forward pass is
micro_batch_size x GPUs. With no GPU, DataParallel simply calls the module (device_ids is empty):
the code path runs, its speed means nothing.
"""

from __future__ import annotations

import torch

from train.strategies import Strategy


class DataParallelStrategy(Strategy):
    def setup(self, env, timeout_s: int) -> None:
        n_gpus = torch.cuda.device_count()
        self.devices_per_process = max(1, n_gpus)
        if n_gpus:
            torch.cuda.set_device(0)  # DataParallel's parameter server is device_ids[0]
            self.device = torch.device("cuda", 0)
        else:
            self.device = torch.device("cpu")
            self.log("DataParallel: no GPU visible, DataParallel runs degenerate "
                     "(the wrapped model on the CPU, nothing is scattered)")

    def wrap(self, model, optimizer, accum_steps: int = 1):
        return torch.nn.DataParallel(model), optimizer

    def exposed_comm(self, phases, comm):
        # The reduction onto device 0 happens inside backward, and nothing times it: unknown,
        # not zero (harvest shows "-").
        return None

    def describe(self) -> str:
        return f"DataParallel over {self.devices_per_process} device(s) from {self.device}"
