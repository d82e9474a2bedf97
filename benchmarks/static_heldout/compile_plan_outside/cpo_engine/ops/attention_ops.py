"""Custom ops that run FlashInfer inside the compiled region.

Dynamo cannot trace FlashInfer's plan() (host work, Python objects), so the builder plans before the forward and
publishes the planned wrappers here; the ops only call run(). Register fakes so torch.compile can trace shapes.
"""
from __future__ import annotations

from typing import List, Optional, Sequence, Tuple

import torch
from flashinfer import BatchDecodeWithPagedKVCacheWrapper, BatchPrefillWithPagedKVCacheWrapper


class _OpState:
    def __init__(self) -> None:
        self.kv_caches: List[Tuple[torch.Tensor, torch.Tensor]] = []
        self.decode: Optional[BatchDecodeWithPagedKVCacheWrapper] = None
        self.prefill: Optional[BatchPrefillWithPagedKVCacheWrapper] = None
        self.layout = "NHD"


_STATE = _OpState()


def install_kv_caches(caches: Sequence[Tuple[torch.Tensor, torch.Tensor]]) -> None:
    _STATE.kv_caches = list(caches)


def kv_cache(layer_id: int) -> Tuple[torch.Tensor, torch.Tensor]:
    return _STATE.kv_caches[layer_id]


def bind_step_wrappers(
    decode: Optional[BatchDecodeWithPagedKVCacheWrapper], prefill: BatchPrefillWithPagedKVCacheWrapper
) -> None:
    """Publish this step's planned wrappers to the ops (custom ops take tensors and scalars only)."""
    _STATE.decode = decode
    _STATE.prefill = prefill
    if decode is not None:
        _STATE.layout = decode._kv_layout  # expect: FC103


@torch.library.custom_op("cpo::write_kv_cache", mutates_args=("k_cache", "v_cache"))
def write_kv_cache(
    k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, slot_mapping: torch.Tensor
) -> None:
    # padded tokens carry slot -1
    valid = slot_mapping >= 0
    slots = slot_mapping[valid].long()  # expect: FC101
    n = slots.numel()
    k_cache.view(-1, *k.shape[1:]).index_copy_(0, slots, k[:n])
    v_cache.view(-1, *v.shape[1:]).index_copy_(0, slots, v[:n])


@write_kv_cache.register_fake
def _write_kv_cache_fake(k, v, k_cache, v_cache, slot_mapping) -> None:
    return None


@torch.library.custom_op("cpo::decode_attention", mutates_args=("out",))
def decode_attention(q: torch.Tensor, layer_id: int, num_decode_tokens: int, out: torch.Tensor) -> None:
    assert q.dim() == 3, "q must be [tokens, heads, head_dim]"  # expect: FC109
    k_cache, v_cache = _STATE.kv_caches[layer_id]
    out[:num_decode_tokens] = _STATE.decode.run(q[:num_decode_tokens], (k_cache, v_cache))  # ok: FC108


@decode_attention.register_fake
def _decode_attention_fake(q, layer_id, num_decode_tokens, out) -> None:
    return None


@torch.library.custom_op("cpo::extend_attention", mutates_args=("out",))
def extend_attention(q: torch.Tensor, layer_id: int, num_decode_tokens: int, out: torch.Tensor) -> None:
    k_cache, v_cache = _STATE.kv_caches[layer_id]
    out[num_decode_tokens:] = _STATE.prefill.run(q[num_decode_tokens:], (k_cache, v_cache))  # expect: FC108


@extend_attention.register_fake
def _extend_attention_fake(q, layer_id, num_decode_tokens, out) -> None:
    return None
