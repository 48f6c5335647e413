"""A seventh strategy is one file with its class and one registry entry: registered in a
temporary registry, a throw-away strategy renders to a script and trains, and nothing else in
hpcdp/ or train/ had to learn its name."""

from __future__ import annotations

import json
import sys
import textwrap

import pytest

from hpcdp import config, render, strategies

TOY = '''
import torch

from train.strategies import Strategy


class ToyStrategy(Strategy):
    """One process on the CPU, whatever the node has."""

    communication = "toy"

    def setup(self, env, timeout_s):
        self.device = torch.device("cpu")

    def describe(self):
        return "a toy strategy"
'''

SPEC = strategies.StrategySpec(
    name="toy-single", paper_name="(none: a test's)", implementation="toy_strategy:ToyStrategy",
    launch="one-per-node", mixed_precision=False, max_nodes=1, local_launcher="python",
    aliases=("toy",))


@pytest.fixture
def toy_module(tmp_path, monkeypatch) -> None:
    (tmp_path / "toy_strategy.py").write_text(textwrap.dedent(TOY))
    monkeypatch.syspath_prepend(str(tmp_path))
    yield
    sys.modules.pop("toy_strategy", None)


def test_a_registered_strategy_renders_and_trains(toy_module, tmp_path, capsys):
    from train import loop

    with strategies.registered(SPEC):
        assert strategies.get("toy") is SPEC and "toy-single" in strategies.NAMES
        profile, exp = config.load_profile("local"), config.load_experiment(
            "smoke", {"data": {"corpus": "synthetic"},
                      "train": {"steps": 3, "eval_interval": 0, "checkpoint_interval": 0},
                      "matrix": {"strategies": ["toy-single"]}})
        job = render.render_job(profile, exp, SPEC, 1, output_dir=str(tmp_path))
        assert "    --strategy toy-single\n" in job.text and "srun --nodes=1" in job.text
        summary = loop.run(exp, "toy", tmp_path / "run")
    assert summary["status"] == "completed" and summary["steps"] == 3
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").open()]
    assert records[0]["strategy"] == "toy-single" and records[0]["communication"] == "toy"
    assert records[0]["mechanism"] == "toy_strategy"
    assert "a toy strategy" in capsys.readouterr().out
    # The registry is back as it was.
    assert "toy-single" not in strategies.NAMES
    with pytest.raises(Exception, match="unknown strategy 'toy'"):
        strategies.get("toy")


def test_an_implementation_that_is_not_a_strategy_is_one_clear_error(toy_module):
    from hpcdp.errors import UsageError
    from train.strategies import create

    bad = strategies.StrategySpec(
        name="bad", paper_name="-", implementation="toy_strategy:torch", launch="one-per-node",
        mixed_precision=False, max_nodes=1, local_launcher="python")
    with pytest.raises(UsageError, match="toy_strategy:torch is not a train.strategies"):
        create(bad)


def test_every_shipped_implementation_names_a_strategy_class():
    from train.strategies import Strategy, create

    for spec in strategies.STRATEGIES:
        assert isinstance(create(spec), Strategy), spec.implementation
