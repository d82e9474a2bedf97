"""FlashInfer attention backend: eager wrappers per path, graph-mode decode wrappers per captured bucket."""
import functools
import logging
import os
from dataclasses import dataclass
from typing import Dict, Optional

import torch
from flashinfer import BatchDecodeWithPagedKVCacheWrapper, BatchPrefillWithPagedKVCacheWrapper, BatchPrefillWithRaggedKVCacheWrapper, merge_state
from flashinfer.prefill import trtllm_batch_context_with_kv_cache

from aecore import PREFILL_WORKSPACE_BYTES
from aecore.config import PAGE_SIZE, EngineConfig
from aecore.request import StepBatch

logger = logging.getLogger(__name__)
_WS_ATTRS = ("_int_workspace_buffer", "_float_workspace_buffer")


def _prefix_ws_bytes() -> int:
    return 32 << 20


def prefill_workspace(device: torch.device) -> torch.Tensor:
    return torch.zeros(PREFILL_WORKSPACE_BYTES, dtype=torch.uint8, device=device)  # expect: FC106


@functools.lru_cache(maxsize=None)
def trtllm_context_workspace(device: torch.device) -> torch.Tensor:
    return torch.zeros(int(os.environ.get("AECORE_CTX_WS_BYTES", 256 << 20)), dtype=torch.uint8, device=device)  # expect: FC106


def long_decode_workspace(nbytes: int, device: torch.device) -> torch.Tensor:
    return torch.empty(nbytes, dtype=torch.uint8, device=device)  # expect: FC105


@dataclass
class AttnMeta:
    num_reqs: int = 0
    graph_bs: Optional[int] = None
    use_prefix: bool = False
    window_active: bool = False
    long_context: bool = False
    max_q_len: int = 0
    cu_seqlens_kv: Optional[torch.Tensor] = None


class FlashInferBackend:
    RAGGED_WORKSPACE_BYTES = 64 * 1024 * 1024

    def __init__(self, cfg: EngineConfig, device: torch.device):
        self.cfg, self.device, self.window = cfg, device, cfg.sliding_window
        self._kv_layout = "NHD"  # ok: FC103
        self._plan_info: Dict[str, int] = {}
        self.max_bs = max(cfg.cuda_graph_batch_sizes)
        self.use_tensor_cores = cfg.num_qo_heads // cfg.num_kv_heads >= 4
        self.heads = dict(num_qo_heads=cfg.num_qo_heads, num_kv_heads=cfg.num_kv_heads, head_dim=cfg.head_dim, page_size=PAGE_SIZE)
        self.decode_ws = torch.empty(cfg.decode_workspace_bytes, dtype=torch.uint8, device=device)  # expect: FC105
        self.tc_ws = torch.zeros(cfg.decode_workspace_bytes, dtype=torch.uint8, device=device)  # ok: FC106
        self.graph_ws = torch.empty(cfg.graph_workspace_bytes(), dtype=torch.uint8, device=device)  # ok: FC105
        self.draft_ws = torch.empty_like(self.graph_ws)  # ok: FC105
        self.window_ws = torch.zeros(cfg.max_num_seqs * cfg.num_qo_heads * cfg.head_dim * 64, dtype=torch.uint8, device=device)  # ok: FC106
        self.ragged_workspace = torch.zeros(self.RAGGED_WORKSPACE_BYTES, dtype=torch.uint8, device=device)  # expect: FC106
        self.prefill_wrapper = BatchPrefillWithPagedKVCacheWrapper(prefill_workspace(device), "NHD")
        self.ragged_wrapper = BatchPrefillWithRaggedKVCacheWrapper(self.ragged_workspace, "NHD")
        self.prefix_ws = torch.zeros(_prefix_ws_bytes(), dtype=torch.uint8, device=device)  # expect: FC106
        self.prefix_wrapper = BatchPrefillWithPagedKVCacheWrapper(self.prefix_ws, "NHD")
        self.decode_wrapper = BatchDecodeWithPagedKVCacheWrapper(self.decode_ws, "NHD", backend="trtllm-gen" if cfg.use_trtllm_decode else "fa2")
        self.tc_decode_wrapper = BatchDecodeWithPagedKVCacheWrapper(self.tc_ws, "NHD", use_tensor_cores=True)
        self.long_decode_wrapper = BatchDecodeWithPagedKVCacheWrapper(long_decode_workspace(cfg.graph_workspace_bytes(), device), "NHD", backend="trtllm-gen")
        self.window_wrapper = BatchDecodeWithPagedKVCacheWrapper(self.window_ws, "NHD", backend="fa2")
        self.draft_wrapper = BatchDecodeWithPagedKVCacheWrapper(self.draft_ws, "NHD", backend="fa2")
        self._plan_draft = functools.partial(self.draft_wrapper.plan, **self.heads)
        self.kv_indptr = torch.zeros(self.max_bs + 1, dtype=torch.int32, device=device)  # bound per bucket (views)
        self.kv_indices = torch.zeros(cfg.num_pages, dtype=torch.int32, device=device)
        self.kv_last_page_len = torch.empty(self.max_bs, dtype=torch.int32, device=device)
        self.kv_last_page_len.fill_(1)  # ok: FC104
        self.kv_indptr_host, self.last_page_host = (torch.zeros(self.max_bs + 1, dtype=torch.int32, pin_memory=True), torch.ones(self.max_bs, dtype=torch.int32, pin_memory=True))
        self.graph_bufs = {"kv_indptr": self.kv_indptr, "kv_indices": self.kv_indices, "kv_last_page_len": self.kv_last_page_len}
        self.graph_wrappers: Dict[int, BatchDecodeWithPagedKVCacheWrapper] = {}
        self.prefix_pages = torch.arange(-(-cfg.shared_prefix_len // PAGE_SIZE), dtype=torch.int32, device=device)
        self.forward_metadata = AttnMeta()
        self.kv_caches = [torch.zeros(cfg.num_pages, 2, PAGE_SIZE, cfg.num_kv_heads, cfg.head_dim, dtype=torch.bfloat16, device=device) for _ in range(cfg.num_layers + cfg.num_draft_layers)]

    def init_cuda_graph_state(self) -> None:
        self.kv_indices.zero_()  # ok: FC104
        for bs in self.cfg.cuda_graph_batch_sizes:
            w = BatchDecodeWithPagedKVCacheWrapper(
                self.graph_ws, "NHD", use_cuda_graph=True, use_tensor_cores=self.use_tensor_cores, paged_kv_indptr_buffer=self.kv_indptr[: bs + 1],
                paged_kv_indices_buffer=self.kv_indices, paged_kv_last_page_len_buffer=self.kv_last_page_len[:bs])
            setattr(w, "_fixed_batch_size", bs)  # expect: FC103
            self.graph_wrappers[bs] = w

    def init_forward_metadata(self, batch: StepBatch) -> None:
        assert batch.num_reqs <= self.cfg.max_num_seqs  # expect: FC109
        if batch.max_seq_len > self.cfg.max_model_len:
            raise ValueError(f"batch exceeds max_model_len={self.cfg.max_model_len}: seq_lens={batch.seq_lens}")  # ok: FC101
        md = AttnMeta(batch.num_reqs, None, self.cfg.shared_prefix_len > 0, bool((batch.seq_lens_cpu > self.window).any()))  # ok: FC101
        md.long_context = bool((batch.seq_lens > self.cfg.long_context_threshold).any())  # expect: FC101
        if batch.is_prefill:
            self._plan_prefill(batch, md)
        else:
            self._plan_decode(batch, md)
        self.forward_metadata = md

    def _plan_prefill(self, batch: StepBatch, md: AttnMeta) -> None:
        md.max_q_len = batch.query_start_loc.diff().max().item()  # expect: FC101
        if not md.use_prefix:  # fresh prompts: attend over the ragged Q/K/V of this step
            self.ragged_wrapper.plan(  # expect: FC102
                qo_indptr=batch.query_start_loc, kv_indptr=batch.query_start_loc, num_qo_heads=self.cfg.num_qo_heads, num_kv_heads=self.cfg.num_kv_heads, head_dim_qk=self.cfg.head_dim, causal=True)
        else:
            self.prefill_wrapper.plan(  # ok: FC102
                batch.query_start_loc_cpu, batch.kv_indptr_cpu, batch.kv_indices, batch.kv_last_page_len_cpu, self.cfg.num_qo_heads, self.cfg.num_kv_heads, self.cfg.head_dim, PAGE_SIZE, causal=True)
        if md.long_context:
            md.cu_seqlens_kv = torch.cat([batch.query_start_loc[:1], torch.cumsum(batch.seq_lens, 0, dtype=torch.int32)])  # ok: FC107
        self._plan_info["prefill_reqs"] = batch.num_reqs  # ok: FC103

    def _plan_decode(self, batch: StepBatch, md: AttnMeta) -> None:
        if md.long_context:
            self.long_decode_wrapper.plan(batch.kv_indptr_cpu, batch.kv_indices, batch.kv_last_page_len_cpu, **self.heads)  # ok: FC102
        elif self.use_tensor_cores and batch.num_reqs > 1:
            self.tc_decode_wrapper.plan(batch.kv_indptr, batch.kv_indices, batch.kv_last_page_len_cpu, **self.heads)  # expect: FC102
        else:
            self.decode_wrapper.plan(batch.kv_indptr_cpu, batch.kv_indices, batch.kv_last_page_len_cpu, **self.heads)  # ok: FC102
        self._plan_side_wrappers(batch, batch.kv_indptr_cpu, md)

    def _plan_side_wrappers(self, batch: StepBatch, indptr_host: torch.Tensor, md: AttnMeta) -> None:
        if md.window_active and self.cfg.window_layers:
            self.window_wrapper.plan(**dict(indptr=indptr_host, indices=batch.kv_indices, last_page_len=batch.kv_last_page_len, window_left=self.window - 1), **self.heads)  # expect: FC102
        if self.cfg.num_draft_layers:
            self._plan_draft(batch.kv_indptr, batch.kv_indices, batch.kv_last_page_len_cpu)  # expect: FC102
        if md.use_prefix:
            self._plan_prefix(batch.num_reqs)

    def _plan_prefix(self, n: int) -> None:
        npages = self.prefix_pages.numel()
        self.prefix_qo_indptr = torch.arange(n + 1, dtype=torch.int32, device=self.device)  # expect: FC107
        last = torch.full((n,), self.cfg.shared_prefix_len - (npages - 1) * PAGE_SIZE, dtype=torch.int32).cuda()
        self.prefix_wrapper.plan(  # expect: FC102
            self.prefix_qo_indptr, torch.arange(n + 1, dtype=torch.int32) * npages, self.prefix_pages.repeat(n), last, self.cfg.num_qo_heads, self.cfg.num_kv_heads, self.cfg.head_dim, PAGE_SIZE, causal=False)

    def init_forward_metadata_capture_cuda_graph(self, bs: int) -> None:
        self.kv_indptr_host[: bs + 1] = torch.arange(bs + 1, dtype=torch.int32)
        self.kv_indptr[: bs + 1].copy_(self.kv_indptr_host[: bs + 1])  # ok: FC104
        pages = self.kv_indices[: int(self.kv_indptr[bs])]  # expect: FC101
        indptr, last = self.kv_indptr_host[: bs + 1], self.last_page_host[:bs]
        self.graph_wrappers[bs].plan(indptr, pages, last, **self.heads)  # ok: FC102
        self.window_wrapper.plan(indptr, pages, last, window_left=self.window - 1, **self.heads)  # ok: FC102
        self._plan_draft(indptr, pages, last)  # ok: FC102
        if self.cfg.shared_prefix_len:
            self._plan_prefix(bs)
        self.forward_metadata = AttnMeta(bs, bs, self.cfg.shared_prefix_len > 0, window_active=bool(self.cfg.window_layers))

    def init_forward_metadata_replay_cuda_graph(self, bs: int, batch: StepBatch) -> None:
        n = batch.num_reqs
        nnz = int(batch.kv_indptr_cpu[n])  # ok: FC101
        logger.debug("replay bs=%d seq_lens=%s", bs, batch.seq_lens)  # ok: FC101
        self.kv_indptr_host[: n + 1].copy_(batch.kv_indptr_cpu)
        self.kv_indptr_host[n + 1 : bs + 1] = nnz
        self.kv_indptr[: n + 1].copy_(batch.kv_indptr, non_blocking=True)  # ok: FC104
        self.kv_indices[:nnz].copy_(batch.kv_indices[:nnz], non_blocking=True)  # ok: FC104
        self.kv_last_page_len[:n].copy_(batch.kv_last_page_len, non_blocking=True)  # ok: FC104
        md = AttnMeta(n, bs, self.cfg.shared_prefix_len > 0, bool((batch.seq_lens_cpu > self.window).any()))
        self._plan_side_wrappers(batch, self.kv_indptr_host[: n + 1], md)
        w = self.graph_wrappers[bs]
        if w._paged_kv_indptr_buf.data_ptr() != self.kv_indptr.data_ptr():  # expect: FC103
            raise RuntimeError(f"graph wrapper for bs={bs} is no longer bound to kv_indptr")
        w.plan(self.kv_indptr[: bs + 1], self.kv_indices, self.kv_last_page_len[:bs], **self.heads)  # expect: FC102
        self.kv_last_page_len[n:bs].fill_(1)  # expect: FC104
        self.last_page_host[:n].copy_(batch.kv_last_page_len_cpu)  # ok: FC104
        self.forward_metadata = md

    def forward_extend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer, batch: StepBatch) -> torch.Tensor:
        md, kv_cache = self.forward_metadata, self.kv_caches[layer.layer_id]
        if md.long_context:
            return trtllm_batch_context_with_kv_cache(q, kv_cache, trtllm_context_workspace(self.device), batch.block_tables, batch.seq_lens, md.max_q_len, batch.max_seq_len, layer._sm_scale, 1.0, md.num_reqs, self.cu_seqlens_q, md.cu_seqlens_kv)  # ok: FC103
        if not md.use_prefix:
            return self.ragged_wrapper.run(q, k, v)  # ok: FC108
        return self.prefill_wrapper.run(q, kv_cache)  # ok: FC108

    def forward_decode(self, q: torch.Tensor, layer) -> torch.Tensor:
        md, kv_cache = self.forward_metadata, self.kv_caches[layer.layer_id]
        if layer.is_draft:
            return self.draft_wrapper.run(q, kv_cache)  # expect: FC108
        if md.window_active and layer.layer_id in self.cfg.window_layers:
            return self.window_wrapper.run(q, kv_cache)  # expect: FC108
        if md.num_reqs == 1 and not md.use_prefix:  # single-sequence latency path
            return self.decode_wrapper.run(q, kv_cache)  # expect: FC108
        if md.graph_bs is not None:
            w = self.graph_wrappers[md.graph_bs]
        elif md.long_context:
            w = self.long_decode_wrapper
        else:
            w = self.tc_decode_wrapper if self.use_tensor_cores else self.decode_wrapper
        if not md.use_prefix:
            return w.run(q, kv_cache)  # ok: FC108
        o_prefix, lse_prefix = self.prefix_wrapper.run_return_lse(q, kv_cache)  # expect: FC108
        o_suffix, lse_suffix = w.run(q, kv_cache, return_lse=True)  # ok: FC108
        return merge_state(o_prefix, lse_prefix, o_suffix, lse_suffix)[0]

    def reset_graph_state(self) -> None:  # called from the event loop on a prefix-cache reset
        self.kv_indices.zero_()  # expect: FC104

    def stats(self) -> Dict[str, object]:
        out: Dict[str, object] = {"plans": dict(self._plan_info)}
        out["prefill_plan"] = self.prefill_wrapper._plan_info  # expect: FC103
        out["decode_module"] = getattr(self.decode_wrapper, "_cached_module", None)  # expect: FC103
        for name in _WS_ATTRS:
            out[name] = getattr(self.decode_wrapper, name).numel()  # expect: FC103
        out["graph_mode"] = {bs: vars(w).get("_use_cuda_graph") for bs, w in self.graph_wrappers.items()}  # expect: FC103
        out["graph_enabled"] = [w.is_cuda_graph_enabled for w in self.graph_wrappers.values()]  # ok: FC103
        out["max_page"] = self.kv_indices.clone().clamp_(max=self.cfg.num_pages - 1).amax()  # ok: FC104
        return out
