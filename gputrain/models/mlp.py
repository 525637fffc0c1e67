"""Multi-layer perceptron over flattened inputs."""

from __future__ import annotations

from typing import TYPE_CHECKING

from torch import nn

from gputrain.config.schema import ModelConfig
from gputrain.data.spec import DataSpec
from gputrain.errors import ConfigError
from gputrain.models.layers import make_activation, num_features
from gputrain.models.registry import register_model

if TYPE_CHECKING:
    from torch.distributed.tensor.parallel import ParallelStyle


class MLP(nn.Sequential):
    def __init__(
        self, in_features: int, hidden_sizes: list[int], out_features: int, activation: str, dropout: float
    ) -> None:
        layers: list[nn.Module] = [nn.Flatten()]
        width = in_features
        for size in hidden_sizes:
            layers += [nn.Linear(width, size), make_activation(activation)]
            if dropout > 0:
                layers.append(nn.Dropout(dropout))
            width = size
        layers.append(nn.Linear(width, out_features))
        super().__init__(*layers)


@register_model("mlp")
def build_mlp(config: ModelConfig, spec: DataSpec) -> nn.Module:
    if spec.task == "lm":
        raise ConfigError(
            "model.name", "mlp cannot model token sequences; use a language model such as gpt", config.name
        )
    if spec.vocab_size is not None:  # ids are names of tokens, not quantities an MLP could weigh
        raise ConfigError(
            "model.name", "mlp reads numeric features, and this data gives token ids; use gpt or hf", config.name
        )
    return MLP(
        num_features(spec.input_shape),
        config.hidden_sizes,
        spec.num_model_outputs,
        config.activation,
        config.dropout or 0.0,
    )


def mlp_tp_plan(model: nn.Module, tp_degree: int) -> dict[str, ParallelStyle]:
    """How the MLP (or a pipeline stage cut from it) splits over tensor-parallel ranks: its Linear
    layers alternate column-wise (output features split, no communication) and row-wise (input
    features split, one all-reduce),
    so each pair costs one all-reduce; an odd last Linear is column-wise with its output gathered.
    Only element-wise layers (activations, dropout) sit between them, so they run on the shards."""
    linears = [name for name, m in model.named_modules() if isinstance(m, nn.Linear)]
    from torch.distributed.tensor import Replicate  # only for tensor parallelism: ~1 s to import
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    plan: dict[str, ParallelStyle] = {}
    for i, name in enumerate(linears):
        if i % 2 == 0:
            last = i == len(linears) - 1
            plan[name] = ColwiseParallel(output_layouts=Replicate()) if last else ColwiseParallel()
        else:
            plan[name] = RowwiseParallel()
    return plan
