"""`hpcdp profile`: a cluster profile sketched from what Slurm says about one partition.

A new user's first file is the cluster profile, and its usual mistakes are facts Slurm already
knows: the partition's name, GPUs per node and their gres type, CPUs per node, how long a job
may run. This reads them (`scontrol show partition`, `show node`, `show config`) and writes a
profile that loads and renders as it is; what Slurm cannot tell from the login node (modules,
the environment to activate, the network interface between nodes, the account to charge) is
left unset, each with a comment saying what to put there.
"""

from __future__ import annotations

import collections
import datetime
import json
import os
import re
import socket
from pathlib import Path

from hpcdp import cluster, config, slurm
from hpcdp.errors import UsageError

DEFAULT_TIME = "01:00:00"
# gres entries as `scontrol show node` prints them: gpu:4, gpu:a100:4, gpu:a100:4(S:0-1)
_GPU_GRES = re.compile(r"(?:^|,)gpu(?::(?P<type>[^:(,]+))?:(?P<count>\d+)")


def gpus_of(gres: str) -> tuple[int, str | None]:
    """(GPUs, their type or None) in a node's Gres field; (0, None) for none."""
    found = [(int(m["count"]), m["type"]) for m in _GPU_GRES.finditer(gres or "")]
    if not found:
        return 0, None
    types = {t for _, t in found if t}
    return sum(c for c, _ in found), (types.pop() if len(types) == 1 else None)


def _node_shape(nodes: list[dict]) -> tuple[dict, list[str]]:
    """The most common (CPUs, GPUs, GPU type) of a partition's nodes, and a note naming the
    other shapes where nodes differ."""
    shapes = collections.Counter(
        (_whole(n.get("CPUTot", "")), *gpus_of(n.get("Gres", ""))) for n in nodes)
    (cpus, gpus, gpu_type), count = shapes.most_common(1)[0]
    notes = []
    if len(shapes) > 1:
        others = ", ".join(f"{c} CPUs, {g} GPU(s){' ' + t if t else ''}"
                           for (c, g, t), _ in shapes.most_common()[1:])
        notes.append(f"nodes differ: {count} of {len(nodes)} have {cpus} CPUs and {gpus} "
                     f"GPU(s); others: {others}. This profile is for the first kind: add "
                     "--constraint in extra_sbatch if the site tags them")
    return {"cpus": cpus, "gpus": gpus, "gpu_type": gpu_type}, notes


def _time_limit(fields: dict) -> tuple[str, str]:
    """(time_limit, why): the partition's DefaultTime where set, else an hour, never more than
    its MaxTime."""
    default, most = fields.get("DefaultTime", "NONE"), fields.get("MaxTime", "UNLIMITED")
    limit = default if slurm.parse_duration(default) else DEFAULT_TIME
    most_s = slurm.parse_duration(most)
    if most_s is not None and most_s < (slurm.parse_duration(limit) or 0):
        limit = most
    return limit, f"the partition's DefaultTime={default}, MaxTime={most}"


def _whole(text: str) -> int:
    return int(text) if text.isdigit() else 0


def _gpu_request() -> str:
    """`--gpus-per-node` where Slurm can place GPUs that way (select/cons_tres), else gres."""
    return "gpus-per-node" if slurm.select_type() == "select/cons_tres" else "gres"


def _partition(partition: str | None) -> tuple[dict, list[dict]]:
    """The partition's fields and its nodes'; UsageError naming the partitions there are."""
    found = slurm.partition_and_nodes(partition)
    if found is None:
        have = slurm.partition_names()
        if not have:
            raise UsageError("cannot ask Slurm about partitions here (scontrol and sinfo gave "
                             "nothing); run this on a login node, or set SLURM_CONF")
        which = f"no partition {partition!r}" if partition else "no default partition"
        raise UsageError(f"{which} on this cluster; partitions: {', '.join(have)} "
                         "(give one with --partition)")
    fields, nodes = found
    if not nodes:
        raise UsageError(f"partition {fields.get('PartitionName', partition)!r} has no nodes "
                         "Slurm can show (scontrol show node)")
    return fields, nodes


def sketch(partition: str | None, name: str | None = None) -> str:
    """The profile's YAML text for `partition` (None: the default one), checked by loading it
    as hpcdp will. UsageError naming the partitions there are when Slurm does not know it."""
    fields, nodes = _partition(partition)
    part = fields.get("PartitionName", partition or "")
    shape, notes = _node_shape(nodes)
    limit, limit_why = _time_limit(fields)
    gpus = shape["gpus"]
    conf = os.environ.get("SLURM_CONF")
    local = bool(conf) and Path(conf).resolve() == cluster.slurm_conf_path().resolve()
    accounts = fields.get("AllowAccounts", "ALL")
    lines = [
        f"# Sketched by `hpcdp profile` from what Slurm says about partition {part} "
        f"({socket.gethostname()}, {datetime.date.today().isoformat()}).",
        "# Read from Slurm: partition, time_limit, gpus_per_node, gpu_request, gpu_type,",
        "# cpus_per_task. Slurm cannot tell the rest from here: each is marked CHECK below.",
        *[f"# Note: {note}" for note in notes],
        *(["# This is the local cluster: the shipped profile `local` describes it whole."]
          if local else []),
        f"name: {_quoted(name or _profile_name(part))}",
        *(["local_cluster: true  # the cluster of `hpcdp cluster up`"] if local else []),
        f"partition: {_quoted(part)}",
        "account: null  # CHECK: the account to charge, where the site wants one"
        + (f" (allowed here: {accounts})" if accounts != "ALL" else ""),
        f'time_limit: "{limit}"  # {limit_why}',
        f"gpus_per_node: {gpus}",
    ]
    if gpus:
        lines += [
            f"gpu_request: {_gpu_request()}",
            f"gpu_type: {_quoted(shape['gpu_type']) if shape['gpu_type'] else 'null'}"
            + ("  # the nodes' gres type: --gres=gpu:TYPE:N" if shape["gpu_type"] else ""),
            f"cpus_per_task: {max(1, shape['cpus'] // gpus)}  # the node's {shape['cpus']} "
            f"CPUs shared by its {gpus} ranks",
        ]
    else:
        lines += [f"cpu_ranks_per_node: 1  # CPU nodes ({shape['cpus']} CPUs): ranks per node "
                  "for DDP and Horovod"]
    lines += [
        "# CHECK: what a job's shell needs first, e.g. [cuda/12.4, openmpi/4.1]",
        "modules: []",
        "# CHECK: e.g. ['source \"$HOME/venvs/hpcdp/bin/activate\"']",
        "setup: []",
        "# CHECK: the interface between nodes for NCCL and Gloo (ib0 for InfiniBand, else",
        f"# the Ethernet device `srun -p {part} -N1 ip -o addr` shows); unset, they pick one.",
        "network_interface: null",
    ]
    if gpus:
        lines += NETWORK_SKETCH
    text = "\n".join(lines) + "\n"
    config.build(config.ClusterProfile, config.load_yaml_text(text), "cluster")  # loads as is
    return text


# What Slurm cannot tell about a GPU partition's network, for `hpcdp forecast --cluster`.
NETWORK_SKETCH = [
    "# CHECK, for `hpcdp forecast --cluster` (docs/forecast.md, another cluster):",
    "# the busbw nccl-tests' all_reduce_perf prints at 8 GiB on one whole node (intra) and",
    "# on 2+ whole nodes (inter: about the sum of a node's NICs, not one NIC's rate; 331",
    "# on nodes of 8 H100 with 8 x 400 Gb/s).",
    "# network:",
    "#   intra_node_busbw_gbps: 370",
    "#   inter_node_busbw_gbps: 331",
    "#   intra_node_latency_us: 3.4",
    "#   inter_node_latency_us: 14",
]


def _quoted(value: str) -> str:
    """A YAML string that stays one (a partition named `on` or `1` is not a bool or a number):
    JSON's double-quoted strings are YAML's too."""
    return json.dumps(value)


def _profile_name(partition: str) -> str:
    """The partition's name as a profile name (letters, digits, '.', '_', '-')."""
    return re.sub(r"[^A-Za-z0-9._-]", "-", partition) or "cluster"
