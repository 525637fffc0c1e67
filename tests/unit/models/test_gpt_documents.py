"""gpt's document-aware attention (packed instruction data) and classification head (text classes)
stay capturable by torch.export with the batch and the sequence length dynamic, as `gputrain
export --format pt2` captures them, and the program computes what the model computes."""

from __future__ import annotations

import pytest
import torch

from gputrain.config.schema import ModelConfig
from gputrain.data.spec import DataSpec
from gputrain.models import build_model
from gputrain.models.gpt import document_positions_and_mask

PACKED = DataSpec(task="lm", input_shape=(32,), vocab_size=50, document_end=0)
CLASSES = DataSpec(task="classification", input_shape=(32,), num_classes=3, vocab_size=50, pad_id=0)


def test_positions_restart_after_each_document_end() -> None:
    idx = torch.tensor([[5, 6, 0, 7, 0, 0, 8, 9]])
    positions, mask = document_positions_and_mask(idx, 0)
    assert positions.tolist() == [[0, 1, 2, 0, 1, 0, 0, 1]]
    assert mask.shape == (1, 1, 8, 8) and mask[0, 0, 3].tolist() == [False, False, False, True] + [False] * 4


@pytest.mark.parametrize("spec", [PACKED, CLASSES], ids=["packed", "classes"])
def test_torch_export_keeps_batch_and_length_dynamic(spec: DataSpec) -> None:
    torch.manual_seed(0)
    model = build_model(ModelConfig(name="gpt", n_layer=1, n_head=2, d_model=16), spec).eval()
    dims = {0: torch.export.Dim("batch", min=1)}
    if spec.task == "lm":
        dims[1] = torch.export.Dim("seq", min=1, max=32)
    program = torch.export.export(model, (torch.randint(1, 50, (4, 32)),), dynamic_shapes={"idx": dims})
    other = torch.randint(0, 50, (3, 20 if spec.task == "lm" else 32))
    with torch.no_grad():
        torch.testing.assert_close(program.module()(other), model(other))


@pytest.mark.parametrize("spec", [PACKED, CLASSES], ids=["packed", "classes"])
def test_tensor_and_pipeline_parallel_refuse_what_their_plans_do_not_cover(spec: DataSpec) -> None:
    """A stage passes only the residual stream on, and the tensor-parallel plan shards lm_head and the
    sequence: neither carries the document mask or the classifier's pooling, so both refuse in one line."""
    from gputrain.errors import ConfigError
    from gputrain.models.gpt_parallel import gpt_pipeline_stages, gpt_tp_plan

    model = build_model(ModelConfig(name="gpt", n_layer=2, n_head=2, d_model=16), spec)
    with pytest.raises(ConfigError, match=r"^config error: parallel\.tp = 2: gpt's tensor-parallel plan") as err:
        gpt_tp_plan(model, 2)
    assert "use ddp or fsdp" in str(err.value)
    with pytest.raises(ConfigError, match=r"^config error: parallel\.pp: pipeline stages of gpt"):
        gpt_pipeline_stages(model, [range(1), range(1, 2)], [0])
