"""Issue 22: the container lines of every template, per runtime, and the profile's refusals.

Apptainer and Pyxis cannot be installed here (Debian 12 has neither), so their scripts are
checked as golden files and by `bash -n`; Slurm's own OCI runtime runs for real in
tests/integration/test_containers.py.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from hpcdp import PROJECT_ROOT, config, render, strategies
from hpcdp.errors import UsageError

GOLDEN = Path(__file__).parent.parent / "golden" / "containers"
REGENERATE = "HPCDP_REGENERATE_GOLDEN=1 python -m pytest tests/unit/test_containers_render.py"


def _image(tmp_path: Path, runtime: str) -> Path:
    """An image where the profile wants one: a .sif file, or an OCI bundle folder."""
    if runtime == "oci":
        (tmp_path / "bundle").mkdir(exist_ok=True)
        (tmp_path / "bundle" / "config.json").write_text("{}")
        return tmp_path / "bundle"
    (tmp_path / "pytorch.sif").write_bytes(b"")
    return tmp_path / "pytorch.sif"


def _render(strategy: str, nodes: int, cluster: str, tmp_path: Path, *, campaign=False,
            **over) -> str:
    profile = config.load_profile(cluster, {"python": "/opt/venv/bin/python", **over})
    experiment = config.load_experiment("smoke")
    old = os.getcwd()
    os.chdir(tmp_path)  # the scripts cd into, and mount, the directory they were rendered from
    try:
        if campaign:
            from hpcdp import campaign as campaign_module

            text = campaign_module.plan(profile, experiment, output_dir="/runs").job.text
        else:
            text = render.render_job(profile, experiment, strategies.get(strategy), nodes,
                                     output_dir="/runs").text
    finally:
        os.chdir(old)
    return text.replace(str(tmp_path), "/WORKDIR").replace(str(PROJECT_ROOT), "/PROJECT")


def _container(tmp_path: Path, runtime: str, **fields) -> dict:
    image = fields.pop("image", None) or str(_image(tmp_path, runtime))
    return {"container": {"runtime": runtime, "image": image, **fields}}


CASES = {
    "ddp@apptainer-gpu": ("distributed-ps", 2, "apptainer-gpu", "apptainer", {}),
    "horovod@apptainer-gpu": ("horovod", 2, "apptainer-gpu", "apptainer", {}),
    "single-ps@apptainer-gpu": ("single-ps", 1, "apptainer-gpu", "apptainer",
                                {"mount_home": False, "env": {"HF_HOME": "/tmp/hf"}}),
    "ddp-torchrun@ngc-pyxis": ("distributed-ps", 2, "ngc-pyxis", "pyxis",
                               {"image": "nvcr.io#nvidia/pytorch:24.05-py3"}),
    "horovod@ngc-pyxis": ("horovod", 2, "ngc-pyxis", "pyxis",
                          {"image": "nvcr.io#nvidia/pytorch:24.05-py3",
                           "env": {"NCCL_IB_HCA": "mlx5"}}),
    "ddp@local-oci": ("distributed-ps", 2, "local", "oci", {}),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_container_golden_script(name, tmp_path, matches_golden):
    strategy, nodes, cluster, runtime, fields = CASES[name]
    over = _container(tmp_path, runtime, **fields)
    if "torchrun" in name:
        over["launcher"] = "torchrun"
    text = _render(strategy, nodes, cluster, tmp_path, **over)
    matches_golden(text, GOLDEN / f"{name}.sbatch", REGENERATE)
    script = tmp_path / "job.sbatch"
    script.write_text(text)
    subprocess.run(["bash", "-n", str(script)], check=True)
    # Every line that starts Python runs in the container, and nothing else does.
    python_lines = [line for line in text.splitlines() if '"$PYTHON"' in line]
    assert python_lines and all(line.lstrip().startswith("srun ") for line in python_lines)
    marker = '"${CONTAINER_EXEC[@]}" "$PYTHON"' if runtime != "pyxis" else '"${CONTAINER_SRUN[@]}"'
    assert all(marker in line for line in python_lines), python_lines


def test_a_campaign_prepares_its_data_inside_and_its_cells_launch_inside(tmp_path):
    text = _render("", 0, "apptainer-gpu", tmp_path, campaign=True,
                   **_container(tmp_path, "apptainer"))
    prepare = [line for line in text.splitlines() if "-m train prepare" in line]
    assert prepare == ['srun --nodes=1 --ntasks=1 --cpus-per-task="${SLURM_CPUS_ON_NODE:-1}" '
                       '"${CONTAINER_EXEC[@]}" "$PYTHON" -m train prepare --experiment '
                       '"$EXPERIMENT"']
    assert "CONTAINER_EXEC=(apptainer exec --nv --bind" in text


def test_the_apptainer_line_mounts_quotes_and_passes_what_the_job_needs(tmp_path):
    data = tmp_path / "my data's"
    data.mkdir()
    text = _render("distributed-ps", 2, "apptainer-gpu", tmp_path,
                   **_container(tmp_path, "singularity", mounts=[f"{data}:/data:ro"],
                                options=["--writable-tmpfs"], gpu="rocm"))
    line = next(line for line in text.splitlines() if line.startswith("CONTAINER_EXEC="))
    assert line.startswith("CONTAINER_EXEC=(singularity exec --rocm --bind ")
    for path in ("/WORKDIR", "/PROJECT", "/runs/smoke/distributed-ps-2n"):  # at their own paths
        assert f" --bind {path}:{path} " in line
    assert "--bind '/WORKDIR/my data'\"'\"'s:/data:ro'" in line
    assert "--env PYTHONPATH=/PROJECT" in line and "--pwd /WORKDIR --writable-tmpfs" in line
    assert line.endswith(" /WORKDIR/pytorch.sif)")
    assert "export HPCDP_CONTAINER='apptainer /WORKDIR/pytorch.sif'" in text


def test_without_a_container_the_scripts_have_no_container_lines(tmp_path):
    text = _render("distributed-ps", 2, "local", tmp_path)
    assert "CONTAINER" not in text
    assert 'srun --nodes=2 --ntasks=2 --ntasks-per-node=1 ${HPCDP_CAMPAIGN:+--exact} ' \
           '--kill-on-bad-exit=1 "$PYTHON" -m train' in text


def test_torchrun_port_in_the_shell_is_distenv_s(tmp_path):
    from hpcdp import distenv

    text = _render("distributed-ps", 2, "local", tmp_path, launcher="torchrun")
    line = next(line for line in text.splitlines() if line.lstrip().startswith("RDZV_PORT="))
    for job_id in ("1", "4288586", "99999999"):
        shell = subprocess.run(["bash", "-c", f"SLURM_JOB_ID={job_id}\n{line}\necho $RDZV_PORT"],
                               capture_output=True, text=True, check=True).stdout
        assert int(shell) == distenv.master_port_for_job(job_id)


@pytest.mark.parametrize("fields, fragment", [
    ({"runtime": "apptainer"}, "cluster.container.runtime 'apptainer' needs cluster.container"
                               ".image: a .sif file"),
    ({"runtime": "apptainer", "image": "/no/such.sif"}, "cluster.container.image "
                                                        "'/no/such.sif' does not exist"),
    ({"runtime": "pyxis", "image": "/no/such.sqsh"}, "'/no/such.sqsh' does not exist"),
    ({"runtime": "oci", "image": "/tmp"}, "'/tmp' has no config.json"),
    ({"runtime": "none", "image": "x.sif"}, "is set but cluster.container.runtime is 'none'"),
    ({"runtime": "docker"}, "cluster.container.runtime 'docker' is not valid"),
    ({"runtime": "pyxis", "image": "a#b", "mounts": ["/tmp:"]}, "mounts entry '/tmp:' must be"),
    ({"runtime": "pyxis", "image": "a#b", "mounts": ["data:/data"]}, "the source 'data' must "
                                                                     "be an absolute path"),
    ({"runtime": "pyxis", "image": "a#b", "mounts": ["/no/such:/d"]}, "the source '/no/such' "
                                                                      "does not exist"),
    ({"runtime": "pyxis", "image": "a#b", "mounts": ["/tmp:/a,/b"]}, "no comma"),
    ({"runtime": "pyxis", "image": "a#b", "mounts": ["/tmp:data"]}, "the target 'data' must "
                                                                     "be an absolute path"),
    ({"runtime": "apptainer", "image": "IMAGE", "options": ["--cleanenv"]},
     "would clear the SLURM_* variables"),
    ({"runtime": "singularity", "image": "IMAGE", "options": ["--containall"]},
     "'--containall' would clear the SLURM_* variables"),
    ({"runtime": "pyxis", "image": "a#b", "options": ["container-remap-root"]},
     "must be one option starting with '-'"),
    ({"runtime": "pyxis", "image": "a#b", "env": {"1X": "y"}}, "cluster.container.env key"),
    ({"runtime": "pyxis", "image": "a#b", "workdir": "work"}, "must be an absolute path"),
    ({"runtime": "pyxis", "image": "a#b", "imgae": "x"}, "did you mean 'image'"),
])
def test_a_bad_container_field_is_refused_at_load_time(fields, fragment, tmp_path):
    if fields.get("image") == "IMAGE" or "mounts" in fields and fields["runtime"] == "oci":
        fields = {**fields, "image": str(_image(tmp_path, fields["runtime"]))}
    with pytest.raises(UsageError, match=None) as err:
        config.load_profile("local", {"container": fields})
    assert fragment in str(err.value)
    assert "\n" not in str(err.value)


def test_oci_bundles_carry_their_own_mounts(tmp_path):
    with pytest.raises(UsageError, match="carries its mounts in its config.json"):
        config.load_profile("local", _container(tmp_path, "oci", mounts=["/tmp"]))


def test_the_cli_refuses_a_missing_image_in_one_line_and_writes_nothing(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "hpcdp", "render", "--cluster", "apptainer-gpu", "--strategy",
         "ddp", "--nodes", "2", "--out", str(tmp_path / "runs")],
        cwd=tmp_path, capture_output=True, text=True)
    assert result.returncode == 2, result.stderr
    assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr
    assert "'/shared/containers/hpcdp-pytorch.sif' does not exist" in result.stderr
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize("cluster, fields, fragment", [
    ("ngc-pyxis", ["cluster.container.mounts=['/tmp:']"],
     "mounts entry '/tmp:' must be SRC, SRC:DST or SRC:DST:OPTIONS"),
    ("ngc-pyxis", ["cluster.container.runtime=docker"],
     "cluster.container.runtime 'docker' is not valid; valid: none, apptainer, singularity, "
     "pyxis, oci"),
    ("apptainer-gpu", ["cluster.container.image=IMAGE", "cluster.container.options=[--cleanenv]"],
     "options entry '--cleanenv' would clear the SLURM_* variables"),
])
def test_the_cli_refuses_a_bad_container_field_in_one_line_and_writes_nothing(
        cluster, fields, fragment, tmp_path):
    """A bad mount, runtime or option: exit 2, one line naming the value, no run folder."""
    image = _image(tmp_path, "apptainer")  # so that only the field under test is wrong
    args = [arg for field in fields for arg in ("--set", field.replace("IMAGE", str(image)))]
    result = subprocess.run(
        [sys.executable, "-m", "hpcdp", "render", "--cluster", cluster, "--strategy", "ddp",
         "--nodes", "2", "--out", str(tmp_path / "runs"), *args],
        cwd=tmp_path, capture_output=True, text=True)
    assert result.returncode == 2, result.stderr
    assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr
    assert result.stderr.startswith("hpcdp: error: ") and fragment in result.stderr
    assert not (tmp_path / "runs").exists()


def test_horovod_over_mpi_with_oci_renders_its_pmix_line_inside(tmp_path):
    """Not refused (docs/containers.md#horovod-and-mpi-inside-a-container): Slurm 22.05's OCI
    steps keep PMIx's per-task variables out of the container, but later Slurm sets each task's
    container up itself, and the script is the same there."""
    text = _render("horovod", 2, "local", tmp_path, horovod_controller="mpi",
                   **_container(tmp_path, "oci"))
    ranks = [line.strip() for line in text.splitlines() if "-m train \"${TRAIN_ARGS[@]}\"" in line]
    assert len(ranks) == 1 and ranks[0].startswith('srun "${CONTAINER_SRUN[@]}" --mpi=pmix ')
    assert '"${CONTAINER_EXEC[@]}" "$PYTHON"' in ranks[0]
    assert "CONTAINER_SRUN=(--container=/WORKDIR/bundle)" in text
