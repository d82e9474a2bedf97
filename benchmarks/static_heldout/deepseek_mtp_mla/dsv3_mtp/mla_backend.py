"""FlashInfer MLA backend shared by the DeepSeek-V3 target model and its MTP module."""
from __future__ import annotations

import dataclasses
import functools
import logging
from typing import Dict, Optional, Tuple

import torch
import triton
import triton.language as tl
from flashinfer.decode import trtllm_batch_decode_with_kv_cache_mla
from flashinfer.mla import BatchMLAPagedAttentionWrapper

from dsv3_mtp.spec import DeepseekV3Config, MTPDraftInput, SpecBatch, SpecLimits

logger = logging.getLogger(__name__)


@triton.jit
def _fill_page_indices(req_to_page_ptr, req_pool_indices_ptr, kv_indptr_ptr, kv_indices_ptr, stride: tl.constexpr, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    req = tl.load(req_pool_indices_ptr + pid)
    start = tl.load(kv_indptr_ptr + pid)
    n = tl.load(kv_indptr_ptr + pid + 1) - start
    for off in range(0, n, BLOCK):
        offs = off + tl.arange(0, BLOCK)
        pages = tl.load(req_to_page_ptr + req * stride + offs, mask=offs < n)
        tl.store(kv_indices_ptr + start + offs, pages, mask=offs < n)


@dataclasses.dataclass
class MLAMetadata:
    wrapper: Optional[BatchMLAPagedAttentionWrapper]
    mode: str  # "verify" | "draft" | "draft_extend"
    out_cache_loc: torch.Tensor
    req_pool_indices: Optional[torch.Tensor] = None
    seq_lens: Optional[torch.Tensor] = None
    max_seq_len: int = 0
    use_trtllm: bool = False


class FlashInferMLABackend:
    WORKSPACE_BYTES = 384 * 1024 * 1024

    def __init__(self, cfg: DeepseekV3Config, limits: SpecLimits, req_to_page: torch.Tensor, device: torch.device):
        self.device = device
        self.page_size = limits.page_size
        self.num_heads = cfg.num_attention_heads
        self.kv_lora_rank = cfg.kv_lora_rank
        self.rope_dim = cfg.qk_rope_head_dim
        self.nope_dim = cfg.qk_nope_head_dim
        self.sm_scale = (cfg.qk_nope_head_dim + cfg.qk_rope_head_dim) ** -0.5
        self.k = limits.tokens_per_req
        self.max_context_len = limits.max_context_len
        self.req_to_page = req_to_page
        self.use_trtllm = limits.mla_decode_backend == "trtllm-gen"
        max_bs = limits.max_running_requests
        num_layers = cfg.num_hidden_layers + cfg.num_nextn_predict_layers
        # [pages, page_size, kv_lora_rank + rope_dim]: compressed KV and rope key side by side
        self.kv_caches = [
            torch.zeros(limits.num_pages, limits.page_size, cfg.kv_lora_rank + cfg.qk_rope_head_dim, dtype=torch.bfloat16, device=device)
            for _ in range(num_layers)
        ]

        self.workspace = torch.zeros(self.WORKSPACE_BYTES, dtype=torch.uint8, device=device)  # expect: FC106
        self.eager_wrapper = BatchMLAPagedAttentionWrapper(self.workspace, backend="fa2")
        self.draft_extend_wrapper = BatchMLAPagedAttentionWrapper(self.workspace, backend="fa2")
        self._eager_plan = functools.partial(
            self.eager_wrapper.plan, sm_scale=self.sm_scale, q_data_type=torch.bfloat16, kv_data_type=torch.bfloat16
        )
        self.draft_trtllm_workspace: Optional[torch.Tensor] = None
        self.verify_trtllm_workspace: Optional[torch.Tensor] = None
        if self.use_trtllm:
            self.draft_trtllm_workspace = torch.empty(max_bs * cfg.num_attention_heads * 64 * 1024, dtype=torch.uint8, device=device)  # expect: FC105
            ws = torch.empty(max_bs * self.k * cfg.num_attention_heads * 64 * 1024, dtype=torch.uint8, device=device)  # ok: FC105
            ws.zero_()
            self.verify_trtllm_workspace = ws

        # Page table shared by the verify and draft graph wrappers of every bucket.
        self.qo_indptr = torch.arange(0, (max_bs + 1) * self.k, self.k, dtype=torch.int32, device=device)
        self.draft_qo_indptr = torch.arange(max_bs + 1, dtype=torch.int32, device=device)
        self.kv_indptr = torch.zeros(max_bs + 1, dtype=torch.int32, device=device)
        self.kv_indices = torch.zeros(limits.num_pages, dtype=torch.int32, device=device)
        self.kv_lens = torch.ones(max_bs, dtype=torch.int32, device=device)
        self.qo_indptr_host = torch.arange(0, (max_bs + 1) * self.k, self.k, dtype=torch.int32).pin_memory()
        self.draft_qo_indptr_host = torch.arange(max_bs + 1, dtype=torch.int32).pin_memory()
        self.kv_indptr_host = torch.zeros(max_bs + 1, dtype=torch.int32, pin_memory=True)
        self.kv_lens_host = torch.ones(max_bs, dtype=torch.int32, pin_memory=True)
        self.graph_wrappers: Dict[Tuple[str, int], BatchMLAPagedAttentionWrapper] = {}
        self.forward_metadata: Optional[MLAMetadata] = None

    def _dims(self) -> Tuple[int, int, int, int]:
        return self.num_heads, self.kv_lora_rank, self.rope_dim, self.page_size

    def _stage_lengths(self, bs: int, raw_bs: int, seq_lens_cpu: torch.Tensor, extra: int) -> None:
        self.kv_lens_host[:raw_bs].copy_(seq_lens_cpu[:raw_bs] + extra)
        self.kv_lens_host[raw_bs:bs].fill_(1)
        pages = (self.kv_lens_host[:bs] + self.page_size - 1) // self.page_size
        torch.cumsum(pages, dim=0, out=self.kv_indptr_host[1 : bs + 1])

    # ------------------------------------------------------------------ eager
    def init_forward_metadata(self, batch: SpecBatch) -> None:
        """Eager verify (no graph for this batch size): k query rows per request."""
        bs = batch.batch_size
        self._stage_lengths(bs, bs, batch.seq_lens_cpu, self.k)
        self.kv_indptr[: bs + 1].copy_(self.kv_indptr_host[: bs + 1], non_blocking=True)
        _fill_page_indices[(bs,)](self.req_to_page, batch.req_pool_indices, self.kv_indptr, self.kv_indices, self.req_to_page.stride(0), BLOCK=64)
        kv_lens = batch.seq_lens + self.k
        self._eager_plan(  # expect: FC102
            self.qo_indptr_host[: bs + 1], self.kv_indptr_host[: bs + 1], self.kv_indices, kv_lens, *self._dims(), True
        )
        self.forward_metadata = MLAMetadata(self.eager_wrapper, "verify", batch.out_cache_loc)

    def plan_draft_extend(
        self, bs: int, accept_length_cpu: torch.Tensor, seq_lens_cpu: torch.Tensor, req_pool_indices: torch.Tensor, out_cache_loc: torch.Tensor
    ) -> None:
        """The MTP layer re-reads the accepted tokens of every request (ragged: 1..k rows each)."""
        qo_indptr_host = torch.zeros(bs + 1, dtype=torch.int32)
        torch.cumsum(accept_length_cpu, dim=0, out=qo_indptr_host[1:])
        kv_lens_host = seq_lens_cpu[:bs] + accept_length_cpu
        kv_indptr_host = torch.zeros(bs + 1, dtype=torch.int32)
        torch.cumsum((kv_lens_host + self.page_size - 1) // self.page_size, dim=0, out=kv_indptr_host[1:])
        self.kv_indptr[: bs + 1].copy_(kv_indptr_host, non_blocking=True)
        _fill_page_indices[(bs,)](self.req_to_page, req_pool_indices, self.kv_indptr, self.kv_indices, self.req_to_page.stride(0), BLOCK=64)
        self.draft_extend_wrapper.plan(
            qo_indptr_host, kv_indptr_host, self.kv_indices, kv_lens_host, *self._dims(), True, self.sm_scale, torch.bfloat16, torch.bfloat16
        )
        self.forward_metadata = MLAMetadata(self.draft_extend_wrapper, "draft_extend", out_cache_loc)

    # ------------------------------------------------------------------ graphs
    def bind_graph_wrapper(self, mode: str, bs: int) -> BatchMLAPagedAttentionWrapper:
        qo = self.qo_indptr if mode == "verify" else self.draft_qo_indptr
        w = BatchMLAPagedAttentionWrapper(
            self.workspace,
            use_cuda_graph=True,
            qo_indptr=qo[: bs + 1],
            kv_indptr=self.kv_indptr[: bs + 1],
            kv_indices=self.kv_indices,
            kv_len_arr=self.kv_lens[:bs],
            backend="fa2",
        )
        self.kv_lens[:bs].fill_(1)  # ok: FC104
        self.graph_wrappers[(mode, bs)] = w
        return w

    def prepare_verify_inputs(
        self, bs: int, raw_bs: int, req_pool_indices: torch.Tensor, seq_lens_cpu: torch.Tensor, out_cache_loc: torch.Tensor
    ) -> None:
        self._stage_lengths(bs, raw_bs, seq_lens_cpu, self.k)
        self.kv_indptr[: bs + 1].copy_(self.kv_indptr_host[: bs + 1], non_blocking=True)  # ok: FC104
        _fill_page_indices[(raw_bs,)](self.req_to_page, req_pool_indices, self.kv_indptr, self.kv_indices, self.req_to_page.stride(0), BLOCK=64)
        w = self.graph_wrappers[("verify", bs)]
        w.plan(  # ok: FC102
            self.qo_indptr_host[: bs + 1], self.kv_indptr_host[: bs + 1], self.kv_indices, self.kv_lens_host[:bs],
            *self._dims(), True, self.sm_scale, torch.bfloat16, torch.bfloat16,
        )
        self.forward_metadata = MLAMetadata(
            w, "verify", out_cache_loc, req_pool_indices, self.kv_lens[:bs], self.max_context_len, self.use_trtllm
        )

    def prepare_draft_inputs(
        self, bs: int, raw_bs: int, req_pool_indices: torch.Tensor, seq_lens_cpu: torch.Tensor, positions: torch.Tensor, out_cache_loc: torch.Tensor
    ) -> MTPDraftInput:
        self._stage_lengths(bs, raw_bs, seq_lens_cpu, 1)
        self.kv_indptr[: bs + 1].copy_(self.kv_indptr_host[: bs + 1], non_blocking=True)
        _fill_page_indices[(raw_bs,)](self.req_to_page, req_pool_indices, self.kv_indptr, self.kv_indices, self.req_to_page.stride(0), BLOCK=64)
        w = self.graph_wrappers[("draft", bs)]
        w.plan(  # ok: FC102
            self.draft_qo_indptr_host[: bs + 1], self.kv_indptr_host[: bs + 1], self.kv_indices, self.kv_lens_host[:bs],
            *self._dims(), True, self.sm_scale, torch.bfloat16, torch.bfloat16,
        )
        self.forward_metadata = MLAMetadata(
            w, "draft", out_cache_loc, req_pool_indices, self.kv_lens[:bs], self.max_context_len, self.use_trtllm
        )
        return MTPDraftInput(kv_indptr=self.kv_indptr[: bs + 1], kv_lens=self.kv_lens[:bs], positions=positions)

    # ------------------------------------------------------------------ kernels
    def save_mla_kv(self, layer_id: int, ckv: torch.Tensor, k_pe: torch.Tensor) -> None:
        loc = self.forward_metadata.out_cache_loc.long()
        flat = self.kv_caches[layer_id].view(-1, self.kv_lora_rank + self.rope_dim)
        flat.index_copy_(0, loc, torch.cat([ckv, k_pe], dim=-1))

    def forward_mla(self, q_nope: torch.Tensor, q_pe: torch.Tensor, layer_id: int) -> torch.Tensor:
        md = self.forward_metadata
        cache = self.kv_caches[layer_id]
        ckv, kpe = cache[..., : self.kv_lora_rank], cache[..., self.kv_lora_rank :]
        if md.mode == "draft_extend":
            return self.draft_extend_wrapper.run(q_nope, q_pe, ckv, kpe)  # expect: FC108
        if md.use_trtllm:
            bs = md.seq_lens.shape[0]
            query = torch.cat([q_nope, q_pe], dim=-1).view(bs, -1, self.num_heads, self.kv_lora_rank + self.rope_dim)
            out = trtllm_batch_decode_with_kv_cache_mla(
                query=query,
                kv_cache=cache.unsqueeze(1),
                workspace_buffer=self.draft_trtllm_workspace if md.mode == "draft" else self.verify_trtllm_workspace,
                qk_nope_head_dim=self.nope_dim,
                kv_lora_rank=self.kv_lora_rank,
                qk_rope_head_dim=self.rope_dim,
                block_tables=self.req_to_page[md.req_pool_indices.long()],
                seq_lens=md.seq_lens,
                max_seq_len=md.max_seq_len,
                bmm1_scale=self.sm_scale,
            )
            return out.view(-1, self.num_heads, self.kv_lora_rank)
        return md.wrapper.run(q_nope, q_pe, ckv, kpe)  # ok: FC108
