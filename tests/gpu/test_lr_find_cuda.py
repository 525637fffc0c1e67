"""`gputrain lr-find` in every precision on a CUDA GPU (fp16 and tf32 are GPU modes): the sweep
runs, its learning rates rise strictly (an fp16 overflow is taken again, not recorded twice), and
it suggests an LR. Skipped without CUDA."""

import json
import math

import numpy as np
import pytest
import torch

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


@pytest.mark.parametrize("precision", ["fp32", "tf32", "bf16", "fp16"])
def test_lr_find_in_every_precision(cli, tmp_path, precision):
    result = cli("lr-find", "--run-dir", "sweep", "--steps", "40", "--start-lr", "1e-5", "--end-lr", "1",
                 f"train.precision={precision}", "log.progress=none", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    record = json.loads((tmp_path / "sweep" / "lr_find.json").read_text())
    assert record["precision"] == precision and record["device"].startswith("cuda")
    assert np.all(np.diff(np.log(record["lrs"])) > 0)
    assert all(v is not None and math.isfinite(v) for v in record["losses"][:20])
    assert 1e-5 <= record["suggested_lr"] <= 1 and "suggested optim.lr=" in result.stdout
