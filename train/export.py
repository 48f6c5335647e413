"""The trained model leaves hpcdp: a run's checkpoint as a transformers folder, and the two
things done with one next (sampling, and perplexity on the run's own held-out tokens).

    python -m train export RUN_DIR --to DIR [--step N] [--dtype fp32|bf16|fp16] [--force]
    python -m train sample DIR --prompt TEXT [--max-new-tokens N] [--seed S]
    python -m train eval RUN_DIR|DIR [--step N]

(`hpcdp export`, `hpcdp sample` and `hpcdp eval` run these.) The folder holds config.json,
model.safetensors, generation_config.json, the run's tokenizer as transformers loads it
(AutoTokenizer.from_pretrained), hpcdp.json (the run it came from: folder, step, strategy, loss,
the resolved experiment) and README.md, a model card with the figures the run logged.

hpcdp trains transformers' own GPT2LMHeadModel, so a checkpoint's state dict already has
transformers' names and layout: nothing is transposed or renamed (torchtitan's users met a
generic converter that produced garbage; here the names are checked, every one). A sharded
checkpoint (fsdp, hsdp: a DCP folder saved at any world size) is read without a process group
(DCP's no-dist load into full-size tensors).
"""

from __future__ import annotations

import json
import os
import shutil
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hpcdp import run_folder
from hpcdp.config import Experiment, build
from hpcdp.errors import UsageError, check_out_folder
from train import checkpoint
from train.data import expected_vocab_size

if TYPE_CHECKING:
    import torch

# torch and transformers are imported once the input is known good: a refusal (no such run,
# no checkpoint, a bad --dtype, a folder that exists) takes 0.3 s instead of their 5.
DTYPES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}  # torch's names
RECORD_FILE = "hpcdp.json"


def _load_transformers() -> None:
    """torch and transformers' models, imported with the garbage collector paused
    (train/imports.py), and transformers quiet: no progress bars or advice on stderr, the
    commands say what they did in one line."""
    from train.imports import without_gc

    with without_gc():
        import torch  # noqa: F401
        from transformers import AutoModelForCausalLM  # noqa: F401
        from transformers.utils import logging as hf_logging

        from train import model  # noqa: F401
    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()


def check_dtype(dtype: str) -> str:
    """torch's name of the dtype `dtype` (fp32, bf16, fp16)."""
    if dtype not in DTYPES:
        raise UsageError(f"--dtype {dtype!r}: give one of {', '.join(DTYPES)}")
    return DTYPES[dtype]


def find_checkpoint(run_dir: Path, step: int | None, log=print) -> Path:
    """Step N's checkpoint, or the newest intact one (a damaged newest is skipped, saying so,
    as resume does)."""
    if not run_dir.is_dir():
        raise UsageError(f"{run_dir} is not a folder; give a run folder (holding checkpoints/) "
                         "or an exported model folder")
    if step is not None:
        for sharded in (False, True):
            path = checkpoint.path_for(run_dir, step, sharded)
            if path.exists():
                why = checkpoint.damage(path)
                if why:
                    raise UsageError(f"checkpoint {path} is damaged ({why}); leave --step out "
                                     "to take the newest intact one")
                return path
        have = [s for s, _ in checkpoint.list_checkpoints(run_dir)]
        raise UsageError(f"--step {step}: no checkpoint of that step in "
                         f"{checkpoint.checkpoint_dir(run_dir)}; it has steps "
                         f"{', '.join(map(str, have)) or 'none'}")
    found = checkpoint.newest_intact(run_dir, log=log)
    if found is None and not checkpoint.checkpoint_dir(run_dir).exists():
        _name_runs_below(run_dir)
    if found is None:
        raise UsageError(f"no checkpoint in {checkpoint.checkpoint_dir(run_dir)}: train with "
                         "train.checkpoint_interval > 0 (or let the run finish: it saves at "
                         "its last step)")
    return found


def _name_runs_below(folder: Path) -> None:
    """A folder above runs (a campaign's, an experiment's, runs/): UsageError naming the runs
    below it that have checkpoints, the folders to give instead."""
    below = sorted({c.parent for depth in range(1, 5)
                    for c in folder.glob("/".join(["*"] * depth + ["checkpoints"]))
                    if c.is_dir()})
    if below:
        shown = ", ".join(str(p) for p in below[:3]) + (", ..." if len(below) > 3 else "")
        raise UsageError(f"{folder} is not a run folder: it holds {len(below)} run(s) with "
                         f"checkpoints below it; give one of them: {shown}")


def load_state(path: Path) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """(the model's state dict, the checkpoint's other records: step, config, strategy...)."""
    import torch

    meta = checkpoint.load(path)
    if not checkpoint.is_sharded(path):
        return meta.pop("model"), meta
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint import FileSystemReader

    saved = FileSystemReader(str(path)).read_metadata().state_dict_metadata
    wanted = {key.removeprefix("model."): value for key, value in saved.items()
              if key.startswith("model.") and hasattr(value, "size")}
    state = {name: torch.empty(tuple(md.size), dtype=md.properties.dtype)
             for name, md in wanted.items()}
    box = {"model": state}
    with warnings.catch_warnings():  # its warning that no process group is set up: by design
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        dcp.load(box, checkpoint_id=str(path), no_dist=True)  # no process group: full tensors
    return box["model"], meta


def experiment_of(meta: dict[str, Any]) -> Experiment:
    return build(Experiment, meta["config"], "")


def model_from(meta: dict[str, Any], state: dict[str, torch.Tensor], where: str):
    """The run's GPT2LMHeadModel holding `state`, every name checked."""
    from train.model import build_model, load_weights

    exp = experiment_of(meta)
    vocab = expected_vocab_size(exp.data.tokenizer, exp.data.vocab_size)
    model = build_model(exp.model.preset, vocab, exp.train.seq_len, 0.0, exp.model.attention)
    load_weights(model, state, f"checkpoint {where}")
    return model.eval(), exp


def _run_figures(run_dir: Path, step: int) -> dict[str, Any]:
    """What the run logged up to `step`: its loss there, validation loss, tokens, throughput."""
    figures: dict[str, Any] = {}
    rates = []
    for r in run_folder.read_metrics(run_dir):
        if r.get("kind") == "step" and r.get("step", 0) <= step:
            figures.update(loss=r.get("loss"), tokens_seen=r.get("tokens_seen"))
            if r.get("tokens_per_s"):
                rates.append(r["tokens_per_s"])
        elif r.get("kind") == "eval" and r.get("step") == step:
            figures["val_loss"] = r.get("val_loss")
        elif r.get("kind") == "header" and (r.get("start_step") or 0) < step:  # its segment
            figures.update(world_size=r.get("world_size"), nodes=r.get("nodes"),
                           micro_batch_size=r.get("micro_batch_size"),
                           devices_per_process=r.get("devices_per_process") or 1,
                           precision=r.get("precision"), n_params=r.get("n_params"))
    if rates:
        figures["tokens_per_s_median"] = sorted(rates)[len(rates) // 2]
    return figures


def _card(record: dict[str, Any], tokenizer_said: str) -> str:
    f = record["figures"]

    def num(key: str, fmt: str = "{:.4f}") -> str:
        return fmt.format(f[key]) if f.get(key) is not None else "not logged"

    return "\n".join([
        f"# GPT-2 ({record['preset']}) pre-trained with hpcdp",
        "",
        f"Exported by `hpcdp export` from run `{record['run_dir']}`, step {record['step']} "
        f"(checkpoint `{Path(record['checkpoint']).name}`), strategy `{record['strategy']}` on "
        f"{f.get('world_size', '?')} rank(s), precision {f.get('precision', '?')}; weights "
        f"saved in {record['dtype']}.",
        "",
        "| figure | value |", "|---|---|",
        f"| parameters | {num('n_params', '{:,}')} |",
        f"| tokens seen | {num('tokens_seen', '{:,}')} |",
        f"| training loss at this step | {num('loss')} |",
        f"| validation loss at this step | {num('val_loss')} |",
        f"| median throughput (tokens/s, all ranks) | {num('tokens_per_s_median', '{:,.0f}')} |",
        "",
        f"Tokenizer: {tokenizer_said}.",
        "",
        "Load it with transformers: `AutoModelForCausalLM.from_pretrained(DIR)` and "
        "`AutoTokenizer.from_pretrained(DIR)`; sample with `hpcdp sample DIR --prompt ...`, "
        "and evaluate with `hpcdp eval DIR` or lm-evaluation-harness (docs/export.md).",
        "",
        f"The resolved experiment and the run's records are in `{RECORD_FILE}`.", ""])


def export(run_dir: str, to: str, step: int | None = None, dtype: str = "fp32",
           force: bool = False, log=print) -> Path:
    """Write the transformers folder `to`, never half: aside first, renamed into place."""
    torch_dtype = check_dtype(dtype)
    target = Path(to).expanduser().absolute()
    if target.exists() and not force:
        raise UsageError(f"--to {to}: {target} exists; give another folder, or --force to "
                         "replace it")
    check_out_folder(target, "--to")  # a file, or under one: before the 5 s of loading
    run = Path(run_dir).expanduser().absolute()
    path = find_checkpoint(run, step, log=log)
    _load_transformers()
    import torch

    state, meta = load_state(path)
    model, exp = model_from(meta, state, str(path))
    if exp.data.tokenizer == "bytes":
        # The model was built with GPT-2's habit, end-of-text = the last id; for bytes that is
        # byte 0xFF, a real byte, and generate() would stop on it: no special tokens at all.
        for config in (model.config, model.generation_config):
            config.bos_token_id = config.eos_token_id = None
    tmp = target.with_name(f".{target.name}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        model.to(getattr(torch, torch_dtype)).save_pretrained(str(tmp), safe_serialization=True)
        from train import hf_tokenizer

        said = hf_tokenizer.save(exp, tmp)
        record = {"run_dir": str(run), "checkpoint": str(path), "step": int(meta["step"]),
                  "strategy": meta.get("strategy"), "saved_world_size": meta.get("world_size"),
                  "dtype": dtype, "preset": exp.model.preset, "tokenizer": exp.data.tokenizer,
                  "prefix_token_id": prefix_token_id(exp),
                  "figures": _run_figures(run, int(meta["step"])), "experiment": meta["config"]}
        (tmp / RECORD_FILE).write_text(json.dumps(record, indent=2) + "\n")
        (tmp / "README.md").write_text(_card(record, said))
        if target.exists():
            shutil.rmtree(target)
        os.replace(tmp, target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    log(f"exported step {record['step']} of {run} ({record['strategy']}, "
        f"{path.name}) to {target} in {dtype}")
    return target


def _exported(folder: Path) -> dict[str, Any]:
    try:
        return json.loads((folder / RECORD_FILE).read_text())
    except (OSError, ValueError):
        raise UsageError(f"{folder} is not a folder hpcdp exported (no readable {RECORD_FILE}); "
                         "give a run folder or `hpcdp export`'s --to folder") from None


def _context_of(folder: Path) -> int | None:
    """The model's context (config.json's n_positions), None where it cannot be read."""
    try:
        return int(json.loads((folder / "config.json").read_text())["n_positions"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def sample(folder: str, prompt: str, max_new_tokens: int = 50, seed: int = 1234,
           greedy: bool = False) -> str:
    """transformers' own generate on the exported folder."""
    path = Path(folder).expanduser()
    if not (path / "config.json").is_file():
        raise UsageError(f"{folder} holds no config.json: give a transformers model folder "
                         "(`hpcdp export --to DIR`)")
    if not prompt:
        raise UsageError("--prompt is empty: give some text to continue")
    # GPT-2's positions end at its context: generation past it fails deep in the embedding.
    context = _context_of(path)
    if context and max_new_tokens >= context:
        raise UsageError(f"--max-new-tokens {max_new_tokens} reaches past the model's context "
                         f"of {context} tokens (prompt included): ask for fewer than {context}")
    _load_transformers()
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(path))
    model = AutoModelForCausalLM.from_pretrained(str(path)).eval()
    ids = tok(prompt, return_tensors="pt", add_special_tokens=False)["input_ids"]
    if ids.shape[1] == 0:
        raise UsageError("--prompt is empty: give some text to continue")
    if context and ids.shape[1] + max_new_tokens > context:
        raise UsageError(f"the prompt's {ids.shape[1]} tokens and --max-new-tokens "
                         f"{max_new_tokens} reach past the model's context of {context} tokens: "
                         f"ask for at most {max(context - ids.shape[1], 0)} new tokens, or give "
                         "a shorter prompt")
    torch.manual_seed(seed)
    with torch.no_grad():
        out = model.generate(ids, max_new_tokens=max_new_tokens, do_sample=not greedy,
                             top_k=None if greedy else 50,
                             pad_token_id=model.config.eos_token_id
                             if model.config.eos_token_id is not None else 0)
    return tok.decode(out[0], skip_special_tokens=False)


def evaluate(source: str, step: int | None = None, precision: str = "run",
             log=print) -> dict[str, Any]:
    """Perplexity on the run's held-out split, from an exported folder by transformers: the
    tokens the loop's validation reads (every rank's eval_batches at the run's batch per rank,
    averaged as the ranks averaged them), so the loss is the one the run logged at that step.
    precision "run" computes under the run's autocast (a bf16 run's loss in bf16, as it was
    logged), "fp32" in full precision; the weights are fp32 either way."""
    import contextlib
    import tempfile

    from train.data import Batches, open_data

    path = Path(source).expanduser().absolute()
    cleanup = None
    try:
        if (path / RECORD_FILE).is_file() or (path / "config.json").is_file():
            folder = path
        else:  # a run folder: exported into a temporary folder, removed whatever happens
            cleanup = tempfile.mkdtemp(prefix="hpcdp-eval-")
            folder = export(str(path), str(Path(cleanup) / "model"), step=step, log=log)
        record = _exported(folder)
        _load_transformers()
        import torch
        from transformers import AutoModelForCausalLM

        exp = build(Experiment, record["experiment"], "")
        figures = record["figures"]
        world = int(figures.get("world_size") or 1)
        batch = int(figures.get("micro_batch_size") or exp.train.micro_batch_size) * int(
            figures.get("devices_per_process") or 1)
        model = AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32).eval()
        data = open_data(exp)
        losses = []
        run_precision = figures.get("precision") or "fp32"
        computed = run_precision if precision == "run" else "fp32"
        low = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(computed)
        with torch.no_grad(), (torch.autocast("cpu", dtype=low) if low else
                               contextlib.nullcontext()):
            for rank in range(world):
                val = Batches(data, "val", exp.train.seq_len, batch, rank, world, exp.train.seed)
                total = 0.0
                for _ in range(exp.train.eval_batches):
                    x, y = val.next_batch()
                    logits = model(input_ids=x).logits
                    total += torch.nn.functional.cross_entropy(
                        logits.reshape(-1, logits.size(-1)).float(), y.reshape(-1)).item()
                losses.append(total / exp.train.eval_batches)
        loss = sum(losses) / len(losses)
        return {"folder": str(folder), "step": record["step"], "val_loss": loss,
                "perplexity": float(torch.exp(torch.tensor(loss))),
                "logged_val_loss": figures.get("val_loss"), "precision": computed,
                "run_precision": run_precision,
                "tokens": world * exp.train.eval_batches * batch * exp.train.seq_len}
    finally:
        if cleanup:
            shutil.rmtree(cleanup, ignore_errors=True)


def prefix_token_id(exp: Experiment) -> int:
    """The token a document's first token is predicted from (lm-evaluation-harness's
    prefix_token_id): the end-of-text token where the tokenizer has one, else the byte
    tokenizer's document separator, a newline."""
    from train.tokenizer import GPT2_EOT

    if exp.data.tokenizer == "gpt2":
        return GPT2_EOT
    if exp.data.tokenizer == "bpe":
        from train.data import open_data

        return open_data(exp).tokenizer().separator[0]
    return ord("\n")


def evaluate_text(folder: str, text_file: str) -> dict[str, Any]:
    """Perplexity of a text file (.jsonl: one document per line, its "text"; else the whole file
    one document) as lm-evaluation-harness's loglikelihood_rolling scores it: each document
    after the prefix token, in windows of the model's context that each predict new tokens
    given the tokens before them in the window. Per token and per UTF-8 byte."""
    path, source = Path(folder).expanduser(), Path(text_file).expanduser()
    record = _exported(path)
    try:
        raw = source.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"--text {text_file!r} cannot be read: "
                         f"{getattr(exc, 'strerror', None) or exc}") from None
    try:
        docs = ([json.loads(line)["text"] for line in raw.splitlines() if line.strip()]
                if source.suffix == ".jsonl" else [raw])
    except (ValueError, KeyError, TypeError):
        raise UsageError(f"--text {text_file!r}: every line of a .jsonl must be an object "
                         "with a \"text\" string") from None
    if not any(isinstance(doc, str) and doc for doc in docs):
        raise UsageError(f"--text {text_file!r} holds no text to score: give a file with some "
                         "text (a .jsonl: a line whose \"text\" is not empty)")
    _load_transformers()
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(path))
    model = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32).eval()
    context = model.config.n_positions
    prefix = int(record.get("prefix_token_id", ord("\n")))
    total_ll, n_tokens, n_bytes = 0.0, 0, 0
    with torch.no_grad():
        for doc in docs:
            ids = [prefix, *tok.encode(doc, add_special_tokens=False)]
            for start in range(1, len(ids), context):  # predict ids[start:end] ...
                end = min(start + context, len(ids))
                inputs = ids[max(0, end - 1 - context):end - 1]  # ... from the context before
                logits = model(input_ids=torch.tensor([inputs])).logits[0].float()
                logp = torch.log_softmax(logits[-(end - start):], dim=-1)
                total_ll += logp[torch.arange(end - start), torch.tensor(ids[start:end])].sum(
                    ).item()
                n_tokens += end - start
            n_bytes += len(doc.encode("utf-8"))
    return {"folder": str(path), "text": str(source), "documents": len(docs),
            "tokens": n_tokens, "bytes": n_bytes, "loglikelihood": total_ll,
            "token_perplexity": float(torch.exp(torch.tensor(-total_ll / n_tokens))),
            "byte_perplexity": float(torch.exp(torch.tensor(-total_ll / n_bytes)))}
