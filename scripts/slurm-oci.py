#!/usr/bin/env python3
"""Slurm's own OCI containers (`srun --container=BUNDLE`) on the local cluster, with runc.

    slurm-oci.py host-bundle DIR        write an OCI bundle whose root file system is this
                                        machine's own (every top-level folder bind-mounted),
                                        for tests that run jobs inside a real container
    slurm-oci.py run STATE BUNDLE ID    oci.conf's RunTimeRun: runc run, after giving the task
                                        the variables Slurm 22.05 leaves out

Why `run` exists: Slurm 22.05's slurmstepd writes one config.json per step and node, from the
step's environment, before the tasks get their own variables; so SLURM_PROCID, SLURM_NODEID,
SLURM_LOCALID and SLURMD_NODENAME never reach the container, and a rank cannot tell where it is.
22.05 also runs at most one task per node in a container step, so these follow from the node's
place in SLURM_STEP_NODELIST. (Slurm 23.02 moved the set-up into each task.) Standard library
only: slurmstepd runs it with the system's python3. See docs/containers.md.
"""

import json
import os
import subprocess
import sys

# Every top-level folder is bound at its own path (a checkout may live anywhere, /builds or
# /src on a CI machine), except /proc, which the container mounts afresh.
_NOT_BOUND = ("proc",)


def host_bundle(folder: str) -> None:
    os.makedirs(os.path.join(folder, "rootfs"), exist_ok=True)
    mounts = [{"destination": "/proc", "type": "proc", "source": "proc"}]
    for name in sorted(os.listdir("/")):
        path = "/" + name
        if name in _NOT_BOUND:
            continue
        if os.path.isdir(path) and not os.path.islink(path):
            mounts.append({"destination": path, "type": "bind", "source": path,
                           "options": ["rbind", "rw"]})
        elif os.path.islink(path):  # /bin -> usr/bin on merged-/usr systems
            target = os.path.join(folder, "rootfs", name)
            if not os.path.lexists(target):
                os.symlink(os.readlink(path), target)
    config = {
        "ociVersion": "1.0.2",
        # Slurm replaces args and appends the step's environment (so none here: of two equal
        # names the first wins); hpcdp's `env --chdir` sets the cwd. A mount namespace only:
        # the host's network, PIDs and IPC, as HPC containers have (Slurm's: host network).
        "process": {"terminal": False, "user": {"uid": 0, "gid": 0}, "args": ["/bin/true"],
                    "env": [], "cwd": "/"},
        "root": {"path": "rootfs", "readonly": False},
        "mounts": mounts,
        "linux": {"namespaces": [{"type": "mount"}]},
    }
    tmp = os.path.join(folder, "config.json.tmp")
    with open(tmp, "w") as f:
        json.dump(config, f, indent=1)
    os.replace(tmp, os.path.join(folder, "config.json"))


def _step_nodes(nodelist: str) -> list[str]:
    out = subprocess.run(["scontrol", "show", "hostnames", nodelist], capture_output=True,
                         text=True, check=True).stdout
    return out.split()


def run(state: str, bundle: str, container_id: str) -> None:
    path = os.path.join(bundle, "config.json")
    with open(path) as f:
        config = json.load(f)
    env = dict(item.split("=", 1) for item in config["process"].get("env", []) if "=" in item)
    node = os.environ.get("SLURMD_NODENAME") or env.get("SLURMD_NODENAME", "")
    nodes = _step_nodes(env.get("SLURM_STEP_NODELIST") or env["SLURM_JOB_NODELIST"])
    task = {"SLURMD_NODENAME": node, "SLURM_NODEID": str(nodes.index(node)),
            "SLURM_PROCID": str(nodes.index(node)), "SLURM_LOCALID": "0"}
    # The first of two equal names wins in a process's environment: replace, do not append.
    config["process"]["env"] = [item for item in config["process"].get("env", [])
                                if item.split("=", 1)[0] not in task]
    config["process"]["env"] += [f"{k}={v}" for k, v in task.items()]
    with open(path + ".tmp", "w") as f:
        json.dump(config, f)
    os.replace(path + ".tmp", path)
    os.execvp("runc", ["runc", f"--root={state}", "run", "--bundle", bundle, container_id])


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "host-bundle":
        host_bundle(sys.argv[2])
    elif len(sys.argv) == 5 and sys.argv[1] == "run":
        run(*sys.argv[2:])
    else:
        sys.exit(__doc__)
