"""Per-step work done by walking the module tree.

Functions here are handed to ``nn.Module.apply`` (``model.apply(partial(fn, ...))``
visits every submodule and keeps the ones an ``isinstance`` test selects) or are
installed as forward pre-hooks on attention layers.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import List

import torch
from flashinfer import BatchDecodeWithPagedKVCacheWrapper
from torch import nn
from torch.utils.hooks import RemovableHandle

from modserve.batch import ForwardBatch
from modserve.config import PAGE_SIZE
from modserve.layers.attention import PagedAttention
from modserve.layers.buffers import GraphInputBuffers
from modserve.layers.rotary import RotaryEmbedding
from modserve.models.lookahead import LookaheadHead

logger = logging.getLogger(__name__)

# Page id that every KV pool keeps empty; masked pages point there.
NULL_PAGE = 0


@dataclasses.dataclass
class LayerStepMeta:
    batch_size: int
    num_live: int
    num_kv_tokens: int
    max_kv_len: int


def _next_pow2(n: int) -> int:
    return 1 << (n - 1).bit_length()


def bind_attention_backend(module: nn.Module, *, backend) -> None:
    """Start-up: give each attention module the backend, the lookahead head its wrapper."""
    if isinstance(module, PagedAttention):
        module.attn_backend = backend
    elif isinstance(module, LookaheadHead):
        module.init_draft_wrapper(backend.kv_pool.get_kv(backend.cfg.num_layers - 1))


def refresh_layer_meta(module: nn.Module, *, fb: ForwardBatch) -> None:
    """Per step: copy the batch summary every attention layer logs and balances on."""
    if not isinstance(module, PagedAttention):
        return
    live = fb.req_pool_indices[fb.req_pool_indices >= 0]  # expect: FC101
    module.step_meta = LayerStepMeta(
        batch_size=fb.batch_size,
        num_live=live.numel(),
        num_kv_tokens=int(fb.seq_lens.sum()),  # expect: FC101
        max_kv_len=int(fb.seq_lens_cpu[: fb.batch_size].max()),  # ok: FC101
    )


def extend_rope_cache(module: nn.Module, *, max_pos: int) -> None:
    """Per step: grow the rotary tables when a request outgrows them."""
    if isinstance(module, RotaryEmbedding) and max_pos > module.max_position:
        module.max_position = _next_pow2(max_pos)
        module.cos_sin_cache = module.build_cache(module.max_position)  # expect: FC107


def plan_lookahead(
    module: nn.Module,
    *,
    fb: ForwardBatch,
    state: GraphInputBuffers,
    main_wrapper: BatchDecodeWithPagedKVCacheWrapper,
) -> None:
    """Per eager step: stage the draft head's inputs and plan its wrapper."""
    if not isinstance(module, LookaheadHead):
        return
    bs = fb.batch_size
    module.draft_kv_indptr[: bs + 1].copy_(state.kv_indptr[: bs + 1])
    module.draft_last_page_len[:bs].copy_(state.kv_last_page_len[:bs])
    module.draft_len.fill_(min(module.max_draft, bs))
    module.plan_draft(fb, state.kv_indices, main_wrapper)


class WindowIndicesHook:
    """Forward pre-hook of sliding-window layers.

    Points the pages that fell out of the window at the null page, so the window
    layer reads no stale KV. Runs on every forward, captured ones included.
    """

    def __init__(self, state: GraphInputBuffers, window: int):
        self.state = state
        self.window_pages = (window + PAGE_SIZE - 1) // PAGE_SIZE

    def __call__(self, module: PagedAttention, args):
        _, _, _, fb = args
        if (fb.positions < 0).any():  # expect: FC101
            raise ValueError(f"negative positions in layer {module.layer_id}: {fb.positions}")  # ok: FC101
        bs = fb.batch_size
        state = self.state
        indptr = state.kv_indptr[: bs + 1]
        slot = torch.arange(state.kv_indices.shape[0], device=indptr.device)
        row = torch.bucketize(slot, indptr[1:], right=True).clamp_(max=bs - 1)
        first_live = indptr[1:].index_select(0, row) - self.window_pages
        evicted = slot < first_live
        state.kv_indices.masked_fill_(evicted, NULL_PAGE)  # expect: FC104
        return None


def install_window_hooks(model: nn.Module, state: GraphInputBuffers, window: int) -> List[RemovableHandle]:
    handles: List[RemovableHandle] = []
    for name, mod in model.named_modules():
        if not isinstance(mod, PagedAttention) or mod.sliding_window is None:
            continue
        if mod._forward_pre_hooks:  # ok: FC103
            logger.warning("%s already has forward pre-hooks; the window hook runs last", name)
        handles.append(mod.register_forward_pre_hook(WindowIndicesHook(state, window)))
    return handles
