"""DeepSeek-style MLA through FlashInfer's MLA wrapper, with trtllm-gen MLA decode for very long contexts."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from flashinfer import BatchMLAPagedAttentionWrapper, BatchPrefillWithRaggedKVCacheWrapper
from flashinfer.decode import trtllm_batch_decode_with_kv_cache_mla

from ccbi import PAGE_SIZE
from ccbi.config import EngineConfig
from ccbi.forward_batch import ForwardBatch
from ccbi_attn.base import AttentionBackend
from ccbi_attn.flashinfer_backend import _pages, fill_kv_indices


def _mla_workspace_bytes() -> int:
    return 384 * 1024 * 1024


class MLABackend(AttentionBackend, name="flashinfer_mla"):
    _INDPTR_BUFS = ("mla_qo_indptr", "mla_kv_indptr")

    def __init__(self, cfg: EngineConfig, device: torch.device, shared_ws: torch.Tensor):
        super().__init__(cfg, device, shared_ws)
        self.mla_ws = torch.empty(_mla_workspace_bytes(), dtype=torch.uint8, device=device)  # expect: FC106
        self.ragged_ws = torch.empty(cfg.max_num_tokens * cfg.num_qo_heads * 1024, dtype=torch.uint8, device=device)  # ok: FC105
        max_bs = cfg.max_batch_size
        self.mla_qo_indptr = torch.arange(max_bs + 1, dtype=torch.int32, device=device)
        self.mla_kv_indptr = torch.zeros(max_bs + 1, dtype=torch.int32, device=device)
        self.mla_kv_indices = torch.zeros(cfg.num_pages, dtype=torch.int32, device=device)
        self.mla_kv_len = torch.zeros(max_bs, dtype=torch.int32, device=device)
        self.page_start = torch.zeros(max_bs, dtype=torch.int32, device=device)
        self.mla_wrapper = BatchMLAPagedAttentionWrapper(
            self.mla_ws, qo_indptr=self.mla_qo_indptr, kv_indptr=self.mla_kv_indptr, kv_indices=self.mla_kv_indices, kv_len_arr=self.mla_kv_len)
        self.ragged_wrapper = BatchPrefillWithRaggedKVCacheWrapper(self.ragged_ws, "NHD")
        self.use_trtllm = cfg.max_context_len > 65536
        self.max_kv_len = cfg.max_context_len
        self.sm_scale = (cfg.head_dim + cfg.qk_rope_head_dim) ** -0.5

    def _dims(self):
        c = self.cfg
        return c.num_qo_heads, c.kv_lora_rank, c.qk_rope_head_dim, PAGE_SIZE, False, self.sm_scale, torch.bfloat16, torch.bfloat16

    def init_cuda_graph_state(self, max_bs: int) -> None:
        self.max_graph_bs = max_bs  # the MLA wrapper's buffers are persistent already

    def init_forward_metadata(self, fb: ForwardBatch) -> None:
        bs = fb.batch_size
        for name in self._INDPTR_BUFS:
            setattr(self, name, torch.zeros(bs + 1, dtype=torch.int32, device=self.device))  # expect: FC107
        qo_lens_cpu = fb.extend_lens_cpu if fb.extend_lens_cpu is not None else torch.ones(bs, dtype=torch.int32)
        self.qo_indptr_cpu = torch.cat([torch.zeros(1, dtype=torch.int32), torch.cumsum(qo_lens_cpu, 0, dtype=torch.int32)])  # ok: FC107
        if not fb.is_decode:
            self.ragged_wrapper.plan(  # ok: FC102
                self.qo_indptr_cpu, self.qo_indptr_cpu, self.cfg.num_qo_heads, self.cfg.num_qo_heads, 192, head_dim_vo=128, causal=True)
            return
        kv_indptr_cpu = F.pad(torch.cumsum(_pages(fb.seq_lens_cpu[:bs]), 0, dtype=torch.int32), (1, 0))
        self.mla_kv_indptr.copy_(kv_indptr_cpu, non_blocking=True)
        fill_kv_indices(self.req_to_page, fb.req_pool_indices, self.page_start, self.mla_kv_indptr, self.mla_kv_indices, bs)
        if self.use_trtllm:
            self.max_kv_len = fb.seq_lens.max().item()  # expect: FC101
        self.mla_wrapper.plan(self.qo_indptr_cpu, kv_indptr_cpu, self.mla_kv_indices, fb.seq_lens[:bs], *self._dims())  # expect: FC102
        self.mla_kv_len[:bs].copy_(fb.seq_lens[:bs])  # ok: FC104

    def init_forward_metadata_replay_cuda_graph(self, bs: int, seq_lens_cpu: torch.Tensor, req_pool_indices: torch.Tensor) -> None:
        kv_indptr_cpu = F.pad(torch.cumsum(_pages(seq_lens_cpu[:bs]), 0, dtype=torch.int32), (1, 0))
        self.mla_kv_indptr[: bs + 1].copy_(kv_indptr_cpu, non_blocking=True)
        fill_kv_indices(self.req_to_page, req_pool_indices, self.page_start, self.mla_kv_indptr, self.mla_kv_indices, bs)
        self.mla_wrapper.plan(  # ok: FC102
            torch.arange(bs + 1, dtype=torch.int32), kv_indptr_cpu, self.mla_kv_indices, seq_lens_cpu[:bs], *self._dims())

    init_forward_metadata_capture_cuda_graph = init_forward_metadata_replay_cuda_graph

    def forward(self, q, k, v, layer, fb: ForwardBatch) -> torch.Tensor:
        return self.forward_decode(q, k, v, layer, fb) if fb.is_decode else self.forward_extend(q, k, v, layer, fb)

    def forward_decode(self, q, k, v, layer, fb: ForwardBatch) -> torch.Tensor:
        cache, c = self.kv_cache[layer.layer_id], self.cfg
        if self.use_trtllm:
            pages = self.req_to_page[fb.req_pool_indices, : fb.seq_lens.max() // PAGE_SIZE + 1]  # expect: FC101
            return trtllm_batch_decode_with_kv_cache_mla(
                query=q.unsqueeze(1), kv_cache=cache.unsqueeze(1), workspace_buffer=self.shared_ws, qk_nope_head_dim=c.head_dim,
                kv_lora_rank=c.kv_lora_rank, qk_rope_head_dim=c.qk_rope_head_dim, block_tables=pages, seq_lens=fb.seq_lens,
                max_seq_len=self.max_kv_len)
        q_nope, q_pe = q.split([c.kv_lora_rank, c.qk_rope_head_dim], dim=-1)
        ckv, kpe = cache.split([c.kv_lora_rank, c.qk_rope_head_dim], dim=-1)
        return self.mla_wrapper.run(q_nope, q_pe, ckv, kpe)  # expect: FC108

    def forward_extend(self, q, k, v, layer, fb: ForwardBatch) -> torch.Tensor:
        if fb.qo_indptr is None:  # ok: FC101
            raise ValueError("MLA prefill needs the qo_indptr the model runner builds")
        return self.ragged_wrapper.run(q, k, v)  # ok: FC108

    def kernels_ready(self) -> bool:
        return getattr(self.mla_wrapper, "_cached_module", None) is not None  # expect: FC103
