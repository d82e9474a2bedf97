"""Callable plan and forward objects: the backend keeps one per proxy and calls it like a function."""
from __future__ import annotations

import torch

from proxyserve import PAGE_SIZE, ForwardBatch, ServeConfig, TracedWrapper, window_indptr


class DecodePlanFn:
    def __init__(self, wrapper: TracedWrapper, cfg: ServeConfig, page_size: int = PAGE_SIZE):
        assert page_size in (1, 8, 16, 32, 64), f"unsupported page size {page_size}"  # expect: FC109
        self.wrapper, self.cfg, self.page_size = wrapper, cfg, page_size

    @property
    def dims(self):
        return self.cfg.num_qo_heads, self.cfg.num_kv_heads, self.cfg.head_dim, self.page_size

    def __call__(self, fb: ForwardBatch) -> None:
        self.wrapper.plan(fb.kv_indptr_cpu, fb.kv_indices, fb.kv_last_page_len_cpu, *self.dims)  # ok: FC102


class WindowPlanFn(DecodePlanFn):  # sliding-window layers see the last `window` tokens only
    def __call__(self, fb: ForwardBatch) -> None:
        if int(fb.seq_lens.max()) <= self.cfg.window:  # expect: FC101
            return super().__call__(fb)
        indptr = window_indptr(fb.kv_indptr, self.cfg.window // self.page_size)
        self.wrapper.plan(indptr, fb.kv_indices, fb.kv_last_page_len_cpu, *self.dims,  # expect: FC102
                          window_left=self.cfg.window - 1)


class RaggedPlanFn:
    def __init__(self, wrapper: TracedWrapper, cfg: ServeConfig):
        self.wrapper, self.cfg = wrapper, cfg

    def __call__(self, fb: ForwardBatch) -> None:
        c = self.cfg
        longest = max(fb.seq_lens.tolist())  # expect: FC101
        window_left = c.window - 1 if longest > c.window else -1
        self.wrapper.plan(fb.qo_indptr, fb.qo_indptr, c.num_qo_heads, c.num_kv_heads, c.head_dim,  # expect: FC102
                          causal=True, window_left=window_left)


class DecodeForwardFn:
    def __init__(self, wrapper: TracedWrapper):
        self.wrapper = wrapper

    def __call__(self, q: torch.Tensor, kv_cache: torch.Tensor) -> torch.Tensor:
        return self.wrapper.run(q, kv_cache)  # expect: FC108


class PagePlanner:
    """Reserves KV pages for the next step. Its plan() is the engine's own, not FlashInfer's."""

    def __init__(self, page_size: int = PAGE_SIZE):
        self.page_size, self.reserved = page_size, 0

    def plan(self, kv_indptr: torch.Tensor, new_pages: int) -> int:
        self.reserved = kv_indptr.numel() - 1 + new_pages  # ok: FC101
        return self.reserved
