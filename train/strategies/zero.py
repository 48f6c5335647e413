"""ZeRO-1: DDP's all-reduce, with the optimizer state partitioned over ranks
(torch.distributed.optim.ZeroRedundancyOptimizer). Beyond the paper.

Every rank still holds the whole model and the whole gradient, but only the AdamW moments of
its partition of the parameters: it steps that partition and broadcasts the updated parameters
to the others. Checkpoints stay one file: before rank 0 saves, every rank sends its partition's
state to rank 0 (consolidate_state_dict), and on resume each rank keeps its own partition of
that full state, at any world size.
"""

from __future__ import annotations

from torch.distributed.optim import ZeroRedundancyOptimizer

from train.strategies.ddp import DDPStrategy


class ZeroStrategy(DDPStrategy):
    def wrap(self, model, optimizer, accum_steps: int = 1):
        model, optimizer = super().wrap(model, optimizer, accum_steps)
        if self.world_size == 1:
            return model, optimizer  # one rank: nothing to partition
        zero = ZeroRedundancyOptimizer(optimizer.param_groups, optimizer_class=type(optimizer),
                                       fused=optimizer.defaults.get("fused") or None)
        return model, zero

    def before_checkpoint(self, optimizer) -> None:
        if isinstance(optimizer, ZeroRedundancyOptimizer):
            optimizer.consolidate_state_dict(to=0)

    def optimizer_state(self, optimizer):
        # ZeroRedundancyOptimizer.state is the full table's shape; its own optimizer holds the
        # partition this rank steps.
        if isinstance(optimizer, ZeroRedundancyOptimizer):
            return optimizer.optim.state
        return super().optimizer_state(optimizer)

    def describe(self) -> str:
        return (f"ZeRO-1 (DDP + ZeroRedundancyOptimizer) rank {self.rank}/{self.world_size} on "
                f"{self.device} ({self.communication})")
