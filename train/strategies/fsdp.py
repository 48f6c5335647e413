"""FSDP2 (torch.distributed.fsdp.fully_shard): parameters, gradients and optimizer state
sharded over ranks. Beyond the paper.

Each transformer block is one FSDP unit, and the GPT-2 model is the root (embeddings, final
LayerNorm, tied head): a block's parameters are all-gathered just before its forward (and,
with train.fsdp.reshard_after_forward true, ZeRO-3, again before its backward; false keeps them
whole until backward, ZeRO-2), and its gradients are reduce-scattered after its backward, so
each rank keeps 1/world of every gradient and steps only its shard. HSDP is the same on a 2-D
mesh: shard within a node, replicate (all-reduce) across nodes.

Mixed precision (fsdp-apex) is FSDP's own MixedPrecisionPolicy: fp32 sharded master weights,
gathered and computed in bf16/fp16, gradients reduced in train.grad_comm's precision.

At world size 1 nothing is sharded: the model stays whole and trains as one process does
(autocast for fsdp-apex), and its checkpoints, still torch.distributed.checkpoint's, reshard to
any world size.
"""

from __future__ import annotations

import contextlib
import dataclasses

import torch
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

from hpcdp.errors import UsageError
from train.strategies.ddp import DDPStrategy

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


class FSDPStrategy(DDPStrategy):
    # Compiled after sharding, as DDP is: FSDP2's hooks then run around the compiled graph.
    compile_around_wrapper = True
    reshard_after_forward = True
    """ZeRO-3 (True) or ZeRO-2: train.fsdp.reshard_after_forward, read in `wrap`."""
    mesh = None
    """None: one dimension over every rank (FSDP); HSDP's is (replicate, shard)."""

    @property
    def casts_parameters(self) -> bool:
        """MixedPrecisionPolicy casts the sharded parameters; one rank keeps the model whole
        (`wrap`), so there autocast computes in the run's precision, as for one process."""
        return self.world_size > 1

    def wrap(self, model, optimizer, accum_steps: int = 1):
        self.reshard_after_forward = self.settings.fsdp.reshard_after_forward
        if self.world_size == 1:
            # Nothing to shard: fully_shard would still run every block's hooks and copy its
            # parameters through one-rank all-gathers and reduce-scatters (1.20x the minimal
            # loop's step here, docs/performance.md). torchtitan applies no FSDP at one rank
            # either. Checkpoints stay torch.distributed.checkpoint's, so they reshard to more
            # ranks.
            self.log("FSDP2: world size 1, gradients stay local (nothing to shard: no "
                     "fully_shard)")
            return model, optimizer
        gpt2 = model.model  # LanguageModel's GPT-2: the root unit, its blocks the inner ones
        compute = DTYPES[self.compute_dtype] if self.compute_dtype != "fp32" else None
        policy = MixedPrecisionPolicy(param_dtype=compute, reduce_dtype=DTYPES[self.grad_comm])
        # Parameter names survive sharding; the parameters themselves become DTensors, so the
        # optimizer is built again over them, group by group as it was.
        names = {id(p): n for n, p in model.named_parameters()}
        group_names = [[names[id(p)] for p in group["params"]] for group in optimizer.param_groups]
        for block in gpt2.transformer.h:
            fully_shard(block, mesh=self.mesh, reshard_after_forward=self.reshard_after_forward,
                        mp_policy=policy)
        # The root's parameters are needed again at once by the loss: never resharded early.
        # Its logits come back in fp32, for the loss.
        fully_shard(gpt2, mesh=self.mesh, reshard_after_forward=False,
                    mp_policy=dataclasses.replace(policy, output_dtype=torch.float32))
        self._root = gpt2
        sharded = dict(model.named_parameters())
        groups = [{**{k: v for k, v in group.items() if k != "params"},
                   "params": [sharded[n] for n in group_params]}
                  for group, group_params in zip(optimizer.param_groups, group_names)]
        rebuilt = type(optimizer)(groups, fused=optimizer.defaults.get("fused") or None)
        return model, rebuilt

    def no_sync(self, model):
        """Accumulation micro-steps: gradients accumulate unsharded, nothing reduce-scattered."""
        return self._no_gradient_sync() if self.world_size > 1 else super().no_sync(model)

    @contextlib.contextmanager
    def _no_gradient_sync(self):
        self._root.set_requires_gradient_sync(False)
        try:
            yield
        finally:
            self._root.set_requires_gradient_sync(True)

    def exposed_comm(self, phases, comm):
        if self.world_size == 1:
            return 0.0  # nothing sharded, nothing sent: a true zero
        # FSDP's all-gathers and reduce-scatters run inside forward and backward; nothing here
        # times them apart: unknown, not zero (harvest shows "-").
        return None

    def describe(self) -> str:
        if self.world_size == 1:
            return f"FSDP2 rank 0/1 on {self.device}: unsharded ({self.communication})"
        zero = "ZeRO-3" if self.reshard_after_forward else "ZeRO-2"
        return (f"FSDP2 ({zero}) rank {self.rank}/{self.world_size} on {self.device} "
                f"({self.communication})")


class HSDPStrategy(FSDPStrategy):
    """FSDP2 on a (replicate, shard) mesh: each node holds one sharded replica, its ranks
    reduce-scatter among themselves, and the replicas all-reduce across nodes."""

    def setup(self, env, timeout_s: int) -> None:
        per_node = env.local_world_size
        layout = env.layout()
        if per_node < 2 or any(n != per_node for n in layout):
            raise UsageError(
                f"strategy 'hsdp' shards within a node and needs 2 or more ranks on every node, "
                f"the same number on each (tasks per node here: {','.join(map(str, layout))}); "
                "use fsdp, or start more ranks per node")
        super().setup(env, timeout_s)
        self.mesh = init_device_mesh(self.device.type, (self.world_size // per_node, per_node),
                                     mesh_dim_names=("replicate", "shard"))

    def describe(self) -> str:
        replicas, shards = self.mesh.shape
        return (f"HSDP rank {self.rank}/{self.world_size}: {replicas} replica(s) x {shards} "
                f"shards on {self.device} ({self.communication})")
