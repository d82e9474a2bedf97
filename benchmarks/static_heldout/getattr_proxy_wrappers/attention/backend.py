"""FlashInfer attention backend that only holds proxies of its wrappers."""
from __future__ import annotations

import functools
from typing import Dict, Optional

import torch
from flashinfer import (BatchDecodeWithPagedKVCacheWrapper, BatchPrefillWithPagedKVCacheWrapper,
                        BatchPrefillWithRaggedKVCacheWrapper, MultiLevelCascadeAttentionWrapper, merge_state)

from attention.fns import DecodeForwardFn, DecodePlanFn, RaggedPlanFn, WindowPlanFn
from proxyserve import (PAGE_SIZE, ForwardBatch, Fp8KvShim, ServeConfig, TracedWrapper, WsSize, instrument,
                        scratch_workspace)
from proxyserve import config as cfgmod


@instrument("init_forward_metadata", "forward_decode", "forward_extend")
class ProxyAttnBackend:
    def __init__(self, cfg: ServeConfig, device: torch.device):
        self.cfg, self.device, c = cfg, device, cfg
        self._kv_layout = "NHD"  # ok: FC103
        decode_ws = torch.zeros(cfgmod.DECODE_WS_BYTES, dtype=torch.uint8, device=device)  # expect: FC106
        self.decode_proxy = TracedWrapper(BatchDecodeWithPagedKVCacheWrapper(decode_ws, "NHD"), "decode")
        window_ws = torch.zeros(cfgmod._WS_MIB["window"] << 20, dtype=torch.uint8, device=device)  # expect: FC106
        self.window_proxy = TracedWrapper(BatchDecodeWithPagedKVCacheWrapper(window_ws, "NHD"), "window")
        fp8_inner = BatchDecodeWithPagedKVCacheWrapper(scratch_workspace(c.float_ws_bytes, str(device)), "NHD",
                                                       backend=c.decode_backend)
        self.fp8_decode = Fp8KvShim(fp8_inner, "fp8", torch.ones(1, dtype=torch.float32, device=device), c.head_dim,
                                    c.max_num_tokens)
        cascade_ws = torch.zeros(c.float_ws_bytes, dtype=torch.uint8, device=device)  # ok: FC106
        self.cascade = TracedWrapper(MultiLevelCascadeAttentionWrapper(2, cascade_ws, "NHD"), "cascade")
        ragged_ws = torch.empty(WsSize.RAGGED, dtype=torch.uint8, device=device)  # expect: FC106
        self.ragged_proxy = TracedWrapper(BatchPrefillWithRaggedKVCacheWrapper(ragged_ws, "NHD", backend="fa2"), "ragged")
        paged_ws = torch.zeros(cfgmod.paged_ws_bytes(), dtype=torch.uint8, device=device)  # expect: FC106
        self.paged_proxy = TracedWrapper(BatchPrefillWithPagedKVCacheWrapper(paged_ws, "NHD"), "paged")
        trtllm_ws = torch.zeros(c.float_ws_bytes, dtype=torch.uint8, device=device)  # ok: FC105
        self.trtllm_eager = TracedWrapper(BatchDecodeWithPagedKVCacheWrapper(trtllm_ws, "HND", backend="trtllm-gen"), "trtllm")
        self._trtllm_plan = functools.partial(self.trtllm_eager.plan, page_size=PAGE_SIZE)
        self.graph_ws = torch.empty(c.float_ws_bytes, dtype=torch.uint8, device=device)  # expect: FC105
        self.decode_plan, self.window_plan = DecodePlanFn(self.decode_proxy, c), WindowPlanFn(self.window_proxy, c)
        self.ragged_plan, self.window_fwd = RaggedPlanFn(self.ragged_proxy, c), DecodeForwardFn(self.window_proxy)
        self.graph_proxies: Dict[int, TracedWrapper] = {}
        self.graph_bs: Optional[int] = None

    @property
    def dims(self):
        return self.cfg.num_qo_heads, self.cfg.num_kv_heads, self.cfg.head_dim, PAGE_SIZE

    def warmup(self) -> None:  # JIT-compile the decode kernels before the first request
        one = torch.ones(1, dtype=torch.int32)
        self.decode_proxy.plan(torch.tensor([0, 1], dtype=torch.int32), one - 1, one, *self.dims)  # ok: FC102

    def index_capacity(self) -> Dict[int, int]:  # for the OOM report
        return {bs: vars(p._inner)["_paged_kv_indices_buf"].numel() for bs, p in self.graph_proxies.items()}  # expect: FC103

    def init_cuda_graph_state(self, max_bs: int) -> None:
        self.kv_indptr = torch.zeros(max_bs + 1, dtype=torch.int32, device=self.device)
        self.kv_indices = torch.zeros(self.cfg.max_pages, dtype=torch.int32, device=self.device)
        self.kv_last_page_len = torch.empty(max_bs, dtype=torch.int32, device=self.device)
        self.kv_last_page_len.fill_(1)  # ok: FC104
        self.kv_indptr_pinned = torch.zeros(max_bs + 1, dtype=torch.int32, pin_memory=True)
        self.last_page_len_pinned = torch.ones(max_bs, dtype=torch.int32, pin_memory=True)
        self.seq_lens_host = torch.zeros(max_bs, dtype=torch.int32, pin_memory=True)

    def on_pages_freed(self, rows: torch.Tensor) -> None:
        """Allocator hook: freed pages go back to the pool at once, so no graph may still point at them."""
        self.kv_indices[rows] = 0  # expect: FC104

    def init_forward_metadata_capture_cuda_graph(self, bs: int, fb: ForwardBatch) -> None:
        w = BatchDecodeWithPagedKVCacheWrapper(
            self.graph_ws, "NHD", use_cuda_graph=True, backend=self.cfg.decode_backend,
            paged_kv_indptr_buffer=self.kv_indptr[: bs + 1], paged_kv_indices_buffer=self.kv_indices,
            paged_kv_last_page_len_buffer=self.kv_last_page_len[:bs])
        self.kv_indptr[: bs + 1].copy_(fb.kv_indptr)  # ok: FC104
        self.kv_indptr_pinned[: bs + 1].copy_(fb.kv_indptr_cpu)
        self.last_page_len_pinned[:bs].copy_(fb.kv_last_page_len_cpu)
        self._plan_layers(fb)
        proxy = TracedWrapper(w, f"decode_graph_{bs}")
        proxy.plan(self.kv_indptr_pinned[: bs + 1], fb.kv_indices, self.last_page_len_pinned[:bs], *self.dims)  # ok: FC102
        self.graph_proxies[bs], self.graph_bs = proxy, bs

    def init_forward_metadata_replay_cuda_graph(self, bs: int, fb: ForwardBatch) -> None:
        real = fb.batch_size
        n = int(fb.kv_indptr_cpu[real])  # ok: FC101
        self.kv_indptr[: real + 1].copy_(fb.kv_indptr)  # ok: FC104
        self.kv_indices[:n].copy_(fb.kv_indices[:n])  # ok: FC104
        self.seq_lens_host[:real].copy_(fb.seq_lens)  # expect: FC101
        self.last_page_len_pinned[:real].copy_(fb.kv_last_page_len_cpu)  # ok: FC101
        self._plan_layers(fb)
        self.graph_proxies[bs].plan(self.kv_indptr[: bs + 1], self.kv_indices, self.last_page_len_pinned[:bs],  # expect: FC102
                                    *self.dims)
        self.kv_last_page_len[real:bs].fill_(1)  # expect: FC104
        self.kv_indptr_pinned[: real + 1].copy_(fb.kv_indptr_cpu)  # ok: FC104
        self.graph_bs = bs

    def init_forward_metadata(self, fb: ForwardBatch) -> None:
        self.graph_bs = None
        if not fb.is_decode:  # ok: FC101
            self.ragged_plan(fb)
            return self._plan_prefix(fb) if fb.shared_prefix else None
        if (fb.seq_lens >= self.cfg.max_context_len).any():  # expect: FC101
            raise ValueError(f"a request reached the context limit: seq_lens={fb.seq_lens}")  # ok: FC101
        self.decode_plan(fb)
        self._plan_layers(fb)

    def _plan_layers(self, fb: ForwardBatch) -> None:
        """The window, fp8-KV, shared-prefix and trtllm-gen layers run eager wrappers next to the graph."""
        self.window_plan(fb)
        self.fp8_decode.plan(fb.kv_indptr_cpu, fb.kv_indices, fb.kv_last_page_len, *self.dims)  # expect: FC102
        if fb.shared_prefix:
            self._plan_cascade(fb)
        if self.cfg.use_trtllm_decode:
            self._trtllm_plan(fb.kv_indptr, fb.kv_indices, fb.kv_last_page_len_cpu, *self.dims[:3])  # expect: FC102

    def _plan_cascade(self, fb: ForwardBatch) -> None:
        shared, n = self.cfg.shared_prefix_pages, fb.batch_size
        level0 = [torch.tensor([0, n], dtype=torch.int32), torch.tensor([0, shared], dtype=torch.int32)]
        self.cascade.plan([level0[0], fb.qo_indptr_cpu], [level0[1], fb.kv_indptr_cpu],  # ok: FC102
                          [fb.kv_indices[:shared], fb.kv_indices],
                          [torch.tensor([PAGE_SIZE], dtype=torch.int32), fb.kv_last_page_len_cpu], *self.dims)

    def _plan_prefix(self, fb: ForwardBatch) -> None:
        c = self.cfg
        self.paged_proxy.plan(**dict(qo_indptr=fb.qo_indptr_cpu, paged_kv_indptr=fb.kv_indptr_cpu,  # expect: FC102
                                     paged_kv_indices=fb.kv_indices, paged_kv_last_page_len=fb.kv_last_page_len,
                                     num_qo_heads=c.num_qo_heads, num_kv_heads=c.num_kv_heads,
                                     head_dim_qk=c.head_dim, page_size=PAGE_SIZE, causal=True))

    def forward_decode(self, q: torch.Tensor, kv_cache: torch.Tensor, fb: ForwardBatch, layer_id: int) -> torch.Tensor:
        c = self.cfg
        if layer_id % c.window_every == 1:
            return self.window_fwd(q, kv_cache)
        if layer_id in c.fp8_kv_layers:
            return self.fp8_decode.run(q, kv_cache)
        if fb.shared_prefix:
            return self.cascade.run(q, kv_cache)  # expect: FC108
        if c.use_trtllm_decode:
            return self.trtllm_eager.run(q, kv_cache)  # expect: FC108
        w = self.graph_proxies[self.graph_bs] if self.graph_bs is not None else self.decode_proxy
        out = w.run(q, kv_cache)  # ok: FC108
        self.kv_last_page_len[: q.shape[0]].clamp_(1, PAGE_SIZE)  # expect: FC104
        return out

    def forward_extend(self, q, k, v, kv_cache: torch.Tensor, fb: ForwardBatch) -> torch.Tensor:
        n = fb.batch_size
        torch.cumsum(fb.seq_lens, 0, out=self.kv_indptr[1 : n + 1])  # expect: FC104
        if fb.shared_prefix:
            o_new, lse_new = self.ragged_proxy.run_return_lse(q, k, v)  # ok: FC108
            o_pre, lse_pre = self.paged_proxy.run_return_lse(q, kv_cache)  # ok: FC108
            return merge_state(o_new, lse_new, o_pre, lse_pre)[0]
        return self.ragged_proxy.run(q, k, v)  # ok: FC108
