"""Graph inputs kept as module buffers, and their pinned host mirrors."""

from __future__ import annotations

import numpy as np
import torch
from torch import nn


class GraphInputBuffers(nn.Module):
    """Persistent inputs that the captured decode graphs read by address.

    The buffers are registered (non-persistent) on a submodule of the model
    (``model.attn_state``), so ``model.to(device)`` moves them to the GPU with the
    weights and ``state_dict()`` leaves them out. The graph-mode decode wrappers are
    bound to slices of ``kv_indptr`` / ``kv_indices`` / ``kv_last_page_len``.
    """

    GRAPH_INPUTS = (
        "input_ids",
        "positions",
        "seq_lens",
        "req_pool_indices",
        "out_cache_loc",
        "kv_indptr",
        "kv_indices",
        "kv_last_page_len",
        "qo_indptr",
    )

    def __init__(self, max_bs: int, max_pages: int, max_tokens: int):
        super().__init__()
        assert max_tokens >= max_bs, "token buffers must hold one token per request"  # expect: FC109
        self.max_bs = max_bs
        self.live_bs = 0
        i32, i64 = torch.int32, torch.int64
        self.register_buffer("input_ids", torch.zeros(max_tokens, dtype=i64), persistent=False)
        self.register_buffer("positions", torch.zeros(max_tokens, dtype=i64), persistent=False)
        self.register_buffer("seq_lens", torch.ones(max_bs, dtype=i32), persistent=False)
        self.register_buffer("req_pool_indices", torch.zeros(max_bs, dtype=i64), persistent=False)
        self.register_buffer("out_cache_loc", torch.zeros(max_tokens, dtype=i64), persistent=False)
        self.register_buffer("kv_indptr", torch.zeros(max_bs + 1, dtype=i32), persistent=False)
        self.register_buffer("kv_indices", torch.zeros(max_pages, dtype=i32), persistent=False)
        self.register_buffer("kv_last_page_len", torch.ones(max_bs, dtype=i32), persistent=False)
        self.register_buffer("qo_indptr", torch.arange(max_bs + 1, dtype=i32), persistent=False)

    def slot(self, name: str, n: int) -> torch.Tensor:
        return self._buffers[name][:n]  # ok: FC103

    def extra_repr(self) -> str:
        return f"max_bs={self.max_bs}, inputs={len(self.GRAPH_INPUTS)}"


class HostMirrors:
    """Pinned host copies of the plan() inputs.

    Plain attributes on purpose: registered on a module, ``model.to(device)`` would
    move them to the GPU and every plan() would copy them back.
    """

    def __init__(self, max_bs: int, max_pages: int):
        self.max_bs = max_bs
        self.kv_indptr = torch.zeros(max_bs + 1, dtype=torch.int32, pin_memory=True)
        self.kv_last_page_len = torch.ones(max_bs, dtype=torch.int32, pin_memory=True)
        self.qo_indptr = torch.zeros(max_bs + 1, dtype=torch.int32, pin_memory=True)
        self.seq_lens = torch.zeros(max_bs, dtype=torch.int32, pin_memory=True)
        self.kv_indices = torch.zeros(min(max_pages, 1 << 16), dtype=torch.int32, pin_memory=True)
        self.kv_indptr_np: np.ndarray = self.kv_indptr.numpy()
        self.kv_last_page_len_np: np.ndarray = self.kv_last_page_len.numpy()
        self.qo_indptr_np: np.ndarray = self.qo_indptr.numpy()
