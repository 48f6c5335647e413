"""hpcdp forecast on the local cluster: a real campaign of DDP, Horovod and fsdp on 1
and 2 nodes, 2 ranks per node, with its network probes. Fitted on the 1-node cells and the
probes only, the forecast of the 2-node cells is held against what they measured; fitted on
both, it reproduces them. State per rank is forecast from the model's shapes alone and checked
against what every cell measured; billing against what sacct billed; bad input is one line and
exit 2."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from hpcdp import forecast

pytestmark = pytest.mark.slurm

def hpcdp(*args: str, cwd: Path, timeout: int = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "hpcdp", *args], cwd=cwd, capture_output=True,
                          text=True, timeout=timeout, env=dict(os.environ))


@pytest.fixture(scope="module")
def campaign(two_node_campaign) -> Path:
    """tests/conftest.py's campaign, which test_compare.py reads too."""
    return two_node_campaign["folder"]


def forecast_json(folder: Path, *args: str) -> dict:
    done = hpcdp("forecast", str(folder), "--format", "json", *args, cwd=folder)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_fitted_on_one_node_it_predicts_the_two_node_cells(campaign):
    """Issue 45's held-out forecast on a real campaign: fitted on the 1-node cells (2 ranks
    each, so each does its strategy's own communication, inside its node) and the probes only,
    the 2-node predictions carry their terms, which add up to the step; on a CPU FSDP's
    collectives are serial (what was missing when fsdp was predicted +52%; ZeRO-1's broadcast
    is checked in tests/unit/test_forecast.py); the fitted cells come back; the ranking speaks
    as the verdict does.

    How close the predictions come is a speed measurement, so it is bench/forecast_held_out.py's
    on a machine left to it (docs/forecast.md: every strategy within 11% at 1 Gbit/s and
    250 Mbit/s), not this test's: here the campaign runs beside two other pytest processes on
    the same two cores, and three suite runs saw DDP's prediction off by -24%, +21% and +78%
    as the load moved between its 1-node and 2-node cells. The report is printed."""
    result = forecast_json(campaign, "--fit-nodes", "1", "--nodes", "1,2,4")
    assert {f["nodes"] for f in result["fits"]} == {1}
    assert {f["ranks_per_node"] for f in result["fits"]} == {2}
    assert set(result["networks"]) >= {"gloo"}  # DDP's transport, fitted on its probes
    two = {p["strategy"]: p for p in result["predictions"] if p["nodes"] == 2}
    assert set(two) >= {"distributed-ps", "fsdp"}
    report = {s: f"predicted {p['tokens_per_s']:.0f} [{p['tokens_per_s_low']:.0f}-"
                 f"{p['tokens_per_s_high']:.0f}], measured {p['measured']:.0f} "
                 f"[{p['measured_range'][0]:.0f}-{p['measured_range'][1]:.0f}] "
                 f"({p['tokens_per_s'] / p['measured'] - 1:+.1%}) {p['terms']}"
              for s, p in two.items()}
    print(report)
    for name, p in two.items():
        assert p["tokens_per_s"] > 0 and p["measured"] > 0, report[name]
        assert p["tokens_per_s_low"] <= p["tokens_per_s"] <= p["tokens_per_s_high"]
        assert not any(f.startswith("fitted at 1 rank") for f in p["flags"])
        terms = p["terms"]
        assert set(terms) | {"known_error"} == {
            "compute_s", "straggler_s", "window_s", "overlapped_s", "tail_s", "serial_s",
            "interference_s", "latency_s", "known_error"} == set(p["sources"])
        assert terms["interference_s"] == 0  # a CPU runs nothing beside its compute
        # one doubling beyond the 1-node fit: the interval holds the model's known error
        assert p["known_error"] == pytest.approx(list(forecast.known_error_per_doubling()))
        exposed = terms["tail_s"] + terms["serial_s"] + max(0.0, terms["overlapped_s"]
                                                           - terms["window_s"])
        assert p["step_s"] == pytest.approx(terms["compute_s"] + terms["straggler_s"] + exposed)
        comm = terms["overlapped_s"] + terms["tail_s"] + terms["serial_s"]
        assert 0 <= terms["latency_s"] <= comm
    assert any("the model's known error on published series" in n for n in result["notes"])
    # The slowest of 4 ranks waits longer than the slowest of the 2 the fit measured: DDP's and
    # Horovod's ranks timed their own work; fsdp's did not, and borrows their spread
    fits = {f["strategy"]: f for f in result["fits"]}
    assert fits["distributed-ps"]["rank_spread"] > 0
    assert fits["distributed-ps"]["rank_spread_source"].startswith("2 ranks' work over")
    assert fits["fsdp"]["rank_spread_source"].startswith("borrowed from the campaign's ")
    assert all(p["terms"]["straggler_s"] > 0 for p in two.values()), report
    # The ranking at 2 nodes: overlapping intervals can't be told apart, the others are ahead
    rank = next(r for r in result["ranking"] if r["nodes"] == 2)
    for a in two.values():
        for b in two.values():
            if a["tokens_per_s"] <= b["tokens_per_s"]:
                continue
            pair = [f"{a['strategy']} fp32", f"{b['strategy']} fp32"]
            if a["tokens_per_s_low"] > b["tokens_per_s_high"]:
                assert pair[1] in rank["ahead_of"][pair[0]], rank
            else:
                assert pair in rank["cannot_tell_apart"], rank
    assert two["fsdp"]["terms"]["serial_s"] > 0 and two["fsdp"]["terms"]["overlapped_s"] == 0
    assert two["distributed-ps"]["terms"]["serial_s"] == 0
    one = [p for p in result["predictions"] if p["nodes"] == 1]
    for p in one:  # the cells it was fitted on: their own medians back
        assert p["tokens_per_s"] == pytest.approx(p["measured"], rel=0.02), p
    four = [p for p in result["predictions"] if p["nodes"] == 4 and p["tokens_per_s"]]
    assert four and all("extrapolated" in p["flags"] for p in four)


def test_fitted_on_two_nodes_it_reproduces_them(campaign):
    """The default fit: each strategy's largest node count, where its own work was measured."""
    result = forecast_json(campaign, "--nodes", "2")
    for p in result["predictions"]:
        low, high = p["measured_range"]
        assert low * 0.9 <= p["tokens_per_s"] <= high * 1.1, p
        assert not any(f.startswith("fitted at 1 rank") for f in p["flags"])


def test_state_per_rank_is_forecast_within_two_percent(campaign):
    result = forecast_json(campaign, "--nodes", "1,2")
    measured = {}
    for record in (campaign / "campaign.json",):
        for cell in json.loads(record.read_text())["cells"]:
            lines = (Path(cell["run_dir"]) / "metrics.jsonl").read_text().splitlines()
            summary = json.loads(lines[-1])
            assert summary["kind"] == "summary"
            state = sum(summary["memory"][k] for k in ("params_bytes", "grads_bytes",
                                                       "optimizer_bytes"))
            measured[(cell["strategy"], cell["nodes"])] = state / 1e9
    for p in result["predictions"]:
        key = (p["strategy"], p["nodes"])
        if key in measured:
            assert p["state_gb"] == pytest.approx(measured[key], rel=0.02), key


def test_the_table_names_what_it_is_and_the_plot_is_written(campaign, tmp_path):
    done = hpcdp("forecast", str(campaign), "--nodes", "1-8", "--tokens", "1e9", "--out",
                 str(tmp_path / "fc"), cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "Predicted, not measured" in done.stdout and "network gloo" in done.stdout
    assert "fit residuals" in done.stdout and "8 node(s):" in done.stdout
    assert not re.search(r"\b(wins|winner|faster than)\b", done.stdout)  # not a verdict
    # CPU ranks on their own cluster: counted as ranks, not GPUs
    assert re.search(r"^strategy +prec +ranks +tokens/s predicted \[interval\] +tok/s/rank .*"
                     r"rank-h / billing", done.stdout, re.M), done.stdout
    written = sorted(p.name for p in (tmp_path / "fc").iterdir())
    assert written == ["forecast.json", "forecast.md", "forecast.png"]
    assert (tmp_path / "fc" / "forecast.png").stat().st_size > 10_000


def test_one_run_without_probes_shows_what_it_can_and_no_false_interval(campaign, tmp_path):
    """Pointed at one run of the campaign (one repeat, no network probe beside it), as a user
    does after `hpcdp submit`: one run shows no spread, so no interval of zero width; the node
    count it ran on gives its own measurement back (its collectives are in its step), though
    nothing can be forecast elsewhere without network figures; the node counts where nothing
    is forecast are one line, not a table of dashes each."""
    cells = json.loads((campaign / "campaign.json").read_text())["cells"]
    run = next(Path(c["run_dir"]) for c in cells
               if (c["strategy"], c["nodes"], c["repeat"]) == ("distributed-ps", 2, 1))
    result = forecast_json(run, "--nodes", "1,2,4,8")
    by_nodes = {p["nodes"]: p for p in result["predictions"]}
    one, two = by_nodes[1], by_nodes[2]
    assert two["tokens_per_s"] == pytest.approx(two["measured"], rel=0.01), two
    assert two["tokens_per_s_low"] is None and two["hours_low"] is None
    assert any(f.startswith("1 run: no interval") for f in two["flags"]), two
    assert one["tokens_per_s"] is None and one["measured"] is None, one
    assert "no network figures" in one["why_none"]
    assert any("no network probe in this folder" in n for n in result["notes"])
    done = hpcdp("forecast", str(run), "--nodes", "1,2,4,8", "--out", str(tmp_path / "fc"),
                 cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert re.search(r"^2 node\(s\):", done.stdout, re.M), done.stdout
    assert not re.search(r"^(1|4|8) node\(s\):", done.stdout, re.M)  # no table of dashes
    assert re.search(r"^not forecast at 1, 4, 8 node\(s\): distributed-ps fp32: no network",
                     done.stdout, re.M), done.stdout
    assert (tmp_path / "fc" / "forecast.png").stat().st_size > 10_000  # a plot without bands


def test_a_profile_giving_one_nics_rate_is_warned_once_and_still_forecast(campaign, tmp_path):
    profile = tmp_path / "big.yaml"
    profile.write_text("name: big\ngpus_per_node: 8\ngpu_type: h100\nnetwork:\n"
                       "  intra_node_busbw_gbps: 370\n  inter_node_busbw_gbps: 47\n")
    done = hpcdp("forecast", str(campaign), "--cluster", str(profile), "--nodes", "1,16",
                 "--format", "json", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    (warning,) = done.stderr.splitlines()
    assert warning.startswith("hpcdp: warning: cluster profile 'big': network."
                              "inter_node_busbw_gbps 47 is below one 400 Gb/s NIC's"), warning
    assert any("below one 400 Gb/s NIC" in n for n in json.loads(done.stdout)["notes"])
    profile.write_text(profile.read_text().replace(": 47", ": 331"))
    done = hpcdp("forecast", str(campaign), "--cluster", str(profile), "--nodes", "1,16",
                 cwd=tmp_path)
    assert done.returncode == 0 and "warning" not in done.stderr, done.stderr
    assert re.search(r"^strategy +prec +GPUs .* tok/s/GPU .* GPU-h / billing", done.stdout,
                     re.M), done.stdout  # a GPU cluster's forecast counts GPUs


def test_bad_input_is_one_line(campaign, tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    profile = tmp_path / "target.yaml"
    profile.write_text("name: target\ngpus_per_node: 8\ngpu_type: h100\n")
    cases = [
        (["forecast", str(empty)], "no metrics.jsonl found"),
        (["forecast", str(tmp_path / "missing")], "is not a folder"),
        (["forecast", str(campaign), "--nodes", "0"], "'0' is not a positive whole number"),
        (["forecast", str(campaign), "--nodes", "2,x"], "'x' is not a positive whole number"),
        (["forecast", str(campaign), "--fit-nodes", "8"], "finished cells on 1,2 node(s) only"),
        (["forecast", str(campaign), "--cluster", str(profile)], "has no network figures"),
        (["forecast", str(campaign), "--tokens", "lots"], "not a positive number of tokens"),
        (["forecast", str(campaign), "--format", "xml"], "give table, markdown or json"),
    ]
    for args, says in cases:
        done = hpcdp(*args, cwd=tmp_path)
        assert done.returncode == 2, (args, done.stdout, done.stderr)
        assert done.stderr.count("\n") == 1 and says in done.stderr, (args, done.stderr)
        assert "Traceback" not in done.stderr and not done.stdout


def test_billing_is_the_partitions_weights_and_matches_what_sacct_billed(two_node_campaign):
    """The local gpu partition bills CPU=3.0 and debug CPU=2.0 (scripts/local-slurm.sh); a
    cluster started before those lines bills Slurm's default, 1 per CPU: either way the
    forecast's rate must be what sacct billed the campaign's own (exclusive) job. The campaign
    was submitted with the local profile (partition debug) and `--set cluster.partition=gpu`:
    the weights are those of the partition its job ran in, as sacct says."""
    campaign = two_node_campaign["folder"]
    result = forecast_json(campaign, "--nodes", "1,2")
    billing = result["billing"]
    assert billing is not None and billing["partition"] == two_node_campaign["partition"]
    weight = (billing["weights"] or {"cpu": 1.0})["cpu"]
    rate = weight * billing["cpus_per_node"]
    job = billing["campaign_job"]
    assert job["billing"] == pytest.approx(rate * job["nodes"])
    assert job["energy_j"] is None  # no AcctGatherEnergyType here: "not recorded"
    for p in result["predictions"]:
        if p["hours"] is not None:
            assert p["billing"] == pytest.approx(rate * p["nodes"] * p["hours"])
            assert p["gpu_hours"] == pytest.approx(p["hours"] * p["gpus"])
