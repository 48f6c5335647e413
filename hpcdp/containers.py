"""Running a job's steps inside a container image: what each runtime adds to the srun lines.

A runtime contributes two lists of shell words (already quoted), which the templates put on
every srun line that starts Python (ranks, probes, the data preparation):

    srun "${CONTAINER_SRUN[@]}" --nodes=... "${CONTAINER_EXEC[@]}" "$PYTHON" -m train ...

- apptainer / singularity: nothing for srun; `apptainer exec --bind ... IMAGE` before Python.
- pyxis: srun's own --container-image, --container-mounts and --container-workdir.
- oci: srun's own --container=BUNDLE (Slurm's OCI support, oci.conf on the nodes); the bundle
  carries its mounts, and `env --chdir` starts Python in the working directory, which Slurm
  22.05 does not pass into the bundle.

The image brings the software (torch, transformers, Horovod); the project comes from the
checkout, mounted at its own path and put first on PYTHONPATH, so that the code in the image is
the code that rendered the script. See docs/containers.md.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from pathlib import Path

from hpcdp import PROJECT_ROOT
from hpcdp.config import ClusterProfile, ContainerConfig, Experiment, looks_like_path

# Exported in the job so that `hpcdp env` and the metrics header say where a rank runs.
MARKER = "HPCDP_CONTAINER"


@dataclass(frozen=True)
class ContainerLaunch:
    runtime: str
    image: str
    srun_words: list[str]
    exec_words: list[str]
    exports: list[tuple[str, str]]
    mounts: list[tuple[str, str, str]]


def _q(word: str) -> str:
    return shlex.quote(word)


def default_mounts(experiment: Experiment, run_dir: Path, workdir: Path) -> list[Path]:
    """The paths a job reads and writes, each mounted at its own path: the working directory
    (relative data paths start there), the project (the code), the run folder, and the data
    where it lies elsewhere. A path inside another one is left out."""
    paths = [workdir, PROJECT_ROOT, run_dir]
    for value in (experiment.data.corpus, experiment.data.gpt2_files,
                  experiment.data.prepared_dir):
        if not value:
            continue
        path = Path(value).expanduser()
        path = path if path.is_absolute() else workdir / path
        if path.exists():
            paths.append(path)
        elif path.parent.exists() and path.parent != Path("/"):
            paths.append(path.parent)  # a prepared folder that the first job creates
    # In the order listed, never sorted or from a set: the script must not depend on where the
    # checkout lies or on the hash seed (a CI checkout deeper than here reordered them once).
    unique = list(dict.fromkeys(p.absolute() for p in paths))
    return [p for p in unique if not any(other in p.parents for other in unique)]


def launch(profile: ClusterProfile, experiment: Experiment, run_dir: Path,
           workdir: Path) -> ContainerLaunch | None:
    """How the job's steps enter the profile's container; None without one."""
    c: ContainerConfig = profile.container
    if not c.active:
        return None
    image = (str(Path(c.image).expanduser().absolute())
             if c.runtime != "pyxis" or looks_like_path(c.image) else c.image)
    inside = c.workdir or str(workdir)
    mounts = [(str(p), str(p), "") for p in default_mounts(experiment, run_dir, workdir)]
    mounts += [c.mount_paths(m) for m in c.mounts]
    env = {"PYTHONPATH": str(PROJECT_ROOT), **c.env}
    exports = [(MARKER, f"{'apptainer' if c.runtime == 'singularity' else c.runtime} {image}")]
    srun: list[str] = []
    exec_: list[str] = []
    if c.runtime in ("apptainer", "singularity"):
        gpu = {"auto": "--nv" if profile.gpus_per_node else "", "nv": "--nv", "rocm": "--rocm",
               "none": ""}[c.gpu]
        exec_ = [c.runtime, "exec"] + ([gpu] if gpu else []) + (
            [] if c.mount_home else ["--no-home"])
        for source, target, options in mounts:
            exec_ += ["--bind", ":".join(filter(None, (source, target, options)))]
        for key, value in env.items():
            exec_ += ["--env", f"{key}={value}"]
        exec_ += ["--pwd", inside, *c.options, image]
    elif c.runtime == "pyxis":
        # Named, the image is unpacked once per job (Pyxis's default container_scope is the
        # job) instead of at every step: minutes for an NGC image.
        srun = [f"--container-image={image}", "--container-name=hpcdp",
                "--container-mounts=" + ",".join(":".join(filter(None, m)) for m in mounts),
                f"--container-workdir={inside}"]
        srun += [] if c.mount_home else ["--no-container-mount-home"]
        # Pyxis passes the job's environment in, but the image's own values win unless named.
        srun += ["--container-env=" + ",".join(env), *c.options]
        exports += list(env.items())
    else:  # oci
        srun = [f"--container={image}", *c.options]
        exec_ = ["env", f"--chdir={inside}"]
        exports += list(env.items())
    return ContainerLaunch(runtime=c.runtime, image=image, srun_words=[_q(w) for w in srun],
                           exec_words=[_q(w) for w in exec_], exports=exports, mounts=mounts)
