"""The trained model leaves hpcdp (issue 35): real runs of DDP, Horovod and fsdp (saved on 4
ranks), each exported with `hpcdp export` (the sharded one without any process group), then
read back by transformers itself: the same logits as the checkpoint holds (torch's own
converters read it independently), and `hpcdp eval`'s loss equal to the validation loss the
run logged at that step. A new run started from the export with model.init_from continues at
the exported model's validation loss. Tokenizers, bad input and lm-evaluation-harness below."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from horovod_probe import SKIP_REASON, horovod_importable

ROOT = Path(__file__).resolve().parents[2]
# Horovod's run is tests/conftest.py's, with the same settings (LOCAL_HOROVOD_SETTINGS).
SETS = ["train.steps=6", "train.checkpoint_interval=6", "train.eval_interval=6",
        "data.corpus=synthetic", "train.log_interval=1"]


def hpcdp(*args: str, cwd: Path, timeout: int = 300) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "OMPI_"))}
    env["OMP_NUM_THREADS"] = "1"
    return subprocess.run([sys.executable, "-m", "hpcdp", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=timeout)


def train(tmp_path: Path, strategy: str, ranks: int, *extra: str) -> Path:
    tmp_path.mkdir(parents=True, exist_ok=True)
    done = hpcdp("run", "-s", strategy, "--ranks", str(ranks), "--out", str(tmp_path / "runs"),
                 *[a for s in [*SETS, *extra] for a in ("--set", s)], cwd=tmp_path)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    return tmp_path / "runs" / "smoke" / f"{strategy}-1n"


@pytest.fixture(scope="module")
def single_run(tmp_path_factory) -> Path:
    """One single-gpu run with checkpoints at steps 3 and 6, shared by the tests that only read
    it (one training fewer each; a test that changes it works on a copy)."""
    return train(tmp_path_factory.mktemp("single"), "single-gpu", 1,
                 "train.checkpoint_interval=3")


@pytest.fixture(scope="module")
def ddp_shakespeare(tmp_path_factory) -> tuple[Path, Path]:
    """(run folder, prepared data) of DDP in bf16 on 2 ranks over Shakespeare: real text, so
    that 6 steps move the validation loss well away from a random model's; mixed precision, so
    that eval meets a run whose loss was computed in bf16 (issue 48, item 6)."""
    tmp = tmp_path_factory.mktemp("ddp")
    real = ["data.corpus=shakespeare", f"data.prepared_dir={tmp / 'prepared'}"]
    return train(tmp, "distributed-ps-apex", 2, *real), tmp / "prepared"


def logged_val_loss(run_dir: Path, step: int) -> float:
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        record = json.loads(line)
        if record["kind"] == "eval" and record["step"] == step:
            return record["val_loss"]
    raise AssertionError(f"no eval at step {step}")


def checkpoint_state(path: Path, tmp_path: Path) -> dict:
    """The model's weights as torch's own tools read the checkpoint: torch.load, or for a DCP
    folder torch's dcp_to_torch_save (not hpcdp's no-dist load)."""
    if path.suffix == ".dcp":
        from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

        dcp_to_torch_save(str(path), str(tmp_path / "whole.pt"))
        return torch.load(tmp_path / "whole.pt", weights_only=False)["model"]
    return torch.load(path, weights_only=False)["model"]


# zero1 is left out: it is DDP with a sharded optimizer, and saves the model as DDP does (rank 0's
# whole state in one .pt, train/strategies/zero.py); export reads only the model.
@pytest.mark.parametrize("strategy,ranks,suffix", [
    ("distributed-ps-apex", 2, ".pt"), ("horovod", 2, ".pt"), ("fsdp", 4, ".dcp")])
def test_every_strategy_exports_what_it_trained(strategy, ranks, suffix, tmp_path, request):
    if strategy == "horovod" and not horovod_importable():
        pytest.skip(SKIP_REASON)
    from transformers import GPT2LMHeadModel

    if strategy == "distributed-ps-apex":  # the run test_a_run_started_from_an_export reads
        run_dir = request.getfixturevalue("ddp_shakespeare")[0]
    elif strategy == "horovod":  # tests/conftest.py's, which test_local_run.py resumes
        run_dir = request.getfixturevalue("local_horovod_run")["run_dir"]
    else:
        run_dir = train(tmp_path, strategy, ranks)
    ckpt = run_dir / "checkpoints" / f"step-0000006{suffix}"
    assert ckpt.exists()
    done = hpcdp("export", str(run_dir), "--to", str(tmp_path / "hf"), cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    # issue 48, item 8: reading shards without a process group is the design, not a warning
    assert "torch.distributed is disabled" not in done.stderr, done.stderr
    folder = tmp_path / "hf"
    assert {"config.json", "model.safetensors", "generation_config.json", "tokenizer.json",
            "hpcdp.json", "README.md"} <= {p.name for p in folder.iterdir()}
    record = json.loads((folder / "hpcdp.json").read_text())
    assert record["step"] == 6 and record["strategy"] == strategy
    if record["tokenizer"] == "bytes":  # issue 48, item 7: byte 0xFF is a byte, no end-of-text
        for name in ("config.json", "generation_config.json"):
            said = json.loads((folder / name).read_text())
            assert said.get("eos_token_id") is None and said.get("bos_token_id") is None, said
    assert record["saved_world_size"] == ranks and record["experiment"]["name"] == "smoke"
    assert "validation loss at this step" in (folder / "README.md").read_text()
    # Logits: transformers' own loading of the folder against the checkpoint's weights
    exported = GPT2LMHeadModel.from_pretrained(str(folder)).eval()
    reference = GPT2LMHeadModel(exported.config)
    reference.load_state_dict(checkpoint_state(ckpt, tmp_path), strict=False)
    reference.tie_weights()
    reference.eval()
    batch = torch.randint(0, exported.config.vocab_size, (2, 64), generator=torch.Generator()
                          .manual_seed(0))
    with torch.no_grad():
        diff = (exported(batch).logits - reference(batch).logits).abs().max().item()
    assert diff <= 1e-5
    # hpcdp eval: the run's held-out tokens through the folder, the loss the run logged, in
    # the precision the run computed it (a bf16 run's in bf16)
    done = hpcdp("eval", str(folder), "--json", cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(done.stdout)
    assert result["val_loss"] == pytest.approx(logged_val_loss(run_dir, 6), abs=1e-4)
    if record["figures"]["precision"] == "bf16":  # in fp32 it differs, and the line says why
        done = hpcdp("eval", str(folder), "--precision", "fp32", cwd=tmp_path)
        assert done.returncode == 0, done.stderr[-2000:]
        assert re.search(r"validation loss \d\.\d{4} \(fp32\), .* \(the run logged \d\.\d{4} "
                         r"in bf16: the difference is bf16's rounding", done.stdout), done.stdout


def test_a_run_started_from_an_export_continues_at_its_loss(ddp_shakespeare, tmp_path):
    first, prepared = ddp_shakespeare
    real = ["data.corpus=shakespeare", f"data.prepared_dir={prepared}"]
    assert hpcdp("export", str(first), "--to", str(tmp_path / "hf"), cwd=tmp_path).returncode == 0
    # transformers' generate on it: the prompt continued, the same text twice when greedy
    said = [hpcdp("sample", str(tmp_path / "hf"), "--prompt", "ROMEO:", "--max-new-tokens", "24",
                  "--greedy", cwd=tmp_path) for _ in range(2)]
    assert said[0].returncode == 0, said[0].stderr[-2000:]
    assert said[0].stdout.startswith("ROMEO:") and len(said[0].stdout) > len("ROMEO:") + 10
    assert said[0].stdout == said[1].stdout
    # One step at a negligible learning rate: its evaluation sees the exported weights
    second = train(tmp_path / "b", "distributed-ps-apex", 2, *real,
                   f"model.init_from={tmp_path / 'hf'}", "train.steps=1",
                   "train.eval_interval=1", "train.lr=1e-12", "train.min_lr=1e-12",
                   "train.checkpoint_interval=0")
    trained = logged_val_loss(first, 6)
    assert logged_val_loss(second, 1) == pytest.approx(trained, abs=1e-4)
    first_step = json.loads((first / "metrics.jsonl").read_text().splitlines()[1])
    assert first_step["kind"] == "step" and first_step["loss"] - trained > 0.05  # it trained


@pytest.mark.parametrize("kind", ["bytes", "bpe", "gpt2"])
def test_the_tokenizer_round_trips_through_autotokenizer(kind, tmp_path):
    from transformers import AutoTokenizer

    from hpcdp.config import load_experiment
    from train import hf_tokenizer
    from train.corpora import resolve_corpus
    from train.data import open_data, prepare

    corpus = tmp_path / "corpus"  # small: BPE trains on it in a moment
    corpus.mkdir()
    plays = resolve_corpus("shakespeare").documents()
    for i in range(3):
        (corpus / f"doc{i}.txt").write_text(next(plays)[:20_000])
    over = {"data": {"tokenizer": kind, "corpus": str(corpus),
                     "prepared_dir": str(tmp_path / "prepared")}}
    if kind == "gpt2":
        tiktoken_file = ROOT / "data" / "gpt2" / "gpt2.tiktoken"
        if not tiktoken_file.exists():
            pytest.skip("no data/gpt2/gpt2.tiktoken (scripts/fetch-gpt2-tokenizer.sh)")
        over["data"]["gpt2_files"] = str(tiktoken_file)
    if kind == "bpe":
        over["data"]["vocab_size"] = 400
    exp = load_experiment("smoke", over)
    prepare(exp)
    ours = open_data(exp).tokenizer()
    said = hf_tokenizer.save(exp, tmp_path / "tok")
    auto = AutoTokenizer.from_pretrained(str(tmp_path / "tok"))
    text = ("To be, or not to be: that is the question.\n\nWhether 'tis nobler — in the mind "
            "to suffer 12,345 slings… ünïcödé  and   spaces")
    assert auto.encode(text, add_special_tokens=False) == ours.encode(text), said
    assert auto.decode(ours.encode(text)) == text


def test_bad_input_is_one_line_and_nothing_half_written(single_run, tmp_path):
    import shutil

    run_dir = tmp_path / "run"  # a copy: its newest checkpoint is damaged below
    shutil.copytree(single_run, run_dir)
    cases = [
        (["export", str(tmp_path / "nothing"), "--to", str(tmp_path / "x")], "is not a folder"),
        (["export", str(run_dir), "--to", str(tmp_path / "x"), "--dtype", "fp8"],
         "--dtype 'fp8': give one of fp32, bf16, fp16"),
        (["export", str(run_dir), "--to", str(run_dir)], "exists; give another folder"),
        (["export", str(run_dir), "--to", str(tmp_path / "x"), "--step", "4"],
         "--step 4: no checkpoint of that step"),
        (["run", "-s", "single-gpu", "--out", str(tmp_path / "r2"), "--set",
          f"model.init_from={run_dir}"], "holds no readable config.json"),
        (["sample", str(run_dir), "--prompt", "hi"], "holds no config.json"),
        # argparse's own errors, named as the user called them, not as `python -m train`
        (["sample", str(run_dir), "--prompt", "hi", "--max-new-tokens", "0"],
         "sample: argument --max-new-tokens: 0 must be 1 or more"),
    ]
    empty = tmp_path / "empty-run"
    empty.mkdir()
    cases.append((["export", str(empty), "--to", str(tmp_path / "x")], "no checkpoint in"))
    # A folder above runs (a campaign's, runs/): the runs below it are named, to give instead
    above = f"{tmp_path} is not a run folder: it holds 1 run(s) with checkpoints below it; " \
            f"give one of them: {run_dir}"
    cases += [(["export", str(tmp_path), "--to", str(tmp_path / "x")], above),
              (["eval", str(tmp_path)], above)]
    for args, says in cases:
        done = hpcdp(*args, cwd=tmp_path)
        assert done.returncode == 2, (args, done.stdout[-500:], done.stderr[-1000:])
        errors = [line for line in done.stderr.splitlines() if "error" in line]
        assert len(errors) == 1 and says in errors[0], (args, done.stderr[-1000:])
        assert errors[0].startswith("hpcdp: error: "), errors  # as every other hpcdp command
        assert "Traceback" not in done.stderr
    assert not (tmp_path / "x").exists()
    assert not [p for p in tmp_path.iterdir() if ".tmp-" in p.name]
    # A damaged newest checkpoint: falls back to the one before, saying so, as resume does
    newest = run_dir / "checkpoints" / "step-0000006.pt"
    os.truncate(newest, newest.stat().st_size // 2)
    done = hpcdp("export", str(run_dir), "--to", str(tmp_path / "y"), cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-1000:]
    assert "skipped damaged checkpoint(s) step-0000006.pt" in done.stdout + done.stderr
    assert json.loads((tmp_path / "y" / "hpcdp.json").read_text())["step"] == 3
    # init_from a folder of another shape: refused before anything starts
    done = hpcdp("run", "-s", "single-gpu", "--out", str(tmp_path / "r3"), "--set",
                 f"model.init_from={tmp_path / 'y'}", "--set", "model.preset=gpt2-124m",
                 cwd=tmp_path)
    assert done.returncode == 2 and "does not match this experiment: n_layer 2" in done.stderr
    assert not (tmp_path / "r3").exists()
    # Issue 48: text with nothing to score, and generation past the context (128 tokens on
    # tiny): one line each, where a ZeroDivisionError and an IndexError were.
    (tmp_path / "empty.txt").write_text("")
    (tmp_path / "empty.jsonl").write_text('{"text": ""}\n')
    model = str(tmp_path / "y")
    for args, says in [
        (["eval", model, "--text", str(tmp_path / "empty.txt")], "holds no text to score"),
        (["eval", model, "--text", str(tmp_path / "empty.jsonl")], "holds no text to score"),
        (["sample", model, "--prompt", "hi", "--max-new-tokens", "500"],
         "--max-new-tokens 500 reaches past the model's context of 128 tokens"),
        (["sample", model, "--prompt", "x" * 200, "--max-new-tokens", "5"],
         "the prompt's 200 tokens and --max-new-tokens 5 reach past the model's context of 128"),
    ]:
        done = hpcdp(*args, cwd=tmp_path)
        errors = [line for line in done.stderr.splitlines() if "error" in line]
        assert done.returncode == 2 and len(errors) == 1 and says in errors[0], (
            args, done.stderr[-1000:])
        assert "Traceback" not in done.stderr
    # --force replaces, whole
    done = hpcdp("export", str(run_dir), "--to", str(tmp_path / "y"), "--force", "--dtype",
                 "bf16", cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-1000:]
    assert json.loads((tmp_path / "y" / "hpcdp.json").read_text())["dtype"] == "bf16"


def test_lm_evaluation_harness_reads_an_export_with_a_local_task(single_run, tmp_path):
    """lm-eval's rolling loglikelihood over a local JSONL (no hub): its byte perplexity is the
    one `hpcdp eval --text` computes on the same file."""
    import shutil

    lm_eval = shutil.which("lm_eval") or str(Path(sys.executable).parent / "lm_eval")
    if not Path(lm_eval).exists():
        pytest.skip("lm-eval is not installed (pip install 'hpcdp[eval]')")
    run_dir = single_run
    folder = tmp_path / "hf"
    assert hpcdp("export", str(run_dir), "--to", str(folder), cwd=tmp_path).returncode == 0
    docs = tmp_path / "docs.jsonl"
    docs.write_text("".join(json.dumps({"text": t}) + "\n" for t in [
        "To be, or not to be, that is the question: whether 'tis nobler in the mind to suffer.",
        "Now is the winter of our discontent made glorious summer by this sun of York. " * 3]))
    tasks = tmp_path / "tasks"
    tasks.mkdir()
    (tasks / "hpcdp_local.yaml").write_text(
        f"task: hpcdp_local\ndataset_path: json\ndataset_kwargs:\n  data_files:\n"
        f"    test: {docs}\ntest_split: test\noutput_type: loglikelihood_rolling\n"
        "doc_to_text: \"\"\ndoc_to_target: \"{{text}}\"\nmetric_list:\n"
        "  - metric: byte_perplexity\n")
    prefix = json.loads((folder / "hpcdp.json").read_text())["prefix_token_id"]
    env = {**os.environ, "HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1",
           "HF_HOME": str(tmp_path / "hf-home"), "OMP_NUM_THREADS": "1"}
    done = subprocess.run(
        [lm_eval, "--model", "hf", "--model_args",
         f"pretrained={folder},prefix_token_id={prefix},dtype=float32", "--tasks",
         "hpcdp_local", "--include_path", str(tasks), "--device", "cpu", "--batch_size", "1",
         "--output_path", str(tmp_path / "out")],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    results = json.loads(next((tmp_path / "out").rglob("results_*.json")).read_text())
    theirs = results["results"]["hpcdp_local"]["byte_perplexity,none"]
    ours = hpcdp("eval", str(folder), "--text", str(docs), "--json", cwd=tmp_path)
    assert ours.returncode == 0, ours.stderr[-2000:]
    assert json.loads(ours.stdout)["byte_perplexity"] == pytest.approx(theirs, rel=1e-4)
