"""Config loading: types, fix-it errors, overrides, shipped files."""

import pytest

from hpcdp import config
from hpcdp.errors import UsageError


def test_overrides_reach_every_section():
    cluster, experiment = config.split_overrides(
        ["cluster.partition=a100", "train.steps=7", "matrix.nodes=[1,2,8]", "train.lr=2e-3"])
    profile = config.load_profile("local", cluster)
    exp = config.load_experiment("smoke", experiment)
    assert profile.partition == "a100"
    assert exp.train.steps == 7 and exp.matrix.nodes == [1, 2, 8]
    assert exp.train.lr == pytest.approx(2e-3)  # YAML 1.1 reads 2e-3 as a string


def test_repeated_matrix_entries_render_once():
    exp = config.load_experiment("smoke", {"matrix": {"strategies": ["ddp", "distributed-ps"],
                                                      "nodes": [1, 2, 1]}})
    assert exp.matrix.strategies == ["distributed-ps"] and exp.matrix.nodes == [1, 2]


def test_aliases_are_canonicalised_in_the_matrix():
    exp = config.load_experiment("smoke", {"matrix": {"strategies": ["ddp", "dp", "ddp-apex"]}})
    assert exp.matrix.strategies == ["distributed-ps", "single-ps", "distributed-ps-apex"]


@pytest.mark.parametrize("over,fragment", [
    ({"train": {"lr": 1e-3, "min_lr": 1e-2}}, "min_lr"),
    ({"train": {"micro_batch_size": 0}}, "train.micro_batch_size 0 must be >= 1"),
    ({"data": {"tokenizer": "bpe"}}, "data.vocab_size is required"),
    ({"data": {"val_fraction": 0.9}}, "data.val_fraction"),
    ({"train": {"compile": "yes"}}, "expected bool"),
    ({"name": "bad name"}, "experiment name 'bad name'"),
    ({"model": {"preset": "gpt2-100m"}, "train": {"seq_len": 600}}, "context 512"),
    ({"train": {"seed": -1}}, "train.seed -1"),
    ({"data": {"vocab_size": 300}}, "data.vocab_size 300 does not match"),
    ({"train": {"lr": float("nan")}}, "train.lr nan must be a finite number"),
    ({"model": {"dropout": 1.5}}, "model.dropout 1.5"),
    ({"train": {"amp_backend": "apex", "amp_dtype": "bf16"}}, "fp16 only"),
    ({"train": {"scaling": "strong"}}, "train.scaling=strong needs train.global_batch_size"),
    ({"train": {"scaling": "strong", "global_batch_size": 12}}, "multiple of train.micro_batch"),
    ({"train": {"scaling": "linear"}}, "weak, strong"),
    ({"compare": {"repeats": 0}}, "compare.repeats 0 must be >= 1"),
])
def test_impossible_experiments_name_field_and_value(over, fragment):
    with pytest.raises(UsageError, match=None) as info:
        config.load_experiment("smoke", over)
    assert fragment in str(info.value)


@pytest.mark.parametrize("over,fragment", [
    ({"gpus_per_node": -1}, "cluster.gpus_per_node -1 must be >= 0"),
    ({"gpu_request": "gpu"}, "'gpu'"),
    ({"extra_sbatch": ["--ok", "no-dash"]}, "'no-dash'"),
    ({"env": {"1BAD": "x"}}, "'1BAD'"),
    ({"horovod_controller": "nccl"}, "mpi, gloo"),
])
def test_impossible_profiles_name_field_and_value(over, fragment):
    with pytest.raises(UsageError) as info:
        config.load_profile("local", over)
    assert fragment in str(info.value)


def test_profile_found_by_path(tmp_path):
    path = tmp_path / "mine.yaml"
    path.write_text("name: mine\npartition: gpu\ngpus_per_node: 8\n")
    profile = config.load_profile(str(path))
    assert profile.devices_per_node() == 8 and profile.partition == "gpu"


@pytest.mark.parametrize("text", ["4:00:00", "04:00:00", "1-12:00:00"])
def test_unquoted_slurm_times_stay_times(tmp_path, text):
    # Plain YAML 1.1 reads 4:00:00 as the base-60 integer 14400, which Slurm would take as
    # minutes (ten days). hpcdp's loader keeps it a string.
    path = tmp_path / "p.yaml"
    path.write_text(f"time_limit: {text}\n")
    assert config.load_profile(str(path)).time_limit == text
    cluster, _ = config.split_overrides([f"cluster.time_limit={text}"])
    assert config.load_profile("local", cluster).time_limit == text


def test_strong_scaling_derives_the_accumulation_per_replica_count():
    exp = config.load_experiment("smoke", {"train": {"scaling": "strong",
                                                     "global_batch_size": 32}})
    assert [exp.train.accum_steps(n) for n in (1, 2, 4)] == [4, 2, 1]
    with pytest.raises(UsageError, match="not a multiple of 24 sequences per micro-step"):
        exp.train.accum_steps(3)
    weak = config.load_experiment("smoke", {"train": {"grad_accum_steps": 3}})
    assert [weak.train.accum_steps(n) for n in (1, 2, 4)] == [3, 3, 3]


def test_a_node_count_that_does_not_divide_the_global_batch_is_refused_naming_those_that_do():
    from hpcdp import render, strategies

    profile = config.load_profile("local")
    exp = config.load_experiment("smoke", {"train": {"scaling": "strong",
                                                     "global_batch_size": 32}})
    with pytest.raises(UsageError, match=r"distributed-ps on 3 node\(s\).*node counts that "
                                         r"work: 1, 2, 4$"):
        render.render_job(profile, exp, strategies.get("ddp"), 3)
    render.render_job(profile, exp, strategies.get("ddp"), 4)  # 4 replicas x 8 = 32: fine
