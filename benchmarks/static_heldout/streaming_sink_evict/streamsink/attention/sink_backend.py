"""Window pages go through graph-mode decode wrappers, sink pages through their own wrapper; the two
partial results are merged with their log-sum-exp."""
import logging

import numpy as np
import torch
from flashinfer import BatchDecodeWithPagedKVCacheWrapper, BatchPrefillWithPagedKVCacheWrapper, merge_state
from flashinfer.decode import fast_decode_plan

from streamsink.config import SinkConfig
from streamsink.forward_batch import ForwardBatch

logger = logging.getLogger(__name__)


class SinkFlashInferBackend:
    def __init__(self, cfg: SinkConfig, device):
        self.cfg = cfg
        self.device = device
        self.page_size = cfg.page_size
        self.max_bs = cfg.max_running_requests
        self.sink_pages, self.window_pages = cfg.sink_pages, cfg.window_pages
        self.cap_tokens = (cfg.sink_pages + cfg.window_pages) * cfg.page_size
        self.heads = (cfg.num_qo_heads, cfg.num_kv_heads, cfg.head_dim)
        self._kv_layout = "NHD"
        u8 = torch.uint8
        self.graph_workspace = torch.zeros(SinkConfig.DECODE_WORKSPACE_BYTES, dtype=u8, device=device)  # expect: FC106
        self.eager_workspace = torch.zeros(  # ok: FC106
            cfg.max_running_requests * cfg.num_qo_heads * cfg.head_dim * 4 * 16 + (8 << 20), dtype=u8, device=device
        )
        self.prefill_workspace = torch.empty(  # ok: FC105
            cfg.max_prefill_tokens * cfg.num_qo_heads * cfg.head_dim * 4 + (16 << 20), dtype=u8, device=device
        )
        self.sink_workspace = torch.zeros(self._sink_workspace_bytes(cfg), dtype=u8, device=device)  # ok: FC106

        max_window = self.max_bs * cfg.window_pages
        self.kv_indptr = torch.zeros(self.max_bs + 1, dtype=torch.int32, device=device)
        self.kv_indices = torch.zeros(max_window, dtype=torch.int32, device=device)
        self.kv_last_page_len = torch.ones(self.max_bs, dtype=torch.int32, device=device)
        self.kv_indptr_host = torch.zeros(self.max_bs + 1, dtype=torch.int32, pin_memory=True)
        self.kv_indices_host = torch.zeros(max_window, dtype=torch.int32, pin_memory=True)
        self.kv_last_page_len_host = torch.ones(self.max_bs, dtype=torch.int32, pin_memory=True)
        self.kv_indptr_gpu = torch.zeros(self.max_bs + 1, dtype=torch.int32, device=device)
        self.eager_kv_indices = torch.empty(max_window // 4, dtype=torch.int32, device=device)
        self.rope_positions = torch.zeros(self.max_bs, dtype=torch.int64, device=device)
        self.evict_counts = None
        self.window_fill = 0.0

        self.decode_wrapper = BatchDecodeWithPagedKVCacheWrapper(self.eager_workspace, self._kv_layout)  # ok: FC103
        self.prefill_wrapper = BatchPrefillWithPagedKVCacheWrapper(self.prefill_workspace, self._kv_layout, backend="fa2")
        # sink pages never move once written, so their wrapper was left out of graph mode
        self.sink_wrapper = BatchDecodeWithPagedKVCacheWrapper(self.sink_workspace, self._kv_layout)
        self.graph_wrappers = {}
        self.kv_pool = None

    @staticmethod
    def _sink_workspace_bytes(cfg: SinkConfig) -> int:
        return cfg.max_running_requests * cfg.sink_pages * cfg.page_size * cfg.num_qo_heads * 8 + (4 << 20)

    def init_cuda_graph_state(self):
        for bs in self.cfg.cuda_graph_bs:
            self.graph_wrappers[bs] = BatchDecodeWithPagedKVCacheWrapper(
                self.graph_workspace, self._kv_layout, use_cuda_graph=True,
                paged_kv_indptr_buffer=self.kv_indptr[: bs + 1], paged_kv_indices_buffer=self.kv_indices,
                paged_kv_last_page_len_buffer=self.kv_last_page_len[:bs],
            )

    def _fill_window_host(self, fb: ForwardBatch, padded_bs: int = 0) -> int:
        bs = fb.batch_size
        rolled = np.flatnonzero(fb.seq_lens_host[:bs] > self.cap_tokens)  # ok: FC101
        if rolled.size:
            logger.debug("%d requests past the window", rolled.size)
        indptr = self.kv_indptr_host.numpy()
        indptr[0] = 0
        np.cumsum([len(p) for p in fb.window_pages_host], out=indptr[1 : bs + 1])
        n = int(indptr[bs])
        indptr[bs + 1 : padded_bs + 1] = n
        self.kv_indices_host[:n] = torch.from_numpy(np.concatenate(fb.window_pages_host))
        self.kv_last_page_len_host[:bs] = torch.from_numpy(fb.last_page_len_host)
        return n

    def _plan_sinks(self, fb: ForwardBatch):
        bs = fb.batch_size
        indptr = torch.arange(0, (bs + 1) * self.sink_pages, self.sink_pages, dtype=torch.int32)
        last = torch.full((bs,), self.page_size, dtype=torch.int32)
        pages = torch.from_numpy(fb.sink_pages_host.reshape(-1)).to(self.device, non_blocking=True)
        self.sink_wrapper.plan(indptr, pages, last, *self.heads, self.page_size)

    def _grow_eager_indices(self, n: int):
        if n > self.eager_kv_indices.numel():
            self.eager_kv_indices = torch.empty(2 * n, dtype=torch.int32, device=self.device)  # expect: FC107

    def init_forward_metadata(self, fb: ForwardBatch):
        assert fb.forward_mode in ("decode", "extend")  # expect: FC109
        bs = fb.batch_size
        if bs > self.max_bs:
            raise ValueError(f"batch of {bs} > {self.max_bs}; seq_lens={fb.seq_lens}")  # ok: FC101
        num_rolling = int((fb.seq_lens > self.cap_tokens).sum())  # expect: FC101
        self.window_fill = num_rolling / bs
        self.evict_counts = torch.zeros(bs, dtype=torch.int32, device=self.device)  # expect: FC107
        torch.clamp(fb.seq_lens - self.cap_tokens, min=0, out=self.evict_counts)
        fb.rope_positions = torch.zeros(bs, dtype=torch.int64, device=self.device)  # ok: FC107
        fb.rope_positions.copy_(torch.where(fb.seq_lens > self.cap_tokens, self.cap_tokens, fb.seq_lens) - 1)  # ok: FC101
        n = self._fill_window_host(fb)
        self._grow_eager_indices(n)
        self.eager_kv_indices[:n].copy_(self.kv_indices_host[:n], non_blocking=True)
        if fb.forward_mode == "extend":
            qo_indptr = fb.qo_indptr.to(self.device, non_blocking=True)  # the scheduler hands it over on the host
            self.prefill_wrapper.plan(  # expect: FC102
                qo_indptr, self.kv_indptr_host[: bs + 1], self.eager_kv_indices[:n], self.kv_last_page_len_host[:bs],
                *self.heads, self.page_size, causal=True,
            )
            return
        self._plan_sinks(fb)
        self.kv_indptr_gpu[: bs + 1].copy_(self.kv_indptr_host[: bs + 1], non_blocking=True)
        self.decode_wrapper.plan(  # expect: FC102
            self.kv_indptr_gpu[: bs + 1], self.eager_kv_indices[:n], self.kv_last_page_len_host[:bs],
            *self.heads, self.page_size,
        )

    def init_forward_metadata_capture_cuda_graph(self, bs: int, fb: ForwardBatch):
        self._plan_sinks(fb)
        n = self._fill_window_host(fb, padded_bs=bs)
        self.graph_wrappers[bs].plan(  # ok: FC102
            self.kv_indptr_host[: bs + 1], self.kv_indices_host[:n], self.kv_last_page_len_host[:bs],
            *self.heads, self.page_size,
        )

    def init_forward_metadata_replay_cuda_graph(self, bs: int, fb: ForwardBatch):
        w = self.graph_wrappers[bs]
        if w._fixed_batch_size != bs:  # expect: FC103
            raise RuntimeError(f"graph wrapper for {bs} was planned for another batch size")
        raw = fb.batch_size
        kept = fb.cache_lens[:raw].tolist()  # expect: FC101
        self.window_fill = sum(kept) / (raw * self.cap_tokens)
        longest = int(fb.cache_lens_cpu[:raw].max())  # ok: FC101
        self._plan_sinks(fb)
        n = self._fill_window_host(fb, padded_bs=bs)
        self.kv_indices[:n].copy_(self.kv_indices_host[:n], non_blocking=True)  # ok: FC104
        fast_decode_plan(  # ok: FC102
            w, self.kv_indptr_host[: bs + 1], self.kv_indices[:n], self.kv_last_page_len_host[:bs],
            *self.heads, self.page_size,
        )
        torch.remainder(fb.cache_lens - 1, self.page_size, out=self.kv_last_page_len[:raw]).add_(1)  # expect: FC104
        self.kv_indptr_host.zero_()  # ok: FC104
        self.rope_positions[:raw].copy_(fb.cache_lens.clamp(max=longest) - 1)  # ok: FC104

    def forward_decode(self, q: torch.Tensor, layer_id: int, fb: ForwardBatch, use_graph: bool):
        kv = self.kv_pool[layer_id]
        w = self.graph_wrappers[fb.batch_size] if use_graph else self.decode_wrapper
        o_win, lse_win = w.run(q, kv, return_lse=True)  # ok: FC108
        o_sink, lse_sink = self.sink_wrapper.run(q, kv, return_lse=True)  # expect: FC108
        o, _ = merge_state(o_win, lse_win, o_sink, lse_sink)
        return o

    def forward_extend(self, q: torch.Tensor, layer_id: int):
        return self.prefill_wrapper.run(q, self.kv_pool[layer_id])
