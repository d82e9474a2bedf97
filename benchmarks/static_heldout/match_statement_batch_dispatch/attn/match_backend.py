"""FlashInfer attention backend; plan and run paths are chosen by `match` on the batch."""
from __future__ import annotations

import functools
import logging
import os
from typing import Dict, Optional

import torch
from flashinfer import (BatchDecodeWithPagedKVCacheWrapper, BatchPrefillWithPagedKVCacheWrapper,
                        BatchPrefillWithRaggedKVCacheWrapper)

from attn.trtllm_gen import TrtllmGenDecode
from mdispatch import (PAGE_SIZE, PREFILL_WORKSPACE_BYTES, DecodeBatch, EngineConfig, PrefillBatch,
                       shared_float_workspace, window_workspace_bytes)

logger = logging.getLogger(__name__)


class SoftcapDecodeWrapper(BatchDecodeWithPagedKVCacheWrapper):
    def check_layout(self) -> None:
        if self._kv_layout != "NHD":  # expect: FC103
            raise ValueError("soft-capped decode supports NHD pages only")


class MatchAttnBackend:
    GRAPH_WS_BYTES = 64 << 20

    def __init__(self, cfg: EngineConfig, device: torch.device):
        self.cfg = cfg
        self.device = device
        self.kv_layout = "NHD"
        self._plan_info: Dict[str, int] = {}  # ok: FC103
        ws = shared_float_workspace(cfg.decode_workspace_bytes, str(device))
        self.decode_wrapper = BatchDecodeWithPagedKVCacheWrapper(ws, self.kv_layout)
        self.decode_wrapper.plan(torch.arange(2, dtype=torch.int32), torch.zeros(1, dtype=torch.int32, device=device),  # ok: FC102
                                 torch.ones(1, dtype=torch.int32), *self._dims())  # JIT-compile before the first request
        softcap_ws = torch.empty(cfg.split_kv_workspace_bytes(), dtype=torch.uint8, device=device)  # ok: FC106
        self.softcap_wrapper = SoftcapDecodeWrapper(softcap_ws, self.kv_layout, backend="fa2")
        self.window_workspace = torch.zeros(window_workspace_bytes(), dtype=torch.uint8, device=device)  # expect: FC106
        self.window_wrapper = BatchDecodeWithPagedKVCacheWrapper(self.window_workspace, self.kv_layout)
        self._window_plan = functools.partial(self.window_wrapper.plan, window_left=cfg.window - 1)
        prefill_ws = torch.empty(PREFILL_WORKSPACE_BYTES, dtype=torch.uint8, device=device)  # expect: FC106
        self.ragged_wrapper = BatchPrefillWithRaggedKVCacheWrapper(prefill_ws, self.kv_layout, backend="fa2")
        paged_ws = torch.zeros(int(os.environ.get("MD_PAGED_PREFILL_WS_MB", "96")) << 20, dtype=torch.uint8, device=device)  # expect: FC106
        self.paged_wrapper = BatchPrefillWithPagedKVCacheWrapper(paged_ws, self.kv_layout)
        self.graph_workspace = torch.zeros(self.GRAPH_WS_BYTES, dtype=torch.uint8, device=device)  # expect: FC106
        self.trtllm = TrtllmGenDecode(cfg, device, self._dims()) if cfg.use_trtllm_decode else None
        self.graph_wrappers: Dict[int, BatchDecodeWithPagedKVCacheWrapper] = {}
        self.active_bs: Optional[int] = None
        self.token_req_buf = torch.zeros(cfg.max_num_tokens, dtype=torch.int64, device=device)

    def _dims(self):
        c = self.cfg
        assert c.num_qo_heads % c.num_kv_heads == 0, "GQA group must divide the query heads"  # ok: FC109
        return c.num_qo_heads, c.num_kv_heads, c.head_dim, PAGE_SIZE

    def describe(self) -> str:
        decode = self.trtllm._backend if self.trtllm is not None else "fa2"  # ok: FC103
        ws_mib = self.decode_wrapper._float_workspace_buffer.numel() >> 20  # expect: FC103
        return f"decode={decode} workspace={ws_mib}MiB graphs={sorted(self.graph_wrappers)}"

    def is_warm(self) -> bool:
        return getattr(self.ragged_wrapper, "_cached_module", None) is not None  # expect: FC103

    def disable_graphs(self) -> None:  # after an OOM during capture: keep serving eagerly on the same wrappers
        assert self.graph_wrappers, "no decode graphs were captured"  # ok: FC109
        for w in self.graph_wrappers.values():
            setattr(w, "_use_cuda_graph", False)  # expect: FC103
        self.active_bs = None

    def init_cuda_graph_state(self, max_bs: int, max_pages: int) -> None:
        assert max_bs <= self.cfg.max_batch_size, "graph bucket above the engine's max batch"  # expect: FC109
        self.kv_indptr_buf = torch.zeros(max_bs + 1, dtype=torch.int32, device=self.device)
        self.kv_indices_buf = torch.zeros(max_pages, dtype=torch.int32, device=self.device)
        self.kv_last_page_len_buf = torch.empty(max_bs, dtype=torch.int32, device=self.device)
        self.kv_last_page_len_buf.fill_(1)  # ok: FC104
        self.kv_indptr_host = torch.zeros(max_bs + 1, dtype=torch.int32, pin_memory=True)
        self.last_page_len_host = torch.ones(max_bs, dtype=torch.int32, pin_memory=True)
        self.seq_lens_host = torch.zeros(max_bs, dtype=torch.int32, pin_memory=True)

    def init_forward_metadata_capture_cuda_graph(self, bs: int, batch) -> None:
        match batch:
            case DecodeBatch() if self.trtllm is not None:
                self.trtllm.prepare_graph(bs, batch)
                self.active_bs = bs
            case DecodeBatch(kv_indptr_cpu=indptr_cpu, kv_last_page_len_cpu=last_cpu, kv_indices=indices):
                w = BatchDecodeWithPagedKVCacheWrapper(
                    self.graph_workspace, self.kv_layout, use_cuda_graph=True, paged_kv_indices_buffer=self.kv_indices_buf,
                    paged_kv_indptr_buffer=self.kv_indptr_buf[: bs + 1],
                    paged_kv_last_page_len_buffer=self.kv_last_page_len_buf[:bs])
                self.kv_indptr_host[: bs + 1].copy_(indptr_cpu)  # ok: FC101
                self.last_page_len_host[:bs].copy_(last_cpu)
                self.kv_indices_buf[: indices.shape[0]].copy_(indices)  # ok: FC104
                w.plan(self.kv_indptr_host[: bs + 1], self.kv_indices_buf, self.last_page_len_host[:bs],  # ok: FC102
                       *self._dims())
                logger.info("decode bucket %d planned: %s", bs, w._plan_info)  # expect: FC103
                self.graph_wrappers[bs] = w
                self.active_bs = bs

    def init_forward_metadata_replay_cuda_graph(self, bs: int, batch: DecodeBatch) -> None:
        self.active_bs = bs
        if self.trtllm is not None:
            self.trtllm.prepare_graph(bs, batch)
            return
        real = batch.batch_size
        n = int(batch.kv_indptr_cpu[real])  # ok: FC101
        self.kv_indptr_buf[: real + 1].copy_(batch.kv_indptr)  # ok: FC104
        self.kv_indices_buf[:n].copy_(batch.kv_indices[:n])  # ok: FC104
        self.last_page_len_host[:real].copy_(batch.kv_last_page_len_cpu)  # ok: FC101
        self.seq_lens_host[:real].copy_(batch.seq_lens)  # expect: FC101
        self.graph_wrappers[bs].plan(self.kv_indptr_buf[: bs + 1], self.kv_indices_buf,  # expect: FC102
                                     self.last_page_len_host[:bs], *self._dims())
        self.kv_indptr_buf[real + 1 : bs + 1].fill_(n)  # expect: FC104
        self.last_page_len_host[real:bs] = 1  # ok: FC104

    def init_forward_metadata(self, batch) -> None:
        c = self.cfg
        self.active_bs = None
        match batch:
            case DecodeBatch(seq_lens=lens) if batch.batch_size > c.max_batch_size:
                raise ValueError(f"decode batch of {batch.batch_size} over the limit, seq_lens={lens}")  # ok: FC101
            case DecodeBatch(draft_step=k) if k > 0 and self.trtllm is not None:  # ok: FC101
                self.trtllm.plan_draft(batch)
            case DecodeBatch(window=True, kv_indptr=indptr):
                self._plan_window(indptr, batch)
            case DecodeBatch(softcap=True, kv_indptr=indptr, kv_indices=indices):
                self.softcap_wrapper.plan(indptr, indices, batch.kv_last_page_len_cpu, *self._dims(),  # expect: FC102
                                          logits_soft_cap=c.logit_cap)
            case DecodeBatch(kv_indptr_cpu=indptr_cpu, kv_indices=indices, kv_last_page_len_cpu=last_cpu):
                if self.trtllm is not None:
                    self.trtllm.plan_eager(batch)
                else:
                    self.decode_wrapper.plan(indptr_cpu, indices, last_cpu, *self._dims())  # ok: FC102
            case PrefillBatch(has_prefix=True, qo_indptr=qo, kv_indptr_cpu=kv_cpu):
                self.paged_wrapper.plan(qo, kv_cpu, batch.kv_indices, batch.kv_last_page_len_cpu,  # expect: FC102
                                        *self._dims(), causal=True)
            case PrefillBatch(qo_indptr=qo_indptr):
                self._plan_prefill(qo_indptr)
            case _:
                raise TypeError(f"cannot plan a {type(batch).__name__}")

    def _plan_window(self, indptr: torch.Tensor, batch: DecodeBatch) -> None:
        live = batch.kv_indices[: indptr[-1]]  # expect: FC101
        batch.scratch = torch.empty_like(batch.seq_lens)  # ok: FC107
        torch.clamp(batch.seq_lens - self.cfg.window, min=0, out=batch.scratch)  # window start, read by rope
        self._plan_info["window_max_len"] = batch.seq_lens.max().item()  # expect: FC101
        self._window_plan(indptr, live, batch.kv_last_page_len_cpu, *self._dims())  # expect: FC102

    def _plan_prefill(self, qo_indptr: torch.Tensor) -> None:
        total = int(qo_indptr[-1])  # expect: FC101
        logger.debug("ragged prefill: %d tokens, qo_indptr=%s", total, qo_indptr)  # ok: FC101
        if self.token_req_buf.numel() < total:  # chunked prefill above max_num_tokens
            self.token_req_buf = torch.empty(total, dtype=torch.int64, device=self.device)  # expect: FC107
        c = self.cfg
        self.ragged_wrapper.plan(qo_indptr, qo_indptr, c.num_qo_heads, c.num_kv_heads, c.head_dim, causal=True)  # expect: FC102

    def forward_decode(self, q, kv_cache: torch.Tensor, batch) -> torch.Tensor:
        match batch:
            case DecodeBatch(draft_step=k) if k > 0 and self.trtllm is not None:
                return self.trtllm.draft_forward(q, kv_cache, batch)
            case DecodeBatch(window=True):
                return self.window_wrapper.run(q, kv_cache)  # expect: FC108
            case DecodeBatch(softcap=True):
                return self.softcap_wrapper.run(q, kv_cache)  # expect: FC108
            case DecodeBatch() if self.trtllm is not None:
                return self.trtllm.forward(q, kv_cache, self.active_bs)
            case DecodeBatch(draft_step=k):
                w = self.graph_wrappers[self.active_bs] if self.active_bs is not None else self.decode_wrapper
                out = w.run(q, kv_cache)  # ok: FC108
                if k > 0:  # the next draft token lands one slot further on the page
                    self.kv_last_page_len_buf[: q.shape[0]].remainder_(PAGE_SIZE).add_(1)  # expect: FC104
                return out
            case _:
                raise TypeError(f"no decode path for {type(batch).__name__}")

    def forward_extend(self, q, k, v, kv_cache: torch.Tensor, batch: PrefillBatch) -> torch.Tensor:
        n = batch.qo_indptr_cpu.shape[0] - 1
        req_ids = torch.arange(n, device=self.device)
        if batch.has_prefix:  # ok: FC101
            total = int(batch.qo_indptr_cpu[-1])  # ok: FC101
            token_req = torch.repeat_interleave(req_ids, batch.extend_lens, output_size=total)  # ok: FC101
            self.token_req_buf[:total] = token_req  # ok: FC104
            return self.paged_wrapper.run(q, kv_cache)  # ok: FC108
        token_req = torch.repeat_interleave(req_ids, batch.extend_lens)  # expect: FC101
        self.token_req_buf[: token_req.shape[0]] = token_req
        torch.cumsum(batch.extend_lens, 0, out=self.kv_indptr_buf[1 : n + 1])  # expect: FC104
        return self.ragged_wrapper.run(q, k, v)  # ok: FC108
