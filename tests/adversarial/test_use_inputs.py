"""The inputs of the `use` commands as a careless user or an attacker gives them (issue 34): predict's
`.npy` arrays (complex, big-endian with NaN, empty, 0-d, a zip, a pickle, truncated...), CSV files
wider than any table (predict, evaluate's data.path and train's data.path), image inputs that are no
images, generate's prompt and options (a denormal temperature, a seed torch cannot take, more tokens
or samples than the bounds) and bench-infer's batch sizes and repeats.

Each case goes through the command's entry point and asserts exit 2 and one line holding the case's
key words, never a traceback; the refusals that bound work come before the work (the run is not even
loaded for an option out of bounds, and a wide CSV file is refused from its first row).
"""

from __future__ import annotations

import pickle
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from gputrain.cli import main
from tests.unit.use.conftest import tiny_run  # noqa: F401  (the tiny trained runs, one per session)

Make = Callable[[Path], Path]


def _npy(array: np.ndarray) -> Make:
    def make(tmp: Path) -> Path:
        np.save(tmp / "in.npy", array, allow_pickle=True)
        return tmp / "in.npy"

    return make


def _bytes(name: str, data: bytes) -> Make:
    def make(tmp: Path) -> Path:
        (tmp / name).write_bytes(data)
        return tmp / name

    return make


def _npz_as_npy(tmp: Path) -> Path:
    with (tmp / "in.npy").open("wb") as f:
        np.savez(f, x=np.ones((2, 3), dtype=np.float32))
    return tmp / "in.npy"


def _truncated(tmp: Path) -> Path:
    np.save(tmp / "in.npy", np.ones((50, 3), dtype=np.float32))
    data = (tmp / "in.npy").read_bytes()
    (tmp / "in.npy").write_bytes(data[:-100])
    return tmp / "in.npy"


def _wide_csv(columns: int, header: bool = True) -> Make:
    def make(tmp: Path) -> Path:
        names = ",".join(f"f{i}" for i in range(columns)) + "\n" if header else ""
        (tmp / "wide.csv").write_text(names + (",".join("1" for _ in range(columns)) + "\n") * 3)
        return tmp / "wide.csv"

    return make


def _empty_folder(tmp: Path) -> Path:
    (tmp / "images" / ".hidden").mkdir(parents=True)
    (tmp / "images" / "notes.txt").write_text("no images here")
    return tmp / "images"


BE_NAN = np.array([[1.0, np.nan, 3.0]], dtype=">f8")
I64_HUGE = np.array([[2**62, 1, 1]], dtype=np.int64)

# (id, tiny run, make the input (or None), the command line after the run dir ({input}: the made path),
#  the key words of the one line)
CASES: list[tuple[str, str, Make | None, list[str], list[str]]] = [
    # predict: .npy arrays, decided from numpy's header, then the values
    ("npy-complex", "csv_mlp", _npy(np.ones((2, 3), np.complex128)), [], ["in.npy", "complex numbers", "[N, 3]"]),
    ("npy-big-endian-nan", "csv_mlp", _npy(BE_NAN), [], ["sample 0 holds nan at [1]", "finite"]),
    ("npy-zero-rows", "csv_mlp", _npy(np.ones((0, 3), np.float32)), [], ["0 samples", "at least one"]),
    ("npy-empty-1-d", "csv_mlp", _npy(np.ones((0,), np.float32)), [], ["float32 [0]", "[N, 3]"]),
    ("npy-0-d", "csv_mlp", _npy(np.array(2.0)), [], ["a single number", "0-d"]),
    ("npy-inf", "csv_mlp", _npy(np.array([[1.0, 2.0, np.inf]])), [], ["holds inf at [2]"]),
    ("npy-beyond-float32", "csv_mlp", _npy(np.array([[1.0, -1e39, 0.0]])), [], ["-1e+39", "±3.4e+38"]),
    ("npy-object", "csv_mlp", _npy(np.array([[1, 2, 3]], dtype=object)), [], ["Python objects", "plain numbers"]),
    ("npy-text", "csv_mlp", _npy(np.array([["1", "2", "3"]])), [], ["an array of text"]),
    ("npy-structured", "csv_mlp", _npy(np.zeros(2, dtype=[("a", "f4"), ("b", "f4"), ("c", "f4")])), [],
     ["structured records (fields a, b, c)"]),
    ("npy-bool", "csv_mlp", _npy(np.ones((2, 3), dtype=bool)), [], ["booleans"]),
    ("npy-datetime", "csv_mlp", _npy(np.zeros((2, 3), dtype="datetime64[D]")), [], ["dates"]),
    ("npy-3-d-for-rows", "csv_mlp", _npy(np.ones((2, 3, 1), np.float32)), [], ["float32 [2, 3, 1]", "[N, 3]"]),
    ("npy-wrong-width", "csv_mlp", _npy(np.ones((4, 7), np.float32)), [],
     ["float32 [4, 7]", "feature columns a, b, c"]),
    ("npy-is-a-zip", "csv_mlp", _npz_as_npy, [], [".npz archive", "numpy.save"]),
    ("npy-is-a-pickle", "csv_mlp", _bytes("in.npy", pickle.dumps([[1.0, 2.0, 3.0]])), [], ["a pickle"]),
    ("npy-is-text", "csv_mlp", _bytes("in.npy", b"1,2,3\n"), [], ["not a .npy array"]),
    ("npy-empty-file", "csv_mlp", _bytes("in.npy", b""), [], ["not a .npy array"]),
    ("npy-truncated", "csv_mlp", _truncated, [], ["truncated", "600 bytes of data"]),
    ("npy-damaged-header", "csv_mlp", _bytes("in.npy", b"\x93NUMPY\x01\x00\x10\x00{'descr': 'zz'}   \n"), [],
     ["damaged .npy header"]),
    ("npy-images-3-channels", "digits_cnn", _npy(np.zeros((2, 3, 8, 8), np.float32)), [],
     ["float32 [2, 3, 8, 8]", "[N, 1, 8, 8]"]),
    ("npy-images-one-sample-nan", "digits_cnn", _npy(np.full((1, 8, 8), np.nan, np.float32)), [],
     ["sample 0 holds nan at [0, 0, 0]"]),
    ("npy-int64-huge-is-finite-but-bounded", "digits_cnn", _npy(np.full((1, 1, 8, 8), 2**62, np.int64)), [], []),
    # predict and evaluate: CSV files wider than a table, refused from the first row
    ("csv-100k-columns", "csv_mlp", _wide_csv(100_000), [], ["100,000 columns", "at most 10,000", "MAX_COLUMNS"]),
    ("csv-headerless-20k-columns", "csv_mlp", _wide_csv(20_000, header=False), [], ["20,000 columns"]),
    ("csv-wrong-count-headerless", "csv_mlp", _wide_csv(7, header=False), [], ["7 columns", "3 features"]),
    ("csv-for-an-image-run", "digits_cnn", _wide_csv(3), [], ["not trained on CSV data"]),
    ("evaluate-csv-100k-columns", "csv_mlp", _wide_csv(100_000), ["evaluate", "data.path={input}"],
     ["100,000 columns", "MAX_COLUMNS"]),
    ("evaluate-empty-text", "text_gpt", _bytes("new.txt", b""), ["evaluate", "data.path={input}"],
     ["new.txt: the file is empty"]),
    ("evaluate-text-not-utf8", "text_gpt", _bytes("new.txt", b"abc\xff"), ["evaluate", "data.path={input}"],
     ["not UTF-8"]),
    ("evaluate-text-outside-the-characters", "text_gpt", _bytes("new.txt", "abc\u2603".encode()),
     ["evaluate", "data.path={input}"], ["outside the model's vocabulary"]),
    # predict: images
    ("images-folder-without-images", "digits_cnn", _empty_folder, [], ["no image files"]),
    ("image-that-is-text", "digits_cnn", _bytes("x.png", b"not a png"), [], ["x.png"]),
    ("images-for-a-table-run", "csv_mlp", _bytes("x.png", b"not a png"), [], ["not trained on images"]),
    ("npy-for-a-language-model", "text_gpt", _npy(np.ones((1, 16))), [], ["language model", "gputrain generate"]),
    # generate: options bounded before the run is loaded
    *[
        (f"generate-temperature-{text}", "text_gpt", None, ["generate", "--prompt", "a", "--temperature", text],
         ["--temperature", "give 0 (greedy", "0.0001 to 100"])
        for text in ("5e-324", "1e-310", "0.00001", "nan", "inf", "-1", "1e6")
    ],
    ("generate-temperature-text", "text_gpt", None, ["generate", "--prompt", "a", "--temperature", "hot"],
     ["--temperature", "'hot': not a number"]),
    *[
        (f"generate-seed-{name}", "text_gpt", None, ["generate", "--prompt", "a", "--seed", text],
         ["--seed", "-2**63..2**64-1"])
        for name, text in (("2**70", str(2**70)), ("2**64", str(2**64)), ("below-2**63", str(-(2**63) - 1)))
    ],
    ("generate-seed-fraction", "text_gpt", None, ["generate", "--prompt", "a", "--seed", "0.5"],
     ["--seed", "not a whole number"]),
    ("generate-tokens-over-the-bound", "text_gpt", None, ["generate", "--prompt", "a", "--max-new-tokens", "100001"],
     ["--max-new-tokens", "1..100,000", "MAX_NEW_TOKENS"]),
    ("generate-tokens-10**30", "text_gpt", None, ["generate", "--prompt", "a", "--max-new-tokens", str(10**30)],
     ["--max-new-tokens", "MAX_NEW_TOKENS"]),
    ("generate-zero-tokens", "text_gpt", None, ["generate", "--prompt", "a", "--max-new-tokens", "0"],
     ["--max-new-tokens", "outside 1.."]),
    ("generate-samples-over-the-bound", "text_gpt", None, ["generate", "--prompt", "a", "--num-samples", "5000"],
     ["--num-samples", "MAX_NUM_SAMPLES"]),
    ("generate-too-many-tokens-to-hold", "text_gpt", None,
     ["generate", "--prompt", "a", "--num-samples", "1000", "--max-new-tokens", "20000"],
     ["20,000,000 tokens to hold", "MAX_TOKENS_HELD"]),
    ("generate-top-k-0", "text_gpt", None, ["generate", "--prompt", "a", "--top-k", "0"], ["--top-k"]),
    # generate: prompts the model cannot read
    ("generate-empty-prompt", "text_gpt", None, ["generate", "--prompt", ""], ["--prompt is empty"]),
    ("generate-prompt-outside-the-characters", "text_gpt", None, ["generate", "--prompt", "ab\u2603"],
     ["outside the model's vocabulary", "'\u2603'"]),
    ("generate-ids-outside-the-vocabulary", "tokens_gpt", None, ["generate", "--prompt", "1 2 50"],
     ["token id 50 is outside the vocabulary (0..49)"]),
    ("generate-negative-id", "tokens_gpt", None, ["generate", "--prompt", "1 -1"], ["token id -1"]),
    ("generate-huge-id", "tokens_gpt", None, ["generate", "--prompt", str(2**70)], [f"token id {2**70}"]),
    ("generate-only-separators", "tokens_gpt", None, ["generate", "--prompt", " , ,"], ["no token ids"]),
    ("generate-other-script-digits", "tokens_gpt", None, ["generate", "--prompt", "\u0661\u0662"],
     ["reads token ids (0..49)"]),
    ("generate-underscore-digits", "tokens_gpt", None, ["generate", "--prompt", "1_0"], ["reads token ids"]),
    ("generate-5000-digit-id", "tokens_gpt", None, ["generate", "--prompt", "9" * 5000],
     ["token id 99999999999999999999...(5000 digits) is outside"]),
    ("generate-long-words-prompt-shown-short", "tokens_gpt", None, ["generate", "--prompt", "ab " * 5000],
     ["'ab ab ab", "...': this model reads token ids"]),
    ("generate-words-for-an-id-model", "tokens_gpt", None, ["generate", "--prompt", "hello"],
     ["reads token ids (0..49)"]),
    ("generate-for-a-table-run", "csv_mlp", None, ["generate", "--prompt", "a"], ["not a language model"]),
    # bench-infer: the work it is asked for, bounded
    ("bench-batch-huge", "csv_mlp", None, ["bench-infer", "--batch", "1,1000000"], ["--batch", "MAX_BENCH_BATCH"]),
    ("bench-batch-zero", "csv_mlp", None, ["bench-infer", "--batch", "0"], ["--batch", "outside 1..8,192"]),
    ("bench-batch-many-sizes", "csv_mlp", None, ["bench-infer", "--batch", ",".join(map(str, range(1, 40)))],
     ["39 batch sizes", "MAX_BENCH_SIZES"]),
    ("bench-batch-words", "csv_mlp", None, ["bench-infer", "--batch", "big"], ["give batch sizes as 1,32"]),
    ("bench-repeats-huge", "csv_mlp", None, ["bench-infer", "--repeats", str(10**12)],
     ["--repeats", "MAX_BENCH_REPEATS"]),
]


def _exit_and_line(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    try:
        code = main(args)
    except SystemExit as err:  # argparse's usage errors
        code = err.code if isinstance(err.code, int) else 1
    err_text = capsys.readouterr().err.strip()
    assert "Traceback" not in err_text, err_text
    lines = err_text.splitlines()
    assert len(lines) == 1, err_text
    return code, lines[0]


@pytest.mark.parametrize(("run", "make", "args", "words"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_inputs_out_of_bounds_are_one_line_and_exit_2(
    tiny_run, tmp_path: Path, capsys, run: str, make: Make | None, args: list[str], words: list[str]  # noqa: F811
) -> None:
    run_dir = str(tiny_run(run))
    made = str(make(tmp_path)) if make is not None else ""
    if not args or args[0] not in ("evaluate", "generate", "bench-infer"):
        args = ["predict", run_dir, made, *args, "--device", "cpu"]
    else:
        args = [args[0], run_dir, *(a.replace("{input}", made) for a in args[1:])]
        if args[0] != "bench-infer":
            args += ["--device", "cpu"]
    if not words:  # a value within float32 and int64 alike: read, not refused
        assert main(args) == 0
        capsys.readouterr()
        return
    code, line = _exit_and_line(args, capsys)
    assert code == 2, line
    if "cannot decode image" not in line:  # Pillow's own reason names the image file again, quoted
        assert not made or line.count(made) <= 1, line  # the file named once
    for word in words:
        assert word in line, (word, line)


def test_train_refuses_a_csv_file_of_a_million_columns_from_its_first_row(tmp_path: Path, capsys) -> None:
    path = _wide_csv(1_000_000, header=False)(tmp_path)
    args = ["train", "data.name=csv", f"data.path={path}", "model.name=mlp", "train.device=cpu", "log.progress=none",
            "--run-dir", str(tmp_path / "run")]
    code, line = _exit_and_line(args, capsys)
    assert code == 2 and "1,000,000 columns on its first row" in line and "MAX_COLUMNS" in line, line


def test_a_long_generation_into_a_file_reports_its_end_on_stderr(tiny_run, capsys) -> None:  # noqa: F811
    """Its text goes to a pipe here (not a terminal): progress on stderr, at least its final line."""
    run_dir = str(tiny_run("text_gpt"))
    assert main(["generate", run_dir, "--prompt", "a", "--max-new-tokens", "1000", "--device", "cpu"]) == 0
    out, err = capsys.readouterr()
    assert len(out) >= 1000
    assert err.strip().splitlines()[-1].startswith("generate: 1,000/1,000 new tokens, ")
    assert err.strip().endswith("(done)")
