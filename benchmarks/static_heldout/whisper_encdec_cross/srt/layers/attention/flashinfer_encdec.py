"""Encoder-decoder attention on FlashInfer: decoder self-attention over paged KV (graph-mode decode wrappers per
batch size), cross-attention over the encoder K/V that CrossKVCache packs in batch order (ragged prefill)."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import TYPE_CHECKING, Dict, Iterator, Optional

import numpy as np
import torch
from flashinfer import BatchDecodeWithPagedKVCacheWrapper, BatchPrefillWithRaggedKVCacheWrapper

if TYPE_CHECKING:
    from srt.model_executor.forward_batch import EncDecForwardBatch
    from srt.model_executor.model_runner import WhisperModelRunner


@dataclass
class EncDecMetadata:
    decode_wrapper: BatchDecodeWithPagedKVCacheWrapper
    batch_size: int


class FlashInferEncDecBackend:
    CROSS_WORKSPACE_BYTES = 64 * 1024 * 1024

    def __init__(self, model_runner: "WhisperModelRunner"):
        cfg, args = model_runner.model_config, model_runner.server_args
        self.device = model_runner.device
        self.num_heads = cfg.decoder_attention_heads
        self.head_dim = cfg.d_model // cfg.decoder_attention_heads
        self.page_size = args.page_size
        self.max_target_positions = cfg.max_target_positions
        self.max_pages = -(-cfg.max_target_positions // args.page_size)
        self.req_to_page = model_runner.req_to_page
        self.cross_cache = model_runner.cross_cache
        self._use_cuda_graph = False
        max_bs = args.max_running_requests
        self.workspace_buffer = torch.empty(args.flashinfer_workspace_bytes, dtype=torch.uint8, device=self.device)  # ok: FC106
        self.cross_workspace = torch.empty(self.CROSS_WORKSPACE_BYTES, dtype=torch.uint8, device=self.device)  # expect: FC106
        self.kv_indptr_cpu = torch.zeros(max_bs + 1, dtype=torch.int32, pin_memory=True)
        self.kv_last_page_len_cpu = torch.ones(max_bs, dtype=torch.int32, pin_memory=True)
        self.cross_qo_indptr_cpu = torch.arange(max_bs + 1, dtype=torch.int32)  # one decoder token per request
        self.cross_kv_indptr = torch.zeros(max_bs + 1, dtype=torch.int32, device=self.device)
        self.decode_wrapper = BatchDecodeWithPagedKVCacheWrapper(self.workspace_buffer, "NHD")
        self.cross_wrapper = BatchPrefillWithRaggedKVCacheWrapper(self.cross_workspace, "NHD", backend="fa2")
        self.cuda_graph_decode_wrappers: Dict[int, BatchDecodeWithPagedKVCacheWrapper] = {}
        self.forward_metadata: Optional[EncDecMetadata] = None

    def _plan_kwargs(self) -> dict:
        return dict(num_qo_heads=self.num_heads, num_kv_heads=self.num_heads, head_dim=self.head_dim,
                    page_size=self.page_size, q_data_type=torch.float16)

    def _page_layout(self, fb: "EncDecForwardBatch", bs: int) -> torch.Tensor:
        """Page counts, indptr and last-page lengths on the host; the page ids gathered on the device."""
        lens = fb.seq_lens_cpu[:bs]
        pages = (lens + self.page_size - 1) // self.page_size
        self.kv_indptr_cpu[1 : bs + 1] = torch.cumsum(pages, 0)
        self.kv_last_page_len_cpu[:bs] = lens - (pages - 1) * self.page_size
        rows, counts = fb.req_pool_indices_cpu[:bs].tolist(), pages.tolist()  # ok: FC101
        flat = np.concatenate([np.arange(n) + r * self.max_pages for r, n in zip(rows, counts)])
        return self.req_to_page.view(-1)[torch.from_numpy(flat).to(self.device, non_blocking=True)]

    def _plan_cross(self, fb: "EncDecForwardBatch", bs: int) -> None:
        torch.cumsum(fb.encoder_lens[:bs], 0, out=self.cross_kv_indptr[1 : bs + 1])
        self.cross_wrapper.plan(self.cross_qo_indptr_cpu[: bs + 1], self.cross_kv_indptr[: bs + 1],  # expect: FC102
                                self.num_heads, self.num_heads, self.head_dim, causal=False)

    def init_forward_metadata(self, fb: "EncDecForwardBatch") -> None:
        if self._use_cuda_graph:  # ok: FC103
            raise RuntimeError("eager metadata requested while decode graphs are being captured")
        if (fb.seq_lens >= self.max_target_positions).any():  # expect: FC101
            raise ValueError(f"decoder lengths {fb.seq_lens} reach max_target_positions={self.max_target_positions}")  # ok: FC101
        bs = fb.batch_size
        kv_indices = self._page_layout(fb, bs)
        self.decode_wrapper.plan(self.kv_indptr_cpu[: bs + 1], kv_indices, self.kv_last_page_len_cpu[:bs],  # ok: FC102
                                 **self._plan_kwargs())
        self._plan_cross(fb, bs)
        self.forward_metadata = EncDecMetadata(self.decode_wrapper, bs)

    @contextlib.contextmanager
    def capturing(self) -> Iterator[None]:
        self._use_cuda_graph = True
        try:
            yield
        finally:
            self._use_cuda_graph = False

    def init_cuda_graph_state(self, max_bs: int) -> None:
        self.kv_indptr = torch.zeros(max_bs + 1, dtype=torch.int32, device=self.device)
        self.kv_indices = torch.zeros(max_bs * self.max_pages, dtype=torch.int32, device=self.device)
        self.kv_last_page_len = torch.empty(max_bs, dtype=torch.int32, device=self.device)
        self.kv_last_page_len.fill_(1)  # ok: FC104

    def init_forward_metadata_capture_cuda_graph(self, bs: int, fb: "EncDecForwardBatch") -> None:
        ws = self.decode_wrapper._float_workspace_buffer  # expect: FC103
        w = BatchDecodeWithPagedKVCacheWrapper(
            ws, "NHD", use_cuda_graph=True, paged_kv_indptr_buffer=self.kv_indptr[: bs + 1],
            paged_kv_indices_buffer=self.kv_indices, paged_kv_last_page_len_buffer=self.kv_last_page_len[:bs])
        self.cuda_graph_decode_wrappers[bs] = w
        kv_indices = self._page_layout(fb, bs)
        w.plan(self.kv_indptr_cpu[: bs + 1], kv_indices, self.kv_last_page_len_cpu[:bs], **self._plan_kwargs())
        self._plan_cross(fb, bs)
        self.forward_metadata = EncDecMetadata(w, bs)

    def init_forward_metadata_replay_cuda_graph(self, bs: int, raw_bs: int, fb: "EncDecForwardBatch") -> None:
        w = self.cuda_graph_decode_wrappers[bs]
        if w._fixed_batch_size != bs:  # expect: FC103
            raise RuntimeError(f"graph wrapper for bs={bs} was built for another batch size")
        kv_indices = self._page_layout(fb, raw_bs)
        self.kv_indptr_cpu[raw_bs + 1 : bs + 1] = self.kv_indptr_cpu[raw_bs]
        self.kv_last_page_len_cpu[raw_bs:bs] = 1
        self.kv_indptr[: bs + 1].copy_(self.kv_indptr_cpu[: bs + 1], non_blocking=True)  # ok: FC104
        nnz = self.kv_indptr[raw_bs].item()  # expect: FC101
        self.kv_indices[:nnz].copy_(kv_indices, non_blocking=True)  # ok: FC104
        self._plan_cross(fb, raw_bs)
        w.plan(self.kv_indptr_cpu[: bs + 1], self.kv_indices[:nnz], self.kv_last_page_len_cpu[:bs],  # ok: FC102
               **self._plan_kwargs())
        self.forward_metadata = EncDecMetadata(w, bs)

    def forward_decode(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer, fb: "EncDecForwardBatch"):
        fb.token_to_kv_pool.set_kv_buffer(layer.layer_id, fb.out_cache_loc, k, v)
        kv = fb.token_to_kv_pool.get_kv_buffer(layer.layer_id)
        return self.forward_metadata.decode_wrapper.run(q, kv)  # ok: FC108

    def forward_cross(self, q: torch.Tensor, layer, fb: "EncDecForwardBatch"):
        total = fb.encoder_lens.sum()
        k, v = self.cross_cache.k[layer.layer_id, :total], self.cross_cache.v[layer.layer_id, :total]  # expect: FC101
        return self.cross_wrapper.run(q, k, v)  # expect: FC108
