"""hpcdp/forecast.py without a cluster: the collective costs against nccl-tests' definitions,
the probe fit, the state per rank as torch shards it, node-count parsing, and the model against
published figures (experiments/forecast-published.yaml)."""

from __future__ import annotations

import math

import pytest

from hpcdp import forecast
from hpcdp.errors import UsageError

NET = forecast.Network(intra_lat_s=2e-6, intra_busbw=100e9, inter_lat_s=10e-6, inter_busbw=20e9)


def test_collective_costs_follow_nccl_tests_factors_and_ring_steps():
    # one node, 8 ranks, 1 GB: latency 2(n-1) intra steps + bytes x 2(n-1)/n / busbw
    t = NET.collective_s("all_reduce", 1e9, 8, 1)
    assert t == pytest.approx(14 * 2e-6 + 1e9 * 14 / 8 / 100e9)
    # all-gather and reduce-scatter: n-1 steps, (n-1)/n
    t = NET.collective_s("all_gather", 1e9, 8, 1)
    assert t == pytest.approx(7 * 2e-6 + 1e9 * 7 / 8 / 100e9)
    # 4 nodes x 8: 2(nodes-1) of the 62 steps cross nodes, and the inter-node busbw applies
    t = NET.collective_s("all_reduce", 1e9, 32, 4, calls=3)
    assert t == pytest.approx(3 * (56 * 2e-6 + 6 * 10e-6) + 1e9 * 62 / 32 / 20e9)
    assert NET.collective_s("all_reduce", 1e9, 1, 1) == 0.0


def test_gloo_costs_a_reduce_scatter_as_an_all_reduce_and_broadcasts_from_the_root():
    """What the local cluster measured (docs/forecast.md): gloo's reduce-scatter took an
    all-reduce's time, its all-gather a ring's, and its broadcast one copy per rank beyond the
    root's node, in one step."""
    gloo = forecast.Network(intra_lat_s=2e-6, intra_busbw=100e9, inter_lat_s=10e-6,
                            inter_busbw=20e9, library="gloo")
    assert gloo.collective_s("reduce_scatter", 1e9, 4, 2) == NET.collective_s("all_reduce", 1e9,
                                                                              4, 2)
    assert gloo.collective_s("all_gather", 1e9, 4, 2) == NET.collective_s("all_gather", 1e9, 4, 2)
    # 2 nodes x 2: the root's node sends 2 copies over its link, one step of latency
    assert gloo.collective_s("broadcast", 1e9, 4, 2) == pytest.approx(10e-6 + 2 * 1e9 / 20e9)
    assert NET.collective_s("broadcast", 1e9, 4, 2) < gloo.collective_s("broadcast", 1e9, 4, 2)


TINY = forecast.Model(n_params=446_000, grad_bytes=1_784_000, param_gather_bytes=1_784_000,
                      units=3, block_share=0.7, tensors=28)


def test_a_shard_group_shards_within_it_and_all_reduces_across_its_replicas():
    """HSDP's shape at any group size: hsdp over a node is fsdp with a shard group of a node;
    fsdp sharded over 4 of 16 ranks gathers within the 4 (2 nodes) and all-reduces each
    shard over the 4 replicas; a group of every rank is plain fsdp."""
    from hpcdp import strategies

    fsdp, hsdp = strategies.get("fsdp"), strategies.get("hsdp")
    assert forecast.comm_terms(fsdp, TINY, NET, 4, 2, shard_group=2) \
        == forecast.comm_terms(hsdp, TINY, NET, 4, 2)
    assert forecast.comm_terms(fsdp, TINY, NET, 4, 2, shard_group=8) \
        == forecast.comm_terms(fsdp, TINY, NET, 4, 2)
    hybrid = forecast.comm_terms(fsdp, TINY, NET, 8, 2, shard_group=4)
    within = forecast.comm_terms(fsdp, TINY, NET, 2, 2)  # the same 4 ranks, on their own
    across = NET.collective_s("all_reduce", TINY.grad_bytes / 4, 4, 4, calls=TINY.units)
    assert hybrid.total == pytest.approx(within.total + across)
    assert hybrid.tail == within.tail


def test_the_step_parts_each_strategy_leaves_exposed():
    """Comm's three terms: DDP's last bucket is its tail and nothing is serial; FSDP on a GPU
    has its first gather and last reduce-scatter as tail, on a CPU every collective serial;
    ZeRO-1's broadcast (one call per tensor) is serial; one rank sends nothing."""
    from hpcdp import strategies

    ddp, fsdp, zero1 = (strategies.get(s) for s in ("distributed-ps", "fsdp", "zero1"))
    d = forecast.comm_terms(ddp, TINY, NET, 2, 2)
    assert d.serial == 0 and 0 < d.tail < d.total
    # 1,784,000 bytes: a first bucket of 1 MiB, then the rest (a last bucket of 735,424)
    assert d.tail == pytest.approx(NET.collective_s("all_reduce", 1_784_000 - (1 << 20), 4, 2))
    assert d.total == pytest.approx(NET.collective_s("all_reduce", 1_784_000, 4, 2))
    big = forecast.Model(**{**TINY.__dict__, "grad_bytes": 500 << 20})
    assert forecast._last_bucket(big.grad_bytes, 25 << 20, 1 << 20) == 24 << 20
    on_gpu = forecast.comm_terms(fsdp, TINY, NET, 2, 2, streams=True)
    on_cpu = forecast.comm_terms(fsdp, TINY, NET, 2, 2, streams=False)
    assert on_gpu.serial == 0 and on_gpu.tail > 0 and on_gpu.overlapped > 0
    assert on_cpu.serial == pytest.approx(on_gpu.total) and on_cpu.overlapped == on_cpu.tail == 0
    z = forecast.comm_terms(zero1, TINY, NET, 2, 2)
    assert z.serial == pytest.approx(NET.collective_s("broadcast", 1_784_000, 4, 2, calls=28))
    assert forecast.comm_terms(ddp, TINY, NET, 1, 1).total == 0
    # exposed: tail and serial always, the overlapped part beyond the window
    c = forecast.Comm(overlapped=3.0, tail=1.0, serial=2.0)
    assert (c.exposed(0.0), c.exposed(2.0), c.exposed(5.0)) == (6.0, 4.0, 3.0)
    assert c.exposed(5.0, scale=2.0) == 6.0 + 1.0


def test_a_fitted_step_gives_itself_back():
    """split_step then Comm.exposed at the same shape is the measured step, whether the
    exposed communication was measured (DDP) or not (FSDP)."""
    comm = forecast.Comm(overlapped=0.02, tail=0.01, serial=0.005)
    for exposed in (None, 0.0, 0.004, 0.02, 0.5):
        compute, window = forecast.split_step(0.2, comm, exposed, 2 / 3)
        assert compute + comm.exposed(window) == pytest.approx(0.2), exposed
    compute, window = forecast.split_step(0.2, comm, 0.02, 2 / 3)
    assert window == pytest.approx(0.01)  # 0.03 could hide, 0.02 was measured exposed
    # on a GPU the compute beside the overlapped collectives runs slower: still itself back
    gpu = forecast.Comm(overlapped=0.02, tail=0.01, serial=0.005, slowdown=0.189)
    for exposed, share in ((None, 2 / 3), (None, 0.05), (None, 1.0), (0.004, 2 / 3)):
        compute, window = forecast.split_step(0.2, gpu, exposed, share)
        assert compute + gpu.exposed(window) == pytest.approx(0.2), (exposed, share)


def test_hiding_a_collective_slows_the_compute_beside_it_on_a_gpu_only():
    """Lee et al. 2025 (arXiv 2507.03114) measured compute 18.9% slower beside a collective on
    A100/H100/MI250/MI210: the part of the overlapped collectives the window hides costs that
    much again. A CPU (no streams) runs nothing beside compute."""
    assert forecast.OVERLAP_SLOWDOWN == 0.189
    c = forecast.Comm(overlapped=3.0, tail=1.0, serial=2.0, slowdown=0.1)
    assert c.interference(2.0) == pytest.approx(0.2)  # 2 s of the 3 hid behind the window
    assert c.interference(5.0) == pytest.approx(0.3)  # all 3 hid
    assert c.exposed(5.0) == pytest.approx(3.0 + 0.3)
    from hpcdp import strategies

    fsdp, ddp = strategies.get("fsdp"), strategies.get("distributed-ps")
    for spec in (fsdp, ddp):
        assert forecast.comm_terms(spec, TINY, NET, 2, 2, streams=True).slowdown == 0.189
        assert forecast.comm_terms(spec, TINY, NET, 2, 2, streams=False).slowdown == 0.0
    # a GPU fit at 2 ranks carried to 16: the interference grows with the collectives it hides
    fit = _fit(device="cuda", exposed_s=None)
    args = dict(tokens=1e6, measured={}, billing_per_node_hour=None)
    near, far = (forecast.predict(fit, NET, n, 2, **args) for n in (1, 8))
    assert far.terms["interference_s"] > near.terms["interference_s"] > 0
    assert far.terms["interference_s"] == pytest.approx(
        0.189 * min(far.terms["overlapped_s"], far.terms["window_s"]))
    assert "18.9%" in far.sources["interference_s"]


def test_the_probe_fit_recovers_latency_and_bandwidth():
    # a synthetic 2-rank probe on 2 nodes: t = 2 steps x 50 us + bytes x 1 / 2 GB/s, +-1%
    sweep = [{"bytes": b, "median_s": (100e-6 + b / 2e9) * (1.01 if i % 2 else 0.99)}
             for i, b in enumerate(1024 * 4 ** k for k in range(9))]
    probe = {"communication": "gloo", "world_size": 2, "nodes": 2, "sweep": sweep}
    net = forecast.fit_network([probe], "gloo")
    assert net.inter_lat_s == pytest.approx(50e-6, rel=0.05)
    assert net.inter_busbw == pytest.approx(2e9, rel=0.05)
    assert net.intra_busbw == net.inter_busbw and "no one-node probe" in net.notes[0]
    assert 0.005 < net.spread < 0.05  # the +-1% residuals, seen
    assert forecast.fit_network([probe], "horovod-mpi") is None


def test_state_per_rank_shards_as_torch_does():
    shapes = forecast.gpt2_shapes(2, 128, 256, 128)
    total = sum(math.prod(s) for s in shapes)
    steps = len(shapes) * forecast.ADAM_STEP_BYTES
    assert forecast.state_bytes("replicated", shapes, 4, 4) == 16 * total + steps
    # FSDP: rank 0's dim-0 chunk of each tensor (ceil rows), every byte of it sharded
    assert forecast.state_bytes("full", shapes, 4, 4) == pytest.approx(16 * total / 4 + steps,
                                                                      rel=0.01)
    assert forecast.state_bytes("full", shapes, 1, 1) == 16 * total + steps
    # HSDP shards over a node's ranks only: 2 nodes x 2 = FSDP over 2
    assert forecast.state_bytes("in-node", shapes, 4, 2) == forecast.state_bytes("full", shapes,
                                                                                2, 2)
    # ZeRO-1: the greedy partition's fullest rank holds at least an even share of the moments
    zero1 = forecast.state_bytes("optimizer", shapes, 4, 4)
    assert 8 * total + 8 * total / 4 <= zero1 < 8 * total + 8 * total / 2


def test_node_counts_parse_and_bad_ones_are_named():
    assert forecast.parse_nodes("1,2,4") == [1, 2, 4]
    assert forecast.parse_nodes("1-128") == [1, 2, 4, 8, 16, 32, 64, 128]
    assert forecast.parse_nodes("3-3") == [3]
    for bad in ("0", "two", "-1", "1,x", "0-4", "1.5"):
        with pytest.raises(UsageError, match="is not a positive whole number"):
            forecast.parse_nodes(bad)
    # Issue 48: a reversed range is named as such, with the range meant.
    with pytest.raises(UsageError, match=r"--nodes '64-1' is a range from high to low; give "
                                         r"it low to high: 1-64"):
        forecast.parse_nodes("1,64-1")


def test_an_inter_node_figure_below_one_nic_is_named_as_the_likely_mistake():
    """47 GB/s on nodes of 8 H100 is one 400 Gb/s NIC's rate, where all_reduce_perf over 2+
    such nodes prints about the NICs' sum; 331 is not warned, nor 47 where the profile says its
    NICs are 100 Gb/s, nor a 1-GPU node, nor a GPU whose usual NIC is unknown."""
    from hpcdp.config import ClusterProfile, build

    def profile(gpus=8, gpu_type="h100", **network):
        net = {"intra_node_busbw_gbps": 370, "inter_node_busbw_gbps": 47, **network}
        return build(ClusterProfile, {"name": "big", "gpus_per_node": gpus,
                                      "gpu_type": gpu_type, "network": net}, "cluster")

    (line,) = forecast.network_warnings(profile())
    assert "inter_node_busbw_gbps 47 is below one 400 Gb/s NIC's line rate (50 GB/s)" in line
    assert "on nodes of 8 GPUs" in line and "\n" not in line
    (a100,) = forecast.network_warnings(profile(gpu_type="a100", inter_node_busbw_gbps=20))
    assert "below one 200 Gb/s NIC's line rate (25 GB/s)" in a100
    assert forecast.network_warnings(profile(inter_node_busbw_gbps=331)) == []
    assert forecast.network_warnings(profile(nic_gbit=100)) == []
    assert forecast.network_warnings(profile(gpus=1)) == []
    assert forecast.network_warnings(profile(gpu_type="mi300x")) == []


def test_the_ranking_calls_ahead_only_where_intervals_are_apart_and_memory_decides():
    def pred(strategy, value, low, high, flags=()):
        return forecast.Prediction(strategy, "bf16", 4, 32, tokens_per_s=value,
                                   tokens_per_s_low=low, tokens_per_s_high=high, step_s=1.0,
                                   exposed_s=0.0, hours=1.0, gpu_hours=32.0, flags=list(flags))

    fc = forecast.Forecast(source="x", nodes=[4], tokens=1e9, tokens_default=False, fits=[],
                           networks={}, notes=[], predictions=[
                               pred("fsdp", 100.0, 95.0, 105.0),
                               pred("distributed-ps", 103.0, 99.0, 108.0),   # overlaps fsdp
                               pred("zero1", 80.0, 75.0, 90.0),              # below both
                               pred("hsdp", 120.0, None, None),              # one run
                               pred("horovod", 130.0, 125.0, 135.0,
                                    ["exceeds 80 GB per GPU"])])
    rank = forecast.ranking(fc, 4)
    assert rank["ahead_of"] == {"distributed-ps bf16": ["zero1 bf16"], "fsdp bf16": ["zero1 bf16"]}
    assert ["distributed-ps bf16", "fsdp bf16"] in rank["cannot_tell_apart"]
    assert ["hsdp bf16", "zero1 bf16"] in rank["cannot_tell_apart"]  # no interval: no call
    assert rank["does_not_fit"] == {"horovod bf16": "exceeds 80 GB per GPU"}
    line = forecast.ranking_line(rank)
    assert line.startswith("ranking: distributed-ps bf16 predicted ahead of zero1 bf16; ")
    assert "can't tell apart at 4: hsdp bf16 and distributed-ps bf16" in line
    assert line.endswith("horovod bf16 does not fit (exceeds 80 GB per GPU): memory decides")
    assert line in forecast.render_text(fc) and forecast.as_json(fc)["ranking"] == [rank]


def test_the_model_reproduces_published_scaling_within_its_tolerance():
    checks = forecast.published_checks()
    torchtitan = [c for c in checks if c["case"].startswith("torchtitan")]
    assert len(torchtitan) == 1 and torchtitan[0]["published"] == 5605
    checked = [c for c in checks if c["checked"]]
    assert len(checked) >= 3
    for c in checked:
        assert abs(c["error"]) <= c["tolerance"], c
    # The sizes it is not held to are the ones docs/forecast.md explains (LL/tree protocols)
    assert all(c["error"] > 0 for c in checks if not c["checked"])


def test_published_series_are_predicted_from_their_smallest_scale_as_docs_say():
    """Issue 46: the published multi-scale series (experiments/forecast-published-series.yaml),
    each fitted at its smallest scale with the same per-GPU settings, predicted from 2x to 8x
    it. The figures are docs/forecast.md's ("Against published series"): a change to the model
    changes them, and the page with them."""
    rows = forecast.series_checks()
    summary = forecast.series_summary(rows)
    print(forecast.series_scale_table(rows))
    assert summary["series"] >= 10 and summary["sources"] >= 3
    assert {r["ratio"] for r in rows} == {2.0, 4.0, 8.0}
    assert all(r["low"] < r["high"] for r in rows)  # around what the others missed by
    assert (summary["series"], summary["sources"], summary["points"]) == (31, 3, 69)
    # the issue's goals: coverage at least 90%; 4x half-width at most 8%; median |error| at
    # most 2.5%; the largest at most 6% but in the two series docs/forecast.md names
    assert round(summary["coverage"], 2) == 0.91
    assert round(summary["median_half_width_4x"], 3) == 0.050
    assert round(summary["median_abs_error"], 3) == 0.018
    named = ("llmf-a10040gb-mpt1b-s2048-mb10-bf16", "dgxc-maxtext-h100-llama2-70b-s4096-mb2-fp8")
    assert max(abs(r["error"]) for r in rows if r["series"] not in named) < 0.06
    # and the goals not met: the largest error, and errors mostly on the optimistic side
    assert round(summary["largest_abs_error"], 3) == 0.183
    assert (summary["above"], summary["below"]) == (59, 10)
    # what the same-settings rule set aside: the points whose gradient accumulation or
    # sharding no other point of their series shares (llm-foundry's 8-GPU rows, mostly)
    aside = forecast.series_set_aside()
    assert len(aside) == 15 and ("dgxc-paxml-h100-gpt175b-s2048-mb2-fp8", 128) in aside
    # the JAX recipes' hybrid points are fitted and predicted among themselves, 128 GPUs a copy
    hybrid = [r for r in rows if r["series"] == "dgxc-maxtext-h100-llama2-70b-s4096-mb2-bf16"]
    assert [(r["fit_gpus"], r["gpus"]) for r in hybrid] == [(64, 128), (64, 256), (512, 1024),
                                                            (512, 2048)]
    everything = forecast.series_summary(forecast.series_checks(same_settings=False))
    assert (everything["points"], round(everything["coverage"], 2)) == (76, 0.89)
    assert round(everything["median_half_width_4x"], 3) == 0.139
    # every figure, with its interval, and the table per scale, as docs/forecast.md shows them
    from pathlib import Path

    docs = (Path(__file__).parents[2] / "docs" / "forecast.md").read_text()
    shown = docs.split("<!-- series-table -->\n")[1].split("<!-- /series-table -->")[0]
    assert shown == forecast.series_table(rows), "regenerate docs/forecast.md's series table"
    assert shown.count("\n") == 2 + summary["points"]
    scales = docs.split("<!-- series-scales -->\n")[1].split("<!-- /series-scales -->")[0]
    assert scales == forecast.series_scale_table(rows), "regenerate docs/forecast.md's scales"


def test_an_assumed_rank_spread_lowers_every_published_forecast_by_the_slowest_of_n():
    """bench/forecast_spread.py's question: were the published series' ranks' spread known,
    the slowest-of-N wait would lower every forecast beyond its fit, more the further out."""
    plain = forecast.series_checks()
    spread = forecast.series_checks(rank_spread=0.02)
    assert [(r["series"], r["gpus"]) for r in plain] == [(r["series"], r["gpus"]) for r in spread]
    assert all(b["predicted"] < a["predicted"] for a, b in zip(plain, spread))
    e = forecast.expected_max_normal
    for a, b in zip(plain, spread):  # the step grows by 0.02 x compute x (E[max N] - E[max N0])
        grown = a["predicted"] / b["predicted"] - 1
        assert 0 < grown <= 0.02 * (e(b["gpus"]) - e(b["fit_gpus"])) + 1e-9


def test_a_published_interval_comes_from_the_other_series_per_doubling():
    """The interval of a figure at ratio r is the conformal bounds of the OTHER series' errors
    per doubling (error / log2 ratio), times log2(r): its own error does not move it."""
    rows = [{"series": f"s{i}", "ratio": 2.0 if i % 2 else 4.0, "predicted": 100.0,
             "error": (0.01 * i if i % 2 else 0.02 * i)} for i in range(1, 22)]
    from hpcdp.forecast.published import _interval

    row = {"series": "new", "ratio": 8.0, "predicted": 100.0, "error": 0.5}
    low, high = _interval(row, rows)
    per_doubling = sorted(0.01 * i for i in range(1, 22))  # every other error, per doubling
    n = len(per_doubling)  # 21: the 1st and the 21st smallest (floor(1.1), ceil(20.9))
    assert (low, high) == (100 / (1 + per_doubling[n - 1] * 3), 100 / (1 + per_doubling[0] * 3))
    assert _interval(dict(row, error=-0.5), rows) == (low, high)
    assert _interval(row, rows[:9]) == (None, None)  # under 10 others: no interval


def test_submit_and_compare_warn_before_queuing_a_cell_that_cannot_fit(tmp_path):
    """A V100 (16 GB) with gpt2-100m at micro-batch 32 (~19 GB a rank); fsdp on 4 nodes shards
    the state but not the activations: still warned; micro-batch 4 fits and says nothing."""
    import subprocess
    import sys

    def run(*args):
        return subprocess.run([sys.executable, "-m", "hpcdp", *args, "--cluster", "generic-gpu",
                               "--experiment", "paper", "--set", "cluster.gpu_type=v100",
                               "--out", str(tmp_path), "--dry-run"],
                              capture_output=True, text=True, timeout=60, cwd=tmp_path)

    big = run("submit", "-s", "ddp", "-N", "1", "--set", "train.micro_batch_size=32")
    assert big.returncode == 0, big.stderr
    (line,) = [x for x in big.stderr.splitlines() if "GB per rank" in x]
    assert "distributed-ps on 1 node(s)" in line and "v100's 16 GB" in line
    assert "micro_batch_size" in line
    small = run("submit", "-s", "ddp", "-N", "1")
    assert "GB per rank" not in small.stderr
    campaign = run("compare", "--set", "train.micro_batch_size=32")
    assert campaign.stderr.count("GB per rank") >= 6  # every cell of the paper's matrix


def test_nccl_takes_the_tree_where_its_model_does_and_the_latency_is_shown_apart():
    """NCCL's cost model (src/graph/tuning.cc): an all-reduce across nodes takes the tree where
    it is faster: small messages on many nodes, whose ring pays 2(nodes-1) inter-node steps
    where the tree pays 2 log2(nodes). Large messages stay on the ring (the tree reaches 0.9 of
    the bus bandwidth at half the ring's bytes per step). MPI and gloo keep their rings."""
    seconds, latency, algorithm = NET.collective("all_reduce", 65536, 512, 64)
    tree_latency = 2 * (7 * 2e-6 + 6 * 10e-6)
    assert algorithm == "tree" and latency == pytest.approx(tree_latency)
    assert seconds == pytest.approx(tree_latency + 65536 * 2 / (0.9 * 20e9))
    ring_latency = (1022 - 126) * 2e-6 + 126 * 10e-6
    assert ring_latency > 10 * tree_latency
    big = NET.collective("all_reduce", 1e9, 16, 2)
    assert big[2] == "ring" and big[1] == pytest.approx(28 * 2e-6 + 2 * 10e-6)
    mpi = forecast.Network(**{**NET.__dict__, "library": "mpi"})
    assert mpi.collective("all_reduce", 65536, 512, 64)[1:] == (pytest.approx(ring_latency),
                                                                "ring")
    # the latency term: DDP's gradient in one 25 MiB bucket at 2 nodes x 2, one ring's latency
    from hpcdp import strategies

    ddp = strategies.get("distributed-ps")
    per_call = 4 * 2e-6 + 2 * 10e-6  # 6 steps, 2 of them across nodes
    assert forecast.latency_s(ddp, TINY, NET, 2, 2) == pytest.approx(per_call)
    assert forecast.latency_s(ddp, TINY, NET, 1, 1) == 0.0


def test_the_slowest_of_n_ranks_grows_with_n_from_the_ranks_measured_spread():
    e = forecast.expected_max_normal
    assert e(1) == 0.0
    assert e(2) == pytest.approx(1 / math.sqrt(math.pi), rel=1e-4)
    assert e(3) == pytest.approx(3 / (2 * math.sqrt(math.pi)), rel=1e-4)
    assert e(2) < e(8) < e(64) < e(1024) < 3.3
    assert forecast.straggler_s(0.1, 0.05, 8, 2) == pytest.approx(0.1 * 0.05 * (e(8) - e(2)))
    assert forecast.straggler_s(0.1, None, 8, 2) == 0.0


def _fit(**overrides) -> forecast.Fit:
    values = dict(strategy="distributed-ps", precision="fp32", communication="nccl", nodes=1,
                  ranks_per_node=2, step_s=[0.10, 0.11, 0.12], exposed_s=0.002,
                  forward_s=0.03, backward_s=0.06, phases_s=0.1, tokens_per_step=2048,
                  micro_batch=8, accum=1, scaling="weak", global_batch=16, model=TINY,
                  shapes=[], reshard_after_forward=True, state_gb=None, peak_gb=None,
                  memory_measured=None, device="cpu", rank_spread=0.05,
                  rank_spread_steps=30, rank_spread_source="2 ranks' work over 30 steps")
    return forecast.Fit(**{**values, **overrides})


def test_a_prediction_adds_the_slowest_rank_and_says_where_each_term_came_from():
    fit = _fit()
    args = dict(tokens=1e6, measured={}, billing_per_node_hour=None)
    same = forecast.predict(fit, NET, 1, 2, **args)
    assert same.terms["straggler_s"] == 0.0  # the fit's own ranks: already in its step
    assert same.step_s == pytest.approx(0.11, rel=1e-6)
    far = forecast.predict(fit, NET, 8, 2, **args)
    e = forecast.expected_max_normal
    assert far.terms["straggler_s"] == pytest.approx(0.05 * far.compute_s * (e(16) - e(2)))
    assert far.step_s == pytest.approx(far.compute_s + far.terms["straggler_s"]
                                       + far.exposed_s)
    assert set(far.sources) == set(far.terms)
    assert "5.0%" in far.sources["straggler_s"] and "30 steps" in far.sources["straggler_s"]
    assert far.allreduce_algorithm == "ring"
    # measured on a CPU, it does not carry to a GPU cluster
    gpu = forecast.predict(fit, NET, 8, 2, **args, target_device="cuda")
    assert gpu.terms["straggler_s"] == 0.0 and "not carried" in gpu.sources["straggler_s"]
    unmeasured = forecast.predict(_fit(rank_spread=None), NET, 8, 2, **args)
    assert unmeasured.terms["straggler_s"] == 0.0
    assert unmeasured.sources["straggler_s"].startswith("not measured")


def test_beyond_its_fit_the_interval_holds_the_models_known_error_per_doubling():
    """Issue 46, item 2: an interval made from the measured spreads and the model's known
    error. At the fit's own ranks only the spread; at 16 ranks (3 doublings beyond 2) the
    published series' error per doubling, x 3, widens it: the truth is the point / (1 + e)."""
    fit = _fit()
    args = dict(tokens=1e6, measured={}, billing_per_node_hour=None)
    plain = forecast.predict(fit, NET, 8, 2, **args)
    low, high = forecast.known_error_per_doubling()
    assert -0.05 < low < 0 < high < 0.1  # mostly optimistic, as docs/forecast.md says
    wide = forecast.predict(fit, NET, 8, 2, **args, known_error=(low, high))
    assert wide.tokens_per_s == plain.tokens_per_s and wide.known_error == (3 * low, 3 * high)
    assert wide.tokens_per_s_low == pytest.approx(plain.tokens_per_s_low / (1 + 3 * high))
    assert wide.tokens_per_s_high == pytest.approx(plain.tokens_per_s_high / (1 + 3 * low))
    assert wide.hours_high == pytest.approx(1e6 / wide.tokens_per_s_low / 3600)
    assert "3 doubling(s)" in wide.sources["known_error"]
    at_fit = forecast.predict(fit, NET, 1, 2, **args, known_error=(low, high))
    assert at_fit.known_error is None and "known_error" not in at_fit.sources
    assert at_fit.tokens_per_s_low == forecast.predict(fit, NET, 1, 2, **args).tokens_per_s_low
    # one run gives no interval to widen
    one = forecast.predict(_fit(step_s=[0.1]), NET, 8, 2, **args, known_error=(low, high))
    assert one.tokens_per_s_low is None and forecast.ONE_RUN in one.flags


def test_the_ranks_spread_is_read_from_the_step_records_and_lent_to_cells_without_one():
    from hpcdp.forecast import inputs

    def run(works: list[list[float]]) -> list[dict]:
        return [{"kind": "step", "step": i + 1, "rank_work_s": {
            "ranks": len(w), "mean": sum(w) / len(w),
            "sd": math.sqrt(sum((x - sum(w) / len(w)) ** 2 for x in w) / (len(w) - 1))}}
            for i, w in enumerate(works)]

    # the first half of each run is warm-up, left out; the later steps are 1.0 +- 0.1
    a = run([[5.0, 1.0]] * 2 + [[0.9, 1.1], [1.1, 0.9]])
    b = run([[0.9, 1.1]] * 2)
    spread, ranks, steps = forecast.rank_spread([a, b])
    assert (ranks, steps) == (2, 3)
    assert spread == pytest.approx(math.sqrt(3 * 2 * 0.01 / 3))  # sd 0.141 of a mean 1.0
    one = [{"kind": "step", "step": 1, "rank_work_s": None}] * 2
    assert forecast.rank_spread([one]) is None
    fits = [_fit(strategy="fsdp", rank_spread=None, rank_spread_steps=0),
            _fit(rank_spread=0.04, rank_spread_steps=10),
            _fit(strategy="horovod", rank_spread=0.08, rank_spread_steps=30)]
    inputs._borrow_rank_spread(fits)
    assert fits[0].rank_spread == pytest.approx((0.04 * 10 + 0.08 * 30) / 40)
    assert fits[0].rank_spread_source == ("borrowed from the campaign's distributed-ps, horovod "
                                          "cells: its own waits are not timed apart")
