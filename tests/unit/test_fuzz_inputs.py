"""Property-based fuzzing (hypothesis) of everything a user types: experiment and profile YAML
files, `--set` overrides and the CLI's flags. Whatever the input: a clean result or a one-line
UsageError (exit 2), never another exception; nothing half-written; no shell payload runs.
A fixed budget (max_examples) keeps the suite's time bounded."""

from __future__ import annotations

import contextlib
import io
import os
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hpcdp import cli, config
from hpcdp.errors import UsageError, one_line

FUZZ = settings(max_examples=150, deadline=None, derandomize=True,
                suppress_health_check=[HealthCheck.function_scoped_fixture])
PAYLOAD = "$(touch PWNED)`touch PWNED`;touch PWNED"

keys = st.sampled_from([
    "train.steps", "train.lr", "train.micro_batch_size", "train.seq_len", "train.amp_dtype",
    "train.checkpoint_every_s", "train.hang_floor_s", "model.preset", "data.corpus",
    "data.tokenizer", "matrix.nodes", "matrix.strategies", "cluster.time_limit",
    "cluster.signal_lead_s", "cluster.partition", "cluster.extra_sbatch", "cluster.env",
    "cluster.network_interface", "cluster.output_dir", "cluster.setup", "cluster.modules",
    "train", "bogus.key", "train.nope"])
values = st.one_of(
    st.integers(-5, 10**6).map(str), st.floats(allow_nan=True).map(str),
    st.sampled_from(["", "[]", "[1, 2]", "{}", "{A: b}", "null", "true", "auto", "gpt2-124m",
                     "tiny", "synthetic", "2", "0", "1-00:00:00", "^lo", "[--comment=a b]",
                     PAYLOAD, f"[{PAYLOAD}]", "x" * 300, "'", '"', "\n", "[single-gpu]"]),
    st.text(max_size=30))


@FUZZ
@given(st.lists(st.tuples(keys, values), max_size=4))
def test_set_overrides_load_or_fail_with_a_usage_error(pairs):
    overrides = [f"{k}={v}" for k, v in pairs]
    try:
        cluster_over, experiment_over = config.split_overrides(overrides)
        config.load_profile("local", cluster_over)
        config.load_experiment("smoke", experiment_over)
    except UsageError as exc:
        assert len(one_line(str(exc)).splitlines()) == 1  # what the CLI prints: one line


yaml_text = st.one_of(
    st.text(max_size=200),
    st.lists(st.tuples(keys, values), max_size=5).map(
        lambda kv: "\n".join(f"{k.split('.')[0]}:\n  {k.split('.')[-1]}: {v}" for k, v in kv)),
    st.sampled_from(["", "# only a comment\n", "- a\n- b\n", "train: 7\n", "{", "name: x\n"]))


@FUZZ
@given(yaml_text)
def test_experiment_and_profile_files_load_or_fail_with_a_usage_error(tmp_path, text):
    path = tmp_path / "input.yaml"
    path.write_text(text)
    for load in (config.load_experiment, config.load_profile):
        with contextlib.suppress(UsageError):
            load(str(path))


flags = st.lists(st.one_of(
    st.sampled_from(["--strategy", "-s", "--nodes", "-N", "--set", "--experiment", "--cluster",
                     "--out", "--stdout", "--fresh", "--scripts-dir", "ddp", "horovod",
                     "single-gpu", "2", "0", "-1", "x", "smoke", "local", PAYLOAD]),
    values), max_size=6)


@FUZZ
@given(st.sampled_from(["render", "submit", "run", "status", "harvest", "env", "strategies",
                        "nope"]), flags)
def test_cli_flags_never_traceback_write_nothing_on_error_and_run_no_payload(
        tmp_path, monkeypatch, command, argv):
    monkeypatch.chdir(tmp_path)
    if command in ("submit", "run"):
        argv = [*argv, "--dry-run"] if command == "submit" else ["--nodes", "x", *argv]
    if command == "render":
        argv = [*argv, "--stdout"]
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = cli.main([command, *argv])
        except SystemExit as exc:  # --help / --version
            code = exc.code
    assert code in (0, 1, 2, None), (command, argv, code)
    if code == 2:
        assert len(err.getvalue().strip().splitlines()) == 1, err.getvalue()
        assert not [p for p in tmp_path.rglob("*") if p.is_file()], "written on bad input"
    assert not list(Path(tmp_path).rglob("PWNED")) and not os.path.exists("PWNED")


def test_the_fuzzers_reach_both_outcomes():
    """A fuzzer whose every input fails (or passes) tests nothing: check both happen."""
    with pytest.raises(UsageError):
        config.load_experiment("smoke", config.split_overrides(["train.steps=-1"])[1])
    assert config.load_experiment("smoke", config.split_overrides(["train.steps=3"])[1])
