"""What `hpcdp profile` reads from Slurm's node and partition fields (hpcdp/new_profile.py);
tests/integration/test_profile_from_slurm.py asks the local cluster."""

import pytest

from hpcdp import new_profile


@pytest.mark.parametrize("gres,expected", [
    ("(null)", (0, None)),
    ("", (0, None)),
    ("gpu:4", (4, None)),
    ("gpu:a100:4(S:0-1)", (4, "a100")),
    ("gpu:h100:8(S:0-1),nvme:1", (8, "h100")),
    ("nvme:1,gpu:v100:2", (2, "v100")),
    ("gpu:a100:2,gpu:a40:2", (4, None)),  # two types: no one type to ask for
])
def test_gpus_and_their_type_from_a_nodes_gres(gres, expected):
    assert new_profile.gpus_of(gres) == expected


def test_nodes_of_two_shapes_give_the_common_one_and_say_so():
    nodes = [{"CPUTot": "64", "Gres": "gpu:a100:4"}] * 3 + [{"CPUTot": "32", "Gres": "gpu:2"}]
    shape, notes = new_profile._node_shape(nodes)
    assert shape == {"cpus": 64, "gpus": 4, "gpu_type": "a100"}
    assert len(notes) == 1 and "3 of 4 have 64 CPUs and 4 GPU(s)" in notes[0]
    assert "32 CPUs, 2 GPU(s)" in notes[0]


@pytest.mark.parametrize("default,most,expected", [
    ("NONE", "UNLIMITED", "01:00:00"),
    ("04:00:00", "2-00:00:00", "04:00:00"),
    ("NONE", "00:30:00", "00:30:00"),  # never beyond the partition's MaxTime
    ("NONE", "1-00:00:00", "01:00:00"),
])
def test_the_time_limit_is_the_partitions_default_within_its_maximum(default, most, expected):
    limit, why = new_profile._time_limit({"DefaultTime": default, "MaxTime": most})
    assert limit == expected and f"MaxTime={most}" in why


@pytest.mark.parametrize("value", ["on", "1", "null", "yes", "1e3", "a100", "gpu-a100:x"])
def test_names_from_slurm_stay_strings_in_the_yaml(value):
    """A partition named `on` or `1` must not come back as a bool or a number."""
    from hpcdp import config

    assert config.load_yaml_text(f"partition: {new_profile._quoted(value)}") == {"partition": value}
