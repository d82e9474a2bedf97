"""Python shim over the `fwdext` C++ extension (torch.ops.fwdext) and FlashInfer's raw kernels."""
from __future__ import annotations

import torch
from flashinfer.decode import trtllm_batch_decode_with_kv_cache


class _ExtOps:
    """Loads the C++ op namespace once and keeps it."""

    def __init__(self) -> None:
        self._cached_module = None

    def load(self):
        if self._cached_module is None:  # ok: FC103
            self._cached_module = torch.ops.fwdext  # ok: FC103
        return self._cached_module


_OPS = _ExtOps()


def reshape_and_cache(key: torch.Tensor, value: torch.Tensor, kv_cache: torch.Tensor,
                      slot_mapping: torch.Tensor) -> None:
    _OPS.load().reshape_and_cache(key, value, kv_cache, slot_mapping)


def copy_blocks(kv_cache: torch.Tensor, block_mapping: torch.Tensor) -> None:
    _OPS.load().copy_blocks(kv_cache, block_mapping)


def decode_direct(wrapper, q: torch.Tensor, kv_cache: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """Skip wrapper.run()'s Python checks: call the JIT module the wrapper planned with."""
    module = wrapper._cached_module  # expect: FC103
    module.paged_run(
        wrapper._float_workspace_buffer,  # expect: FC103
        wrapper._int_workspace_buffer,  # expect: FC103
        wrapper._plan_info,  # expect: FC103
        q, kv_cache, out,
    )
    return out


def trtllm_decode(q: torch.Tensor, kv_cache: torch.Tensor, workspace: torch.Tensor,
                  block_tables: torch.Tensor, seq_lens: torch.Tensor, max_seq_len: int,
                  scale: float) -> torch.Tensor:
    return trtllm_batch_decode_with_kv_cache(
        q, kv_cache, workspace, block_tables, seq_lens, max_seq_len, bmm1_scale=scale, bmm2_scale=1.0,
    )
