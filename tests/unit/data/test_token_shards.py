"""data.name=tokens on a prepared folder (issue 30 §3): each split one stream over its shards, read
through memory maps; windows that span a shard boundary; the vocabulary and the tokenizer hash from
the manifest; the nanoGPT .bin as a stream of one shard; and a corpus larger than the process may
hold in memory trains. The bad folders, one line each: tests/adversarial/test_token_shards.py."""

from __future__ import annotations

import json
import pickle
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from gputrain.config import load_config
from gputrain.data import build_data
from gputrain.data import prepared as prepared_module
from gputrain.data.registry import DataBundle
from gputrain.data.token_stream import TokenStream
from gputrain.errors import ConfigError, DataError
from tests.unit.data.files import write_tokens
from tests.unit.data.prepared_files import TOKENIZER_HASH, token_ids, write_prepared

ROOT = Path(__file__).resolve().parents[3]


def _build(path: Path, **fields: Any) -> DataBundle:
    config = load_config({"data.name": "tokens", "data.path": str(path), **{f"data.{k}": v for k, v in fields.items()}})
    return build_data(config.data, seed=0)


def _uneven(ids: np.ndarray, cuts: list[int]) -> list[np.ndarray]:
    return [ids[a:b] for a, b in zip([0, *cuts], [*cuts, len(ids)])]


def test_windows_across_shard_boundaries_equal_the_concatenations(tmp_path: Path) -> None:
    ids = token_ids(1000, vocab=300)
    # uneven shards, one empty and one shorter than a window: the stream is their concatenation
    folder = write_prepared(tmp_path / "p", _uneven(ids, [37, 37, 50, 401, 700]), [token_ids(100, 300, 1)],
                            vocab_size=300)
    bundle = _build(folder, seq_len=16)
    assert len(bundle.train) == 999 // 16 and len(bundle.val) == 99 // 16 and bundle.test is None
    for i in range(len(bundle.train)):
        x, y = bundle.train[i]
        assert x.dtype == torch.int64 and torch.equal(x, torch.from_numpy(ids[16 * i:16 * i + 16])), i
        assert torch.equal(y, torch.from_numpy(ids[16 * i + 1:16 * i + 17])), i
    # a micro-batch read at once (what the loader calls) is the same windows
    order = [5, 2, 61, 2, 0, 25]
    batch = bundle.train.__getitems__(order)
    assert all(torch.equal(b[0], bundle.train[i][0]) and torch.equal(b[1], bundle.train[i][1])
               for b, i in zip(batch, order))


def test_the_stream_reads_across_many_shards_and_names_where_a_token_is(tmp_path: Path) -> None:
    ids = token_ids(300, vocab=1000)
    files = []
    for k, part in enumerate(_uneven(ids, [1, 2, 100, 101, 299])):
        files.append(tmp_path / f"s{k}.bin")
        part.astype(np.uint32).tofile(files[-1])
    stream = TokenStream(files, "uint32", [1, 1, 98, 1, 198, 1])
    assert len(stream) == 300
    assert np.array_equal(stream.read(0, 300), ids)
    assert np.array_equal(stream.gather([0, 1, 99, 250], 50), np.stack([ids[s:s + 50] for s in (0, 1, 99, 250)]))
    assert stream.locate(0) == (files[0], 0) and stream.locate(100) == (files[3], 0)
    assert stream.locate(150) == (files[4], 49)
    with pytest.raises(ValueError, match="run past the end"):
        stream.read(290, 11)
    # a worker gets the stream without its maps (a DataLoader pickles the data set), and maps its own
    clone = pickle.loads(pickle.dumps(stream))
    assert clone._maps == [None] * 6 and np.array_equal(clone.read(95, 10), ids[95:105])


def test_a_single_bin_is_a_stream_of_one_shard_read_as_before(tmp_path: Path) -> None:
    path = write_tokens(tmp_path / "train.bin", 1000, vocab=300)
    tokens = np.fromfile(path, dtype=np.uint16).astype(np.int64)
    bundle = _build(path, seq_len=16, val_fraction=0.1, test_fraction=0.0)
    assert bundle.train.stream.files == (path,) and bundle.train.path == path
    assert bundle.tokenizer is None and bundle.tokenizer_hash is None
    batch = bundle.train.__getitems__([3, 0, 7])
    for (x, y), i in zip(batch, [3, 0, 7]):
        assert torch.equal(x, torch.from_numpy(tokens[16 * i:16 * i + 16]))
        assert torch.equal(y, torch.from_numpy(tokens[16 * i + 1:16 * i + 17]))


def test_the_vocabulary_and_the_tokenizer_hash_come_from_the_manifest(tmp_path: Path) -> None:
    folder = write_prepared(tmp_path / "p", [token_ids(500, vocab=40)], vocab_size=512)
    bundle = _build(folder, seq_len=8)
    assert bundle.spec.vocab_size == 512  # the tokenizer's, not the largest id seen (39)
    assert bundle.tokenizer_hash == TOKENIZER_HASH
    assert _build(folder, seq_len=8, vocab_size=512).spec.vocab_size == 512
    assert _build(folder / "manifest.json", seq_len=8).train.path == folder  # the manifest itself: its folder
    with pytest.raises(ConfigError, match=r"^config error: data.vocab_size = 600: disagrees with .*manifest.json "
                                          r"\(vocab_size 512, its tokenizer's\); leave it unset"):
        _build(folder, seq_len=8, vocab_size=600)


def test_uint32_ids_beyond_65535_are_read_as_they_are(tmp_path: Path) -> None:
    ids = token_ids(400, vocab=100) + 70_000
    folder = write_prepared(tmp_path / "p", _uneven(ids, [133]), vocab_size=100_000, dtype="uint32")
    bundle = _build(folder, seq_len=10, vocab_size=100_000)
    assert bundle.spec.vocab_size == 100_000
    assert torch.equal(bundle.train[13][0], torch.from_numpy(ids[130:140]))


def test_without_a_usable_val_split_validation_comes_from_the_end_of_train(tmp_path: Path) -> None:
    ids = token_ids(1000)
    folder = write_prepared(tmp_path / "p", [ids], [token_ids(5, seed=1)])  # val: shorter than one window
    bundle = _build(folder, seq_len=16, val_fraction=0.1, test_fraction=0.0)
    assert len(bundle.train) + len(bundle.val) == 999 // 16 and bundle.test is None
    first = len(bundle.train)
    assert torch.equal(bundle.val[0][0], torch.from_numpy(ids[16 * first:16 * first + 16]))


def test_the_prepared_folders_tokenizer_goes_into_the_bundle(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Loaded through part T's load_tokenizer (the hook), from the folder the manifest names."""
    loaded: list[Path] = []

    def load(path: Path) -> object:
        loaded.append(path)
        return type("Tok", (), {"hash": TOKENIZER_HASH})()

    monkeypatch.setattr(prepared_module, "read_tokenizer", load)
    monkeypatch.setattr("gputrain.data.tokens.read_tokenizer", load)
    folder = write_prepared(tmp_path / "p", [token_ids(200)])
    assert _build(folder, seq_len=8).tokenizer is None and not loaded  # the folder holds none
    (folder / "tokenizer").mkdir()
    bundle = _build(folder, seq_len=8)
    assert loaded == [folder / "tokenizer"] and bundle.tokenizer.hash == TOKENIZER_HASH


def test_a_tokenizer_the_user_names_must_be_the_one_the_shards_were_made_with(tmp_path: Path) -> None:
    folder = write_prepared(tmp_path / "p", [token_ids(200)])
    prepared = prepared_module.read_prepared(folder)
    same, other = (type("Tok", (), {"hash": h})() for h in (TOKENIZER_HASH, "sha256:" + "cd" * 32))
    prepared_module.check_tokenizer(prepared, same, "tok.json")  # agrees: nothing to say
    with pytest.raises(DataError) as err:
        prepared_module.check_tokenizer(prepared, other, "tok.json")
    assert str(err.value) == (
        f"{folder / 'manifest.json'}: shards from another tokenizer: made by {TOKENIZER_HASH}, but data.tokenizer "
        f"(tok.json) is sha256:{'cd' * 32}; prepare the corpus again with it, or leave data.tokenizer unset"
    )


def test_each_rank_reads_only_its_own_windows_and_together_the_global_batch(tmp_path: Path) -> None:
    """Through the real feed: 2 ranks × 2 accumulation steps read, between them, exactly the windows
    one process reads for the same global batch, each window once, in the same order."""
    from gputrain.data.batches import BatchPlan
    from gputrain.data.feed import BatchFeed

    ids = np.arange(16 * 64 + 1)  # every window its own tokens
    folder = write_prepared(tmp_path / "p", _uneven(ids, [300, 301, 900]), [ids[:40]], vocab_size=2000)
    train = _build(folder, seq_len=16).train
    assert len(train) == 64

    def steps(rank: int, ranks: int, accum: int) -> list[list[torch.Tensor]]:
        plan = BatchPlan(len(train), 16, accum, dp_rank=rank, dp_size=ranks, seed=7)
        feed = BatchFeed(train, plan, torch.device("cpu"), num_workers=0)
        return [[x for x, _ in group] for group in feed.epoch(1, start_step=1)]

    one = steps(0, 1, 1)
    ranks = [steps(r, 2, 2) for r in range(2)]
    assert len(one) == len(ranks[0]) == len(ranks[1]) == 64 // 16 - 1
    for s, (whole,) in enumerate(one):
        # accumulation chunk j of the global batch: rank 0's 4 windows, then rank 1's
        parts = [ranks[r][s][j] for j in range(2) for r in range(2)]
        assert all(len(p) == 4 for p in parts)
        assert torch.equal(torch.cat(parts), whole)
    read = torch.cat([x for r in ranks for group in r for x in group])
    assert len({tuple(row.tolist()) for row in read}) == len(read)  # no window read twice


def test_a_loader_worker_maps_the_shards_itself_and_reads_the_same_batches(tmp_path: Path) -> None:
    from gputrain.data.batches import BatchPlan
    from gputrain.data.feed import BatchFeed

    folder = write_prepared(tmp_path / "p", _uneven(token_ids(16 * 32 + 1), [100, 333]), [token_ids(40, seed=1)])
    train = _build(folder, seq_len=16).train
    train[0]  # mapped here first: the worker must not inherit (or be sent) this process's maps
    batches = {}
    for workers in (0, 1):
        feed = BatchFeed(train, BatchPlan(len(train), 8, 1, seed=1), torch.device("cpu"), num_workers=workers)
        try:
            batches[workers] = [torch.cat([x for x, _ in group]) for group in feed.epoch(0)]
        finally:
            feed.close()
    assert len(batches[0]) == 4 and all(torch.equal(a, b) for a, b in zip(batches[0], batches[1]))


def test_the_workers_probe_times_a_batch_read_as_the_loader_reads_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """Token windows read a micro-batch at once (`__getitems__`): data.num_workers=auto times that read,
    not 64 single reads, and keeps a cheap batch in the training process."""
    from gputrain.data import feed
    from tests.sim_clock import SimClock

    monkeypatch.setattr(feed.os, "sched_getaffinity", lambda pid: set(range(4)), raising=False)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "1")
    clock = SimClock()

    class Windows(torch.utils.data.Dataset):
        def __len__(self) -> int:
            return 4096

        def __getitem__(self, i: int) -> torch.Tensor:
            clock.advance(20e-6)  # a window alone: 64 of them cost 1.3 ms
            return torch.zeros(8)

        def __getitems__(self, indices: list[int]) -> list[torch.Tensor]:
            clock.advance(50e-6)  # the whole micro-batch in one pass
            return [torch.zeros(8) for _ in indices]

    assert feed.auto_num_workers("auto", Windows(), micro_batch=64, clock=clock) == 0
    del Windows.__getitems__
    assert feed.auto_num_workers("auto", Windows(), micro_batch=64, clock=clock) == 3


_LIMITED = textwrap.dedent("""
    import resource, sys
    import numpy as np
    from gputrain import Trainer

    def vm_data() -> int:
        status = open("/proc/self/status").read()
        return int(status.split("VmData:")[1].split()[0]) * 1024

    mode, folder, run_dir = sys.argv[1:]
    headroom = 384 << 20  # the corpus is 1 GiB
    resource.setrlimit(resource.RLIMIT_DATA, (vm_data() + headroom, resource.RLIM_INFINITY))
    if mode == "load":
        try:
            parts = [np.fromfile(f"{folder}/train-{k:05d}.bin", dtype=np.uint16) for k in range(2)]
        except MemoryError:
            print("MemoryError")
            sys.exit(3)
        print("loaded", sum(len(p) for p in parts))
        sys.exit(0)
    summary = Trainer.from_config({
        "model.name": "gpt", "model.n_layer": 1, "model.n_head": 2, "model.d_model": 16, "data.name": "tokens",
        "data.path": folder, "data.seq_len": 16, "data.num_workers": 0, "train.batch_size": 8, "train.max_steps": 3,
        "train.device": "cpu", "log.progress": "none", "log.tensorboard": False, "eval.every_epochs": 0,
        "checkpoint.enabled": False}, run_dir=run_dir).fit()
    print("trained", summary["global_step"], vm_data() >> 20)
""")


def test_a_corpus_larger_than_the_process_may_hold_trains(tmp_path: Path) -> None:
    """1 GiB of shards (sparse files: no disk, ids 0) against a data limit of 384 MiB above what the
    process holds after its imports: loading the shards fails, training from their maps does not."""
    folder = write_prepared(tmp_path / "p", [np.zeros(16, np.int64)] * 2, [token_ids(200, seed=1)])
    half = 1 << 28  # tokens per shard: 512 MiB of uint16 each
    for k in range(2):
        with open(folder / f"train-{k:05d}.bin", "r+b") as file:
            file.truncate(half * 2)

    def edit(m: dict) -> None:
        m["splits"]["train"]["tokens"] = 2 * half
        for shard in m["splits"]["train"]["shards"]:
            shard["tokens"] = half

    from tests.unit.data.prepared_files import edit_manifest

    edit_manifest(folder, edit)
    script = tmp_path / "limited.py"
    script.write_text(_LIMITED)
    env = {"PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin"}

    def run(mode: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, str(script), mode, str(folder), str(tmp_path / "run")], env=env,
                              capture_output=True, text=True, timeout=300)

    loading = run("load")
    assert loading.returncode == 3 and loading.stdout.strip() == "MemoryError", loading.stderr[-2000:]
    training = run("train")
    assert training.returncode == 0, training.stderr[-3000:]
    assert training.stdout.split()[:2] == ["trained", "3"], training.stdout


def test_evaluate_on_a_prepared_folder_streams_its_val_split(tmp_path: Path) -> None:
    """`gputrain evaluate RUN data.path=FOLDER`: the folder's val split, read from its shards as training
    reads it (the same figures as the run's own validation on it); ids beyond the model's vocabulary
    are one line naming the shard."""
    from gputrain import Trainer
    from gputrain.use.evaluate import evaluate_run

    ids = token_ids(3000, vocab=50)
    folder = write_prepared(tmp_path / "p", [ids[:1000], ids[1000:]], [token_ids(400, seed=1)])
    run = tmp_path / "run"
    summary = Trainer.from_config({
        "model.name": "gpt", "model.n_layer": 1, "model.n_head": 2, "model.d_model": 16, "data.name": "tokens",
        "data.path": str(folder), "data.seq_len": 16, "train.batch_size": 8, "train.max_steps": 4,
        "train.device": "cpu", "log.progress": "none", "log.tensorboard": False, "checkpoint.enabled": False},
        run_dir=run).fit()
    result = evaluate_run(run, device="cpu", overrides=[f"data.path={folder / 'manifest.json'}"])
    assert result.metrics["loss"] == pytest.approx(summary["val"]["loss"], rel=1e-6)
    bad = write_prepared(tmp_path / "bad", [ids], [np.full(40, 60)], vocab_size=64)
    with pytest.raises(DataError, match=rf"^{bad / 'val-00000.bin'}: holds token id 60, but the model's vocabulary "
                                        r"is 0\.\.49; the model's vocabulary is fixed$"):
        evaluate_run(run, device="cpu", overrides=[f"data.path={bad}"])


def test_a_run_stopped_mid_epoch_resumes_bit_for_bit(tmp_path: Path) -> None:
    """One process, stopped at step 3 of a 5-step epoch and run again to step 8 (into the next epoch):
    the weights of the unbroken run, exactly. (Other world sizes: tests/dist/test_token_shards.py.)"""
    from safetensors.torch import load_file

    from gputrain import Trainer

    ids = token_ids(16 * 40 + 1, vocab=50)
    folder = write_prepared(tmp_path / "p", [ids[:300], ids[300:]], [token_ids(100, seed=1)])

    def run(run_dir: Path, steps: int) -> None:
        Trainer.from_config({
            "model.name": "gpt", "model.n_layer": 1, "model.n_head": 2, "model.d_model": 16, "data.name": "tokens",
            "data.path": str(folder), "data.seq_len": 16, "train.batch_size": 8, "train.max_steps": steps,
            "train.epochs": 5, "checkpoint.every_steps": 3, "train.device": "cpu", "log.progress": "none",
            "log.tensorboard": False, "log.every_steps": 1, "eval.every_epochs": 0}, run_dir=run_dir).fit()

    run(tmp_path / "straight", 8)
    run(tmp_path / "resumed", 3)
    run(tmp_path / "resumed", 8)
    a, b = load_file(tmp_path / "straight" / "model.safetensors"), load_file(tmp_path / "resumed" / "model.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    rows = (tmp_path / "resumed" / "metrics.jsonl").read_text().splitlines()
    steps = [row["step"] for row in map(json.loads, rows) if "split" not in row]
    assert steps == list(range(1, 9))  # resumed at step 4, not trained again from the start
