"""Before queuing: will each cell fit in its GPU's memory (model state as its strategy shards
it, plus activations by Korthikanti et al.'s count)."""

from __future__ import annotations

from hpcdp.config import MODEL_PRESETS, ClusterProfile, model_context, vocab_size_of
from hpcdp.forecast.model import gpt2_shapes, state_bytes


def experiment_shapes(experiment) -> list[tuple]:
    """gpt2_shapes of a loaded experiment's model (its preset, vocabulary and context), without
    transformers: the submit-time memory check and the network probe's gradient size."""
    n_layer, n_embd, _, _ = MODEL_PRESETS[experiment.model.preset]
    return gpt2_shapes(n_layer, n_embd, vocab_size_of(experiment),
                       model_context(experiment.model.preset, experiment.train.seq_len))



def activation_bytes(n_layer: int, n_embd: int, n_head: int, seq: int, batch: int, vocab: int,
                     bytes_per_value: int, eager_attention: bool) -> float:
    """Activations one rank keeps for backward, per Korthikanti et al. 2022 (sbh(34 + 5as/h)
    per layer in 2-byte values; the 5as/h of the attention matrix only where attention is not
    fused), plus the logits and their gradient in fp32. An estimate: a campaign measures it."""
    per_layer = seq * batch * n_embd * (34 + (5 * n_head * seq / n_embd if eager_attention
                                              else 0))
    return n_layer * per_layer * bytes_per_value / 2 + 2 * seq * batch * vocab * 4


def memory_warnings(jobs, profile: ClusterProfile, experiment) -> list[str]:
    """One line per cell whose memory per rank, as estimated from the experiment alone (model
    state as its strategy shards it, plus activations by Korthikanti et al.'s count), exceeds
    the device memory of the profile's gpu_type: an out-of-memory said before queuing, not
    after hours in the queue. `hpcdp forecast` gives the figure a campaign measured."""
    from hpcdp import peaks

    memory = peaks.device_memory_gb(profile.gpu_type or "") if profile.gpus_per_node else None
    if not memory:
        return []
    n_layer, n_embd, n_head, _ = MODEL_PRESETS[experiment.model.preset]
    vocab, train = vocab_size_of(experiment), experiment.train
    shapes = experiment_shapes(experiment)
    lines = []
    for job in jobs:
        spec = job.strategy
        ranks = job.nodes * job.tasks_per_node
        state = state_bytes(spec.sharding, shapes, ranks, job.tasks_per_node) / 1e9
        acts = activation_bytes(n_layer, n_embd, n_head, train.seq_len, train.micro_batch_size,
                                vocab, 2 if spec.mixed_precision else 4,
                                experiment.model.attention == "eager") / 1e9
        if state + acts > memory:
            lines.append(f"hpcdp: warning: {spec.name} on {job.nodes} node(s) needs about "
                         f"{state + acts:.1f} GB per rank ({state:.1f} GB model state, "
                         f"~{acts:.1f} GB activations at micro-batch "
                         f"{train.micro_batch_size}), more than a {profile.gpu_type}'s "
                         f"{memory:.0f} GB: lower train.micro_batch_size (raise "
                         "grad_accum_steps to keep the batch), or use a sharded strategy")
    return lines
