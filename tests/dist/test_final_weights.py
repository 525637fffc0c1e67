"""The final model.safetensors of a sharded or pipelined job, on 2 real gloo ranks: written in place by
every rank (checkpoint/final_weights.py), it holds exactly the model's weights (a tied weight once),
is byte for byte what one process's save_model writes of them, loads in `gputrain evaluate` to the
run's own test metrics, and its writing never raises a rank's allocator peak above training's."""

from __future__ import annotations

import json
import math
import struct
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file, save_model

from tests.dist.harness import run_ranks

QUICK = ["train.epochs=1", "train.max_steps=2", "train.batch_size=16", "train.device=cpu", "log.progress=none",
         "log.tensorboard=false", "checkpoint.every_epochs=1", "eval.every_epochs=0"]
# vocab 67 and d_model 18: no dimension divides into 2 even shards (FSDP2 pads; TP splits heads of 9)
GPT = ["data.name=synthetic", "data.task=lm", "data.seq_len=8", "data.num_samples=64", "model.name=gpt",
       "model.n_layer=2", "model.n_head=2", "model.d_model=18", "data.vocab_size=67"]
MLP = ["data.name=digits", "data.val_fraction=0.1", "data.test_fraction=0.1", "model.name=mlp",
       "model.hidden_sizes=[33]"]
CASES = {
    "fsdp-gpt": [*GPT, "parallel.strategy=fsdp"],
    "tp-gpt": [*GPT, "parallel.strategy=tp"],
    "pp-gpt": [*GPT, "parallel.strategy=pp", "parallel.pp_schedule=gpipe", "train.grad_accum=2"],
    "hybrid-gpt": [*GPT, "parallel.strategy=hybrid", "parallel.dp_replicate=1", "parallel.dp_shard=2"],
    "ddp-gpt": [*GPT, "parallel.strategy=ddp"],
    "fsdp-mlp": [*MLP, "parallel.strategy=fsdp"],
}


def _whole_as_held(model: torch.nn.Module) -> dict[str, Any]:
    """What this rank holds, each tensor whole (`full_tensor`, collective): the oracle, gathered here only.
    As numpy arrays: a tensor sent back to the test shares memory with the rank, which is gone by then."""
    from torch.distributed.tensor import DTensor

    from gputrain.checkpoint.matching import canonical_name

    return {canonical_name(n): (t.full_tensor() if isinstance(t, DTensor) else t).detach().numpy().copy()
            for n, t in model.state_dict().items()}


def _train_each(rank: int, root: str) -> dict[str, dict[str, Any]]:
    from gputrain.train.trainer import Trainer

    held = {}
    for name, overrides in CASES.items():
        trainer = Trainer.from_config(None, run_dir=Path(root) / name, overrides=QUICK + overrides)
        trainer.fit()
        held[name] = _whole_as_held(trainer.parts.checkpointer.model)
    return held


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[dict[str, dict[str, Any]]]]:
    root = tmp_path_factory.mktemp("final")
    return root, run_ranks(_train_each, str(root), timeout_s=300)


def _header(path: Path) -> dict[str, Any]:
    raw = path.read_bytes()
    (size,) = struct.unpack("<Q", raw[:8])
    return json.loads(raw[8 : 8 + size])


def _oracle(held: list[dict[str, Any]]) -> dict[str, torch.Tensor]:
    """Every rank's tensors together; where two ranks hold one (replicas, a pipeline's tied matrix) they agree."""
    whole: dict[str, torch.Tensor] = {}
    for rank_held in held:
        for name, array in rank_held.items():
            tensor = torch.from_numpy(array)
            assert name not in whole or torch.equal(whole[name], tensor), name
            whole[name] = tensor
    return whole


@pytest.mark.parametrize("case", list(CASES))
def test_the_file_holds_the_model_once_as_one_process_saves_it(runs: Any, case: str) -> None:
    root, held = runs
    path = root / case / "model.safetensors"
    whole = _oracle([h[case] for h in held])
    saved = load_file(str(path))
    header = _header(path)
    if case.endswith("gpt"):  # tied: stored once, under the name save_model keeps, the other named in the metadata
        assert "wte.weight" not in saved and header["__metadata__"] == {"wte.weight": "lm_head.weight"}
        assert torch.equal(whole.pop("wte.weight"), whole["lm_head.weight"])
    assert saved.keys() == whole.keys()
    for name, tensor in whole.items():
        assert saved[name].dtype == tensor.dtype and torch.equal(saved[name], tensor), name
    # the bytes are one process's: load it as the use commands do, save it as a one-process run does
    from gputrain.use.loaded import load_run

    loaded = load_run(root / case, device="cpu")
    if case.endswith("gpt"):  # the tie holds in the loaded model: both names are one tensor
        assert loaded.model.get_parameter("wte.weight") is loaded.model.get_parameter("lm_head.weight")
    again = root / case / "again.safetensors"
    save_model(loaded.model, str(again))
    assert again.read_bytes() == path.read_bytes()


@pytest.mark.parametrize("case", list(CASES))
def test_evaluate_scores_the_file_as_the_run_did(runs: Any, case: str) -> None:
    from gputrain.use.evaluate import evaluate_run

    root, _ = runs
    expected = json.loads((root / case / "summary.json").read_text())["test"]
    got = evaluate_run(root / case, device="cpu", out_dir=root / case / "eval").metrics
    assert got.keys() == expected.keys()
    # the weights are the same bits; the scores differ in the last float32 digits where training evaluated
    # on data-parallel ranks (each a share of the split, then combined) and evaluate on one process
    for metric, value in expected.items():
        assert math.isclose(got[metric], value, rel_tol=1e-6, abs_tol=1e-7), (case, metric, got[metric], value)


# many blocks, small activations, SGD (no optimizer state to hide a gather under): a rank's training peak
# is ~1.7x the model (its shards of the parameters and gradients, one block's unsharding), so gathering
# the whole model at the save would exceed it (measured: 9.4 MiB against 7.8), writing in place does not (4.7)
LARGE = ["data.name=synthetic", "data.task=lm", "data.seq_len=8", "data.num_samples=32", "model.name=gpt",
         "model.n_layer=24", "model.n_head=2", "model.d_model=64", "data.vocab_size=257", "optim.name=sgd",
         "train.batch_size=2", "train.max_steps=2", "train.epochs=1", "train.device=cpu", "log.progress=none",
         "log.tensorboard=false", "checkpoint.every_epochs=0", "eval.every_epochs=0", "parallel.strategy=fsdp"]


def _peaks(rank: int, run_dir: str) -> dict[str, int]:
    """This rank's allocator bytes in training and in the final save (a fresh process: run_ranks spawns)."""
    from gputrain.plan.allocator import AllocatorPeak
    from gputrain.train.trainer import Trainer

    with AllocatorPeak() as peak:
        trainer = Trainer.from_config(None, run_dir=Path(run_dir), overrides=LARGE)
        peak.mark()  # 1: built
        checkpointer = trainer.parts.checkpointer
        save = checkpointer.save_final_weights

        def marked(path: Path) -> None:
            peak.mark()  # 2: training and its evaluations done
            save(path)
            peak.mark()  # 3: saved

        checkpointer.save_final_weights = marked  # type: ignore[method-assign]
        trainer.fit()
    tensors = {id(p): p for p in checkpointer.model.parameters()}.values()
    sizes = [p.numel() * p.element_size() for p in tensors]  # global sizes (a DTensor's numel is the whole's)
    return {"training": peak.peak_between(1, 2), "save": peak.peak_between(2, 3), "before": peak.live_at(2),
            "whole": sum(sizes)}


def test_the_save_stays_under_each_ranks_training_peak(tmp_path: Path) -> None:
    for rank, got in enumerate(run_ranks(_peaks, str(tmp_path / "run"), timeout_s=240)):
        assert got["save"] <= got["training"], (rank, got)
        # a rank adds a tensor at a time and the plan's metadata while saving, never the model
        assert got["save"] - got["before"] < got["whole"] / 8, (rank, got)
    assert (tmp_path / "run" / "model.safetensors").is_file()


def test_every_use_command_and_a_fine_tune_read_the_sharded_runs_file(runs: Any, tmp_path: Path, capsys) -> None:
    from gputrain.cli import main
    from gputrain.config import load_config
    from gputrain.data import build_data
    from gputrain.models import build_model
    from gputrain.models.weights import load_weights

    root, held = runs
    run = root / "fsdp-gpt"
    out = tmp_path / "export"
    assert main(["export", str(run), "--format", "safetensors", "-o", str(out)]) == 0  # verified bitwise
    assert (out / "model.safetensors").read_bytes() == (run / "model.safetensors").read_bytes()
    capsys.readouterr()
    assert main(["generate", str(run), "--prompt", "1 4 13", "--max-new-tokens", "3", "--temperature", "0",
                 "--device", "cpu"]) == 0
    assert capsys.readouterr().out.split()[:3] == ["1", "4", "13"]
    assert main(["bench-infer", str(run), "--modes", "eager", "--repeats", "2", "--batch", "1", "--device", "cpu",
                 "--threads", "1"]) == 0
    # `model.weights`: a new run starting from the file (its tie loaded into both names)
    config = load_config(None, [*QUICK, *GPT, f"model.weights={run / 'model.safetensors'}"])
    model = build_model(config.model, build_data(config.data, config.train.seed).spec)
    load_weights(model, str(run / "model.safetensors"))
    whole = _oracle([h["fsdp-gpt"] for h in held])
    assert model.get_parameter("wte.weight") is model.get_parameter("lm_head.weight")
    for name, tensor in model.state_dict().items():
        assert torch.equal(tensor, whole[name]), name
