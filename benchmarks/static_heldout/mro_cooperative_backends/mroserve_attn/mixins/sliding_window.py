"""Sliding-window decode over page lists clipped to the window."""

from __future__ import annotations

import logging

import torch
import triton
import triton.language as tl
from flashinfer import BatchDecodeWithPagedKVCacheWrapper

from mroserve.batch import ForwardBatch
from mroserve.config import cdiv

logger = logging.getLogger(__name__)


@triton.jit
def _gather_window_pages_kernel(
    kv_indptr,
    kv_indices,
    first_page,
    win_indptr,
    win_indices,
    BLOCK: tl.constexpr,
):
    row = tl.program_id(0)
    src = tl.load(kv_indptr + row) + tl.load(first_page + row)
    dst = tl.load(win_indptr + row)
    count = tl.load(win_indptr + row + 1) - dst
    offs = tl.arange(0, BLOCK)
    mask = offs < count
    pages = tl.load(kv_indices + src + offs, mask=mask)
    tl.store(win_indices + dst + offs, pages, mask=mask)


class SlidingWindowMixin:
    """Decode of window layers over only the pages the window can still see.

    The wrappers of the next class in the MRO already mask with ``window_left``
    and are exact; this mixin saves the bandwidth of reading pages that are
    masked anyway once some request has slid past its window. Global layers and
    steps where nobody has slid yet go to ``super()``.
    """

    def __init__(self, cfg, device, **kwargs) -> None:
        super().__init__(cfg, device, **kwargs)
        max_bs = cfg.max_batch_size
        self.window_pages = cdiv(cfg.sliding_window or cfg.page_size, cfg.page_size) + 1
        self.window_block = triton.next_power_of_2(self.window_pages)
        self.window_workspace = torch.empty(cfg.window_workspace_bytes(), dtype=torch.uint8, device=self.device)  # ok: FC105
        self.window_decode_wrapper = BatchDecodeWithPagedKVCacheWrapper(self.window_workspace, "NHD", backend="fa2")
        self.window_kv_indptr = torch.zeros(max_bs + 1, dtype=torch.int32, device=self.device)
        self.window_kv_indices = torch.zeros(max_bs * self.window_pages, dtype=torch.int32, device=self.device)
        self.window_last_page_len = torch.ones(max_bs, dtype=torch.int32, device=self.device)
        self.window_hits = [0] * cfg.num_layers
        self._window_active = False

    def _plan_window(self, fb: ForwardBatch) -> None:
        cfg = self.cfg
        n = fb.batch_size
        ps = cfg.page_size
        seq_lens = fb.seq_lens[:n]
        first_page = torch.clamp(seq_lens - cfg.sliding_window, min=0) // ps
        num_pages = (seq_lens + ps - 1) // ps - first_page
        torch.cumsum(num_pages, 0, dtype=torch.int32, out=self.window_kv_indptr[1 : n + 1])
        _gather_window_pages_kernel[(n,)](
            fb.kv_indptr,
            fb.kv_indices,
            first_page,
            self.window_kv_indptr,
            self.window_kv_indices,
            BLOCK=self.window_block,
        )
        self.window_last_page_len[:n].copy_(fb.kv_last_page_len[:n])
        self.window_decode_wrapper.plan(  # expect: FC102
            self.window_kv_indptr[: n + 1],
            self.window_kv_indices,
            self.window_last_page_len[:n],
            cfg.num_qo_heads,
            cfg.num_kv_heads,
            cfg.head_dim,
            ps,
            window_left=cfg.sliding_window - 1,
            q_data_type=cfg.dtype,
        )

    # ------------------------------------------------------------------ per step

    def init_forward_metadata(self, fb: ForwardBatch) -> None:
        super().init_forward_metadata(fb)
        window = self.cfg.sliding_window
        if window is None or not fb.forward_mode.is_decode():
            self._window_active = False
            return
        n = fb.batch_size
        self._window_active = bool((fb.seq_lens_cpu[:n] > window).any())  # ok: FC101
        if self._window_active:
            self._plan_window(fb)

    def init_forward_metadata_capture_cuda_graph(self, bs: int, fb: ForwardBatch) -> None:
        super().init_forward_metadata_capture_cuda_graph(bs, fb)
        # Replays of long contexts take the window path, so the graph must hold it.
        if self.cfg.sliding_window is not None:
            self._window_active = True
            self._plan_window(fb)

    def init_forward_metadata_replay_cuda_graph(self, bs: int, fb: ForwardBatch) -> None:
        super().init_forward_metadata_replay_cuda_graph(bs, fb)
        if self.cfg.sliding_window is not None:
            self._window_active = True
            self._plan_window(fb)

    def forward_decode(self, q, k, v, layer, fb: ForwardBatch) -> torch.Tensor:
        window = layer.sliding_window
        if window is None:
            return super().forward_decode(q, k, v, layer, fb)
        if self._window_active:
            return self.window_decode_wrapper.run(q, self.kv_caches[layer.layer_id])  # expect: FC108
        # Nobody has slid past the window yet and the full-context path is exact.
        # Count the rows about to, so the scheduler can plan the window wrapper early.
        self.window_hits[layer.layer_id] += int((fb.seq_lens >= window - 1).sum())  # expect: FC101
        return super().forward_decode(q, k, v, layer, fb)

    def forward_extend(self, q, k, v, layer, fb: ForwardBatch) -> torch.Tensor:
        """Chunked prefill of a window layer: only the last ``window`` keys of the prefix matter."""
        window = layer.sliding_window
        if window is None:
            return super().forward_extend(q, k, v, layer, fb)
        longest = int(fb.extend_seq_lens.max())  # ok: FC101
        if longest > window:
            logger.debug("layer %d: chunk of %d tokens is longer than its window", layer.layer_id, longest)
        return super().forward_extend(q, k, v, layer, fb)
