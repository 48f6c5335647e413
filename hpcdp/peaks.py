"""Dense peak FLOP/s per device, for the MFU train/ reports and the campaign estimate hpcdp
makes before submitting (no torch: both sides read it)."""

from __future__ import annotations

import os

from hpcdp.errors import one_line, positive_number

# Vendor datasheets, SXM parts, no sparsity, for the precisions the strategies train in. fp32
# means plain fp32 (not TF32). Matched against the device name (or cluster.gpu_type).
PEAK_FLOPS: dict[str, dict[str, float | None]] = {
    "H200": {"fp32": 67e12, "fp16": 989e12, "bf16": 989e12},
    "H100": {"fp32": 67e12, "fp16": 989e12, "bf16": 989e12},
    "A100": {"fp32": 19.5e12, "fp16": 312e12, "bf16": 312e12},
    "V100": {"fp32": 15.7e12, "fp16": 125e12, "bf16": None},  # no bf16 on V100
}
OVERRIDE = "HPCDP_PEAK_FLOPS"


def training_flops_per_token(params: int, n_layer: int, n_embd: int, seq_len: int) -> int:
    """Training FLOPs per token: 6N + 12*L*d*T (Kaplan et al.; N without the position
    embeddings), for train/'s MFU and the estimate before submitting alike."""
    return 6 * params + 12 * n_layer * n_embd * seq_len


def peak_flops(device_name: str, precision: str) -> float | None:
    """Peak FLOP/s of one device, or None when unknown (CPUs, unlisted GPUs).

    HPCDP_PEAK_FLOPS (a number, FLOP/s per device) overrides the table, e.g. for a CPU node.
    """
    override = os.environ.get(OVERRIDE)
    if override:
        return peak_flops_override(override)
    key = known_gpu(device_name)
    return PEAK_FLOPS[key].get(precision) if key else None


def known_gpu(device_name: str) -> str | None:
    """The table's GPU that the name contains ("NVIDIA H100 80GB HBM3", "a100"), or None."""
    return next((key for key in PEAK_FLOPS if key in device_name.upper()), None)


def peak_flops_override(text: str) -> float:
    """HPCDP_PEAK_FLOPS as a positive finite number, else one line saying what is wanted."""
    return positive_number(text, f"{OVERRIDE}={one_line(text)!r} is not valid: give the peak "
                                 "FLOP/s of one device as a positive number, e.g. 3.12e14")


# Device memory (GB, 1e9 bytes, as nvidia-smi's GiB figures rounded the vendors' way): the
# smaller part where a name covers two (A100 40/80 GB, V100 16/32 GB) unless the name says 80 or
# 32. hpcdp forecast and the submit-time check compare a rank's forecast memory with it.
DEVICE_MEMORY_GB: dict[str, tuple[float, float]] = {
    "H200": (141.0, 141.0), "H100": (80.0, 80.0), "A100": (40.0, 80.0), "V100": (16.0, 32.0)}


def device_memory_gb(device_name: str) -> float | None:
    """Memory of one device of the table's GPUs, or None when unknown."""
    key = known_gpu(device_name or "")
    if key is None:
        return None
    small, large = DEVICE_MEMORY_GB[key]
    return large if str(int(large)) in device_name else small


# The line rate of each NIC on the usual node of each GPU (NVIDIA DGX H100/H200: 8 x 400 Gb/s
# ConnectX-7; DGX A100: 8 x 200 Gb/s HDR; DGX-2 V100: 100 Gb/s EDR), for the warning when a
# profile's inter-node bus bandwidth is below even one of them (docs/forecast.md).
NODE_NIC_GBIT: dict[str, float] = {"H200": 400.0, "H100": 400.0, "A100": 200.0, "V100": 100.0}


def node_nic_gbit(device_name: str) -> float | None:
    key = known_gpu(device_name or "")
    return NODE_NIC_GBIT[key] if key else None
