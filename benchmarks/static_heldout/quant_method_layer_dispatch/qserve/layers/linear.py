"""Tensor-parallel linear layers.

The layers own shapes, sharding and communication; the weights and the GEMM belong to the
quant method their config picked for them when they were built.
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.distributed as dist
from torch import nn
from torch.nn import Parameter

from qserve.layers.quantization.base_config import QuantizationConfig, QuantizeMethodBase, UnquantizedLinearMethod


def get_tensor_model_parallel_world_size() -> int:
    return dist.get_world_size() if dist.is_initialized() else 1


def get_tensor_model_parallel_rank() -> int:
    return dist.get_rank() if dist.is_initialized() else 0


def tensor_model_parallel_all_reduce(x: torch.Tensor) -> torch.Tensor:
    if get_tensor_model_parallel_world_size() > 1:
        dist.all_reduce(x)
    return x


def tensor_model_parallel_all_gather(x: torch.Tensor) -> torch.Tensor:
    world_size = get_tensor_model_parallel_world_size()
    if world_size == 1:
        return x
    chunks = [torch.empty_like(x) for _ in range(world_size)]
    dist.all_gather(chunks, x)
    return torch.cat(chunks, dim=-1)


def ensure_divisibility(numerator: int, denominator: int) -> None:
    assert numerator % denominator == 0, f"{numerator} is not divisible by {denominator}"  # expect: FC109


def divide(numerator: int, denominator: int) -> int:
    ensure_divisibility(numerator, denominator)
    return numerator // denominator


class LinearBase(nn.Module):
    quant_method: Optional[QuantizeMethodBase]
    shard_dim_attr = "output_dim"

    def __init__(self, input_size: int, output_size: int, skip_bias_add: bool = False,
                 params_dtype: Optional[torch.dtype] = None, quant_config: Optional[QuantizationConfig] = None,
                 prefix: str = "", device: torch.device | str = "cuda") -> None:
        super().__init__()
        self.input_size = input_size
        self.output_size = output_size
        self.skip_bias_add = skip_bias_add
        self.params_dtype = params_dtype or torch.get_default_dtype()
        self.prefix = prefix
        self.device = torch.device(device)
        self.tp_size = get_tensor_model_parallel_world_size()
        self.tp_rank = get_tensor_model_parallel_rank()
        quant_method = quant_config.get_quant_method(self, prefix=prefix) if quant_config is not None else None
        self.quant_method = quant_method if quant_method is not None else UnquantizedLinearMethod()

    def _create_bias(self, size: int, bias: bool) -> None:
        if bias:
            self.bias = Parameter(torch.zeros(size, dtype=self.params_dtype, device=self.device), requires_grad=False)
        else:
            self.register_parameter("bias", None)

    def weight_loader(self, param: Parameter, loaded_weight: torch.Tensor, shard_offset: int = 0) -> None:
        """Copy this rank's slice of a checkpoint tensor into ``param`` at ``shard_offset``."""
        dim = getattr(param, self.shard_dim_attr, None)
        if dim is None:
            param.data.copy_(loaded_weight)
            return
        shard_size = loaded_weight.shape[dim] // self.tp_size
        loaded_weight = loaded_weight.narrow(dim, self.tp_rank * shard_size, shard_size)
        param.data.narrow(dim, shard_offset, shard_size).copy_(loaded_weight)


class ColumnParallelLinear(LinearBase):
    """Y = XA with A split along its output dimension."""

    def __init__(self, input_size: int, output_size: int, bias: bool = True, gather_output: bool = False,
                 skip_bias_add: bool = False, params_dtype: Optional[torch.dtype] = None,
                 quant_config: Optional[QuantizationConfig] = None, output_sizes: Optional[list[int]] = None,
                 prefix: str = "", device: torch.device | str = "cuda") -> None:
        super().__init__(input_size, output_size, skip_bias_add, params_dtype, quant_config, prefix, device)
        self.gather_output = gather_output
        self.output_size_per_partition = divide(output_size, self.tp_size)
        self.output_partition_sizes = [divide(size, self.tp_size) for size in (output_sizes or [output_size])]
        assert self.quant_method is not None  # ok: FC109
        self.quant_method.create_weights(self, self.input_size, self.output_partition_sizes, self.input_size,
                                         self.output_size, self.params_dtype)
        self._create_bias(self.output_size_per_partition, bias)

    def forward(self, input_: torch.Tensor) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
        bias = self.bias if not self.skip_bias_add else None
        output_parallel = self.quant_method.apply(self, input_, bias)
        output = tensor_model_parallel_all_gather(output_parallel) if self.gather_output else output_parallel
        return output, (self.bias if self.skip_bias_add else None)


class MergedColumnParallelLinear(ColumnParallelLinear):
    """Column-parallel projections of one input fused into one GEMM (gate_up_proj)."""

    def __init__(self, input_size: int, output_sizes: list[int], bias: bool = True,
                 quant_config: Optional[QuantizationConfig] = None, prefix: str = "",
                 device: torch.device | str = "cuda") -> None:
        super().__init__(input_size, sum(output_sizes), bias=bias, quant_config=quant_config,
                         output_sizes=output_sizes, prefix=prefix, device=device)


class QKVParallelLinear(ColumnParallelLinear):
    def __init__(self, hidden_size: int, head_size: int, total_num_heads: int, total_num_kv_heads: int,
                 bias: bool = False, quant_config: Optional[QuantizationConfig] = None, prefix: str = "",
                 device: torch.device | str = "cuda") -> None:
        q_size, kv_size = total_num_heads * head_size, total_num_kv_heads * head_size
        super().__init__(hidden_size, q_size + 2 * kv_size, bias=bias, quant_config=quant_config,
                         output_sizes=[q_size, kv_size, kv_size], prefix=prefix, device=device)


class RowParallelLinear(LinearBase):
    """Y = XA with A split along its input dimension; partial sums are all-reduced."""

    shard_dim_attr = "input_dim"

    def __init__(self, input_size: int, output_size: int, bias: bool = True, input_is_parallel: bool = True,
                 skip_bias_add: bool = False, params_dtype: Optional[torch.dtype] = None, reduce_results: bool = True,
                 quant_config: Optional[QuantizationConfig] = None, prefix: str = "",
                 device: torch.device | str = "cuda") -> None:
        super().__init__(input_size, output_size, skip_bias_add, params_dtype, quant_config, prefix, device)
        self.input_is_parallel = input_is_parallel
        self.reduce_results = reduce_results
        self.input_size_per_partition = divide(input_size, self.tp_size)
        self.quant_method.create_weights(self, self.input_size_per_partition, [self.output_size], self.input_size,
                                         self.output_size, self.params_dtype)
        self._create_bias(self.output_size, bias)

    def forward(self, input_: torch.Tensor) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
        if self.input_is_parallel:
            input_parallel = input_
        else:
            input_parallel = input_.chunk(self.tp_size, dim=-1)[self.tp_rank]
        bias_ = None if (self.tp_rank > 0 or self.skip_bias_add) else self.bias
        output_parallel = self.quant_method.apply(self, input_parallel, bias_)
        if self.reduce_results and self.tp_size > 1:
            output_parallel = tensor_model_parallel_all_reduce(output_parallel)
        return output_parallel, (self.bias if self.skip_bias_add else None)
