import pytest
import torch

from gputrain.config import load_config
from gputrain.data import TensorData, build_data
from gputrain.data.tensors import split_indices
from gputrain.errors import ConfigError, DataError
from tests.digits_sizes import digits_split_sizes


def _data(**overrides):
    config = load_config(None, {f"data.{k}": v for k, v in overrides.items()})
    return build_data(config.data, seed=0)


def test_digits_split_is_seeded_and_disjoint():
    from sklearn.datasets import load_digits

    n = len(load_digits().target)  # scikit-learn's own loader, not gputrain's reading of its file
    assert n == 1797
    data = load_config(None).data
    val_fraction, test_fraction = data.val_fraction, data.test_fraction
    n_test, n_val = round(n * test_fraction), round(n * val_fraction)
    bundle = _data()
    sizes = (len(bundle.train), len(bundle.val), len(bundle.test))
    assert sizes == (n - n_val - n_test, n_val, n_test) and sum(sizes) == n
    assert sizes == digits_split_sizes()  # what the other tests use instead of constants
    assert bundle.spec.input_shape == (1, 8, 8) and bundle.spec.num_classes == 10
    train, val, test = split_indices(n, val_fraction, test_fraction, seed=0)
    assert (len(train), len(val), len(test)) == sizes
    assert len(set(train.tolist()) | set(val.tolist()) | set(test.tolist())) == n
    assert torch.equal(split_indices(n, val_fraction, test_fraction, seed=0)[0], train)
    assert not torch.equal(split_indices(n, val_fraction, test_fraction, seed=1)[0], train)


def test_normalisation_uses_training_statistics_only():
    bundle = _data()
    train = bundle.train.inputs
    assert abs(float(train.mean())) < 1e-4 and abs(float(train.std()) - 1) < 1e-3
    # the other splits are scaled with the train statistics, so theirs are not exactly 0 / 1
    assert abs(float(bundle.test.inputs.mean())) > 1e-4


def test_csv_with_header_and_string_labels(tmp_path):
    path = tmp_path / "iris.csv"
    rows = ["sepal,petal,species"] + [f"{i % 7}.5,{i % 3}.0,{['setosa', 'virginica'][i % 2]}" for i in range(40)]
    path.write_text("\n".join(rows) + "\n")
    bundle = _data(name="csv", path=str(path), val_fraction=0.0, test_fraction=0.25)
    assert bundle.spec.task == "classification" and bundle.spec.num_classes == 2
    assert bundle.spec.input_shape == (2,) and len(bundle.train) == 30 and bundle.val is None
    assert set(bundle.train.targets.tolist()) == {0, 1}


def test_csv_without_header_and_label_column_by_name(tmp_path):
    path = tmp_path / "t.csv"
    path.write_text("\n".join(f"{i},{i * 2},{i % 3}" for i in range(30)) + "\n")
    assert _data(name="csv", path=str(path)).spec.num_classes == 3
    named = tmp_path / "named.csv"
    named.write_text("y,a,b\n" + "\n".join(f"{i % 2},{i},{i * 3}" for i in range(30)) + "\n")
    bundle = _data(name="csv", path=str(named), label_column="y")
    assert bundle.spec.num_classes == 2 and bundle.spec.input_shape == (2,)


def test_csv_fractional_labels_make_a_regression(tmp_path):
    path = tmp_path / "r.csv"
    path.write_text("x,y\n" + "\n".join(f"{i},{i * 0.5 + 0.25}" for i in range(30)) + "\n")
    bundle = _data(name="csv", path=str(path))
    assert bundle.spec.task == "regression" and bundle.train.targets.dtype == torch.float32


def test_csv_errors_name_file_line_and_column(tmp_path):
    path = tmp_path / "bad.csv"
    path.write_text("a,b,label\n1,2,x\n3,4,y\n5,,z\n")
    with pytest.raises(DataError, match=r"bad.csv: line 4, column 'b': empty \(a missing value\); feature cells"):
        _data(name="csv", path=str(path))
    path.write_text("a,b,label\n1,2\n")
    with pytest.raises(DataError, match=r"line 2 has 2 columns, expected 3 as the header \(line 1\)$"):
        _data(name="csv", path=str(path))
    with pytest.raises(ConfigError, match="data.label_column"):
        _data(name="csv", path=str(tmp_path / "bad.csv"), label_column="nope")
    with pytest.raises(ConfigError, match="data.path"):
        _data(name="csv")


@pytest.mark.parametrize("overrides, shape, task", [
    ({"shape": [3, 16, 16]}, (3, 16, 16), "classification"),
    ({"shape": [12], "task": "regression"}, (12,), "regression"),
    ({"task": "lm", "seq_len": 16, "vocab_size": 50}, (16,), "lm"),
])
def test_synthetic_shapes_and_tasks(overrides, shape, task):
    bundle = _data(name="synthetic", num_samples=64, **overrides)
    assert isinstance(bundle.train, TensorData)
    assert bundle.spec.input_shape == shape and bundle.spec.task == task
    x, y = bundle.train[0]
    assert tuple(x.shape) == shape
    if task == "lm":
        assert torch.equal(bundle.train.inputs[:, 1:], bundle.train.targets[:, :-1])
