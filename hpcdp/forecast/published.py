"""The model against published scaling figures (experiments/forecast-published.yaml)."""

from __future__ import annotations

from pathlib import Path

from hpcdp import EXPERIMENTS_DIR
from hpcdp.config import NetworkConfig
from hpcdp.forecast.inputs import Fit, network_from_profile
from hpcdp.forecast.model import Model
from hpcdp.forecast.predict import predict

PUBLISHED_FILE = EXPERIMENTS_DIR / "forecast-published.yaml"


def published_checks(path: Path = PUBLISHED_FILE) -> list[dict]:
    """The model against published scaling figures (experiments/forecast-published.yaml): for
    each, what it predicts from the inputs published with it, the published value and the
    relative error, and whether the file's tolerance applies to that figure."""
    from hpcdp.config import build, read_yaml

    checks = []
    for name, case in read_yaml(Path(path), "published figures").items():
        net = network_from_profile(build(NetworkConfig, case["network"], f"{name}.network"),
                                   name)
        gpn = int(case["gpus_per_node"])
        if "op" in case:  # one collective, as nccl-tests times it
            ranks = int(case["nodes"]) * gpn
            for nbytes, published_us in case["times_us"].items():
                predicted = net.collective_s(case["op"], float(nbytes), ranks,
                                             int(case["nodes"])) * 1e6
                checks.append({"case": name, "what": f"{int(nbytes):,} B all-reduce time (us)",
                               "predicted": predicted, "published": float(published_us),
                               "error": predicted / float(published_us) - 1,
                               "checked": int(nbytes) >= int(case.get("checked_from_bytes", 0)),
                               "tolerance": float(case["tolerance"])})
            continue
        params = float(case["params"])
        model = Model(n_params=int(params), grad_bytes=int(params * case["grad_bytes"]),
                      param_gather_bytes=int(params * case["param_bytes"]),
                      units=int(case["units"]), block_share=float(case["block_share"]))
        fit_gpus, per_gpu = int(case["fit"]["gpus"]), float(case["fit"]["tokens_per_s_per_gpu"])
        tokens = int(case["tokens_per_gpu_step"])
        fit = Fit(strategy=case["strategy"], precision="bf16", communication="published",
                  nodes=max(1, fit_gpus // gpn), ranks_per_node=min(gpn, fit_gpus),
                  step_s=[tokens / per_gpu], exposed_s=None, forward_s=None, backward_s=None,
                  phases_s=None, tokens_per_step=tokens * fit_gpus, micro_batch=1, accum=1,
                  scaling="weak", global_batch=fit_gpus, model=model, shapes=[],
                  reshard_after_forward=True, state_gb=None, peak_gb=None,
                  memory_measured=None)
        check_gpus = int(case["check"]["gpus"])
        p = predict(fit, net, check_gpus // gpn, gpn, tokens=1.0, measured={},
                    billing_per_node_hour=None)
        predicted = p.tokens_per_s / check_gpus
        published = float(case["check"]["tokens_per_s_per_gpu"])
        checks.append({"case": name, "what": f"tokens/s per GPU at {check_gpus} GPUs "
                       f"(fitted at {fit_gpus})", "predicted": predicted, "published": published,
                       "error": predicted / published - 1, "checked": True,
                       "tolerance": float(case["tolerance"])})
    return checks
