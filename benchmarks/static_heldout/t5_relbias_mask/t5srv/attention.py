"""FlashInfer attention for T5: encoder (ragged, padding mask, bidirectional bias), decoder self-attention
(paged, unidirectional bias rows) and cross-attention over the encoder's pages (padding mask)."""
from __future__ import annotations

import dataclasses
import itertools
import logging
from typing import Dict, List, Optional, Tuple

import torch
from flashinfer import BatchPrefillWithPagedKVCacheWrapper, BatchPrefillWithRaggedKVCacheWrapper
from flashinfer.decode import trtllm_batch_decode_with_kv_cache

from t5srv.config import ServeLimits, T5Config, WsSize
from t5srv.kernels.t5_kernels import RelBiasTable, fill_pages_kernel

logger = logging.getLogger(__name__)

# logits += rel_bias[row(batch, kv) * H + head]: T5 adds its position bias before the softmax and does not scale q.k
_T5_BIAS_VARIANT = r"""
struct T5RelBias : AttentionVariantBase {
  static constexpr bool use_softmax = true;
  uint32_t qo_len, kv_len;
  template <typename Params>
  __device__ __host__ T5RelBias(const Params& params, uint32_t batch_idx, uint8_t* smem_ptr) {
    qo_len = params.get_qo_len(batch_idx);
    kv_len = params.get_kv_len(batch_idx);
  }
  REGISTER_LOGITS_TRANSFORM(params, logits, batch_idx, qo_idx, kv_idx, qo_head_idx, kv_head_idx, {
    return logits + params.rel_bias[(params.bias_row_indptr[batch_idx] + kv_idx) * params.num_qo_heads + qo_head_idx];
  })
};
"""


def t5_bias_jit_args(name: str, head_dim: int) -> list:
    return [
        f"t5_relbias_{name}_hd{head_dim}", torch.bfloat16, torch.bfloat16, torch.bfloat16, torch.int32, head_dim, head_dim,
        ["rel_bias", "bias_row_indptr"], ["float", "int32_t"], [], [], "T5RelBias", _T5_BIAS_VARIANT,
    ]


@dataclasses.dataclass
class EncoderBatch:
    input_ids: torch.Tensor  # [bs, padded_len]
    attention_mask: torch.Tensor  # [bs, padded_len] bool


class EncoderKVCache:
    """Cross-attention K/V of finished encoder passes, padded to the batch's encoder length, in cross pages."""

    def __init__(self, max_batch: int, num_pages: int, max_encoder_len: int, page_size: int, device: torch.device):
        self.page_size = page_size
        self.kv_indptr_buf = torch.zeros(max_batch + 1, dtype=torch.int32, device=device)
        self.kv_indices = torch.zeros(num_pages, dtype=torch.int32, device=device)
        self.block_tables = torch.zeros(max_batch, (max_encoder_len + page_size - 1) // page_size, dtype=torch.int32, device=device)
        self.enc_lens = torch.zeros(max_batch, dtype=torch.int32, device=device)
        self.kv_indptr_cpu = torch.zeros(max_batch + 1, dtype=torch.int32, pin_memory=True)
        self.last_page_len_cpu = torch.ones(max_batch, dtype=torch.int32, pin_memory=True)
        self.enc_lens_cpu = torch.zeros(max_batch, dtype=torch.int32, pin_memory=True)
        self.num_reqs = 0
        self.num_pages = 0
        self.unpadded = False

    @property
    def kv_indptr(self) -> torch.Tensor:
        return self.kv_indptr_buf[: self.num_reqs + 1]

    def set_rows(self, page_lists: List[List[int]], padded_lens: List[int], enc_lens: List[int]) -> None:
        """Host bookkeeping for the requests of the current decode batch, in batch order."""
        n = len(page_lists)
        flat = [p for pages in page_lists for p in pages]
        self.kv_indptr_cpu[1 : n + 1] = torch.tensor(list(itertools.accumulate(len(p) for p in page_lists)), dtype=torch.int32)
        self.last_page_len_cpu[:n] = (torch.tensor(padded_lens, dtype=torch.int32) - 1) % self.page_size + 1
        self.enc_lens_cpu[:n] = torch.tensor(enc_lens, dtype=torch.int32)
        table = torch.zeros(n, self.block_tables.shape[1], dtype=torch.int32)
        for i, pages in enumerate(page_lists):
            table[i, : len(pages)] = torch.tensor(pages, dtype=torch.int32)
        self.block_tables[:n].copy_(table, non_blocking=True)
        self.kv_indices[: len(flat)].copy_(torch.tensor(flat, dtype=torch.int32), non_blocking=True)
        self.kv_indptr_buf[: n + 1].copy_(self.kv_indptr_cpu[: n + 1], non_blocking=True)
        self.enc_lens[:n].copy_(self.enc_lens_cpu[:n], non_blocking=True)
        self.num_reqs, self.num_pages = n, len(flat)
        self.unpadded = all(e == p for e, p in zip(enc_lens, padded_lens))


@dataclasses.dataclass
class DecodeBatch:
    batch_size: int
    input_ids: torch.Tensor
    positions: torch.Tensor  # decoder position of the new token (the bias is relative to it)
    req_pool_indices: torch.Tensor
    dec_lens_cpu: torch.Tensor  # decoder self-attention length including the new token
    out_cache_loc: torch.Tensor
    encoder_cache: EncoderKVCache
    encoder_unpadded: bool = False


@dataclasses.dataclass
class T5DecodeMeta:
    self_wrapper: BatchPrefillWithPagedKVCacheWrapper
    cross_wrapper: BatchPrefillWithPagedKVCacheWrapper
    encoder_unpadded: bool
    out_cache_loc: torch.Tensor
    cross_block_tables: torch.Tensor
    enc_lens: torch.Tensor


class T5AttnBackend:
    def __init__(self, cfg: T5Config, limits: ServeLimits, req_to_page: torch.Tensor, device: torch.device):
        self.device = device
        self.num_heads, self.head_dim, self.page_size = cfg.num_heads, cfg.d_kv, limits.page_size
        self.heads = (cfg.num_heads, cfg.num_heads, cfg.d_kv)
        self.plan_kw = dict(sm_scale=1.0, q_data_type=torch.bfloat16)
        self.req_to_page = req_to_page
        self.max_bs = limits.max_batch
        self.max_encoder_len = limits.max_encoder_len
        self.cross_backend = limits.cross_backend
        max_bs = limits.max_batch
        nb, md = cfg.relative_attention_num_buckets, cfg.relative_attention_max_distance
        self.enc_bias = RelBiasTable(nb, md, cfg.num_heads, limits.max_encoder_len, True, device)
        self.dec_bias_table = RelBiasTable(nb, md, cfg.num_heads, limits.max_decoder_len, False, device)
        self.dec_jit_args = t5_bias_jit_args("dec", cfg.d_kv)
        kv_shape = (cfg.num_heads, cfg.d_kv)
        self.self_kv = [
            (torch.zeros(limits.num_self_pages, limits.page_size, *kv_shape, dtype=torch.bfloat16, device=device),
             torch.zeros(limits.num_self_pages, limits.page_size, *kv_shape, dtype=torch.bfloat16, device=device))
            for _ in range(cfg.num_decoder_layers)
        ]
        self.cross_kv = [
            (torch.zeros(limits.num_cross_pages, limits.page_size, *kv_shape, dtype=torch.bfloat16, device=device),
             torch.zeros(limits.num_cross_pages, limits.page_size, *kv_shape, dtype=torch.bfloat16, device=device))
            for _ in range(cfg.num_decoder_layers)
        ]

        self.enc_workspace = torch.zeros(WsSize.ENCODER, dtype=torch.uint8, device=device)  # expect: FC106
        self.enc_wrapper = BatchPrefillWithRaggedKVCacheWrapper(self.enc_workspace, "NHD", jit_args=t5_bias_jit_args("enc", cfg.d_kv))
        self.dec_workspace = torch.zeros(max_bs * cfg.num_heads * limits.max_decoder_len * 64, dtype=torch.uint8, device=device)  # ok: FC106
        self.dec_self_wrapper = BatchPrefillWithPagedKVCacheWrapper(self.dec_workspace, "NHD", jit_args=self.dec_jit_args)
        self.cross_workspace = torch.empty(max_bs * limits.max_encoder_len * cfg.num_heads * 16, dtype=torch.uint8, device=device)  # ok: FC105
        self.cross_wrapper = BatchPrefillWithPagedKVCacheWrapper(self.cross_workspace, "NHD", backend="fa2")
        self.cross_nomask_wrapper = BatchPrefillWithPagedKVCacheWrapper(self.cross_workspace, "NHD", backend="fa2")
        self.cross_trtllm_workspace: Optional[torch.Tensor] = None
        if self.cross_backend == "trtllm-gen":
            self.cross_trtllm_workspace = torch.empty(max_bs * cfg.num_heads * 256 * 1024, dtype=torch.uint8, device=device)  # expect: FC105

        # decoder self-attention: one query row per request, bias rows per (request, kv token)
        self.dec_qo_indptr = torch.arange(max_bs + 1, dtype=torch.int32, device=device)
        self.dec_kv_indptr = torch.zeros(max_bs + 1, dtype=torch.int32, device=device)
        self.dec_kv_indices = torch.zeros(limits.num_self_pages, dtype=torch.int32, device=device)
        self.dec_last_page_len = torch.ones(max_bs, dtype=torch.int32, device=device)
        self.dec_bias_row_indptr = torch.zeros(max_bs + 1, dtype=torch.int32, device=device)
        self.dec_bias = torch.zeros(max_bs * 256, cfg.num_heads, dtype=torch.float32, device=device)
        # cross-attention over encoder pages, encoder padding masked out
        self.cross_kv_indptr = torch.zeros(max_bs + 1, dtype=torch.int32, device=device)
        self.cross_kv_indices = torch.zeros(limits.num_cross_pages, dtype=torch.int32, device=device)
        self.cross_last_page_len = torch.ones(max_bs, dtype=torch.int32, device=device)
        self.cross_mask_buf = torch.zeros((max_bs * limits.max_encoder_len + 7) // 8, dtype=torch.uint8, device=device)
        self.cross_mask_indptr = torch.zeros(max_bs + 1, dtype=torch.int32, device=device)
        # host mirrors for plan()
        self.dec_qo_indptr_cpu = torch.arange(max_bs + 1, dtype=torch.int32).pin_memory()
        self.dec_kv_indptr_cpu = torch.zeros(max_bs + 1, dtype=torch.int32, pin_memory=True)
        self.dec_last_page_len_cpu = torch.ones(max_bs, dtype=torch.int32, pin_memory=True)
        self.dec_bias_row_indptr_cpu = torch.zeros(max_bs + 1, dtype=torch.int32, pin_memory=True)
        self.cross_kv_indptr_cpu = torch.zeros(max_bs + 1, dtype=torch.int32, pin_memory=True)
        self.cross_last_page_len_cpu = torch.ones(max_bs, dtype=torch.int32, pin_memory=True)
        self.mask_indptr_cpu = torch.zeros(max_bs + 1, dtype=torch.int32, pin_memory=True)

        self.graph_self_wrappers: Dict[int, BatchPrefillWithPagedKVCacheWrapper] = {}
        self.graph_cross_wrappers: Dict[int, BatchPrefillWithPagedKVCacheWrapper] = {}
        self.cross_out: Optional[torch.Tensor] = None
        self.forward_metadata: Optional[T5DecodeMeta] = None

    def load_rel_bias(self, encoder_weight: torch.Tensor, decoder_weight: torch.Tensor) -> None:
        self.enc_bias.load(encoder_weight)
        self.dec_bias_table.load(decoder_weight)

    def init_cuda_graph_state(self) -> None:
        # until a row's first plan it may see every encoder position
        self.cross_mask_buf.fill_(0xFF)  # ok: FC104

    # ------------------------------------------------------------------ encoder
    def plan_encoder(self, batch: EncoderBatch) -> None:
        bs, padded_len = batch.input_ids.shape
        enc_lens = batch.attention_mask.sum(dim=1, dtype=torch.int32)
        enc_lens_list = enc_lens.tolist()  # expect: FC101
        qo_indptr = torch.arange(0, (bs + 1) * padded_len, padded_len, dtype=torch.int32)
        visible = torch.arange(padded_len)[None, :] < torch.tensor(enc_lens_list)[:, None]
        mask = visible[:, None, :].expand(bs, padded_len, padded_len).reshape(-1)
        self.enc_wrapper.plan(qo_indptr, qo_indptr, *self.heads, custom_mask=mask, **self.plan_kw)  # ok: FC102

    def forward_encoder(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return self.enc_wrapper.run(q, k, v, self.enc_bias.table, self.enc_bias.bucket_lut)

    # ------------------------------------------------------------------ decoder: host staging
    def _stage_self(self, bs: int, raw_bs: int, dec_lens_cpu: torch.Tensor) -> None:
        lens = dec_lens_cpu[:raw_bs]
        torch.cumsum((lens + self.page_size - 1) // self.page_size, dim=0, out=self.dec_kv_indptr_cpu[1 : raw_bs + 1])
        self.dec_kv_indptr_cpu[raw_bs + 1 : bs + 1] = self.dec_kv_indptr_cpu[raw_bs]
        self.dec_last_page_len_cpu[:raw_bs] = (lens - 1) % self.page_size + 1
        self.dec_last_page_len_cpu[raw_bs:bs] = 1
        torch.cumsum(lens, dim=0, out=self.dec_bias_row_indptr_cpu[1 : raw_bs + 1])
        self.dec_bias_row_indptr_cpu[raw_bs + 1 : bs + 1] = self.dec_bias_row_indptr_cpu[raw_bs]

    def _stage_cross(self, bs: int, raw_bs: int, cache: EncoderKVCache) -> torch.Tensor:
        self.cross_kv_indptr_cpu[: raw_bs + 1].copy_(cache.kv_indptr_cpu[: raw_bs + 1])
        self.cross_kv_indptr_cpu[raw_bs + 1 : bs + 1] = self.cross_kv_indptr_cpu[raw_bs]
        self.cross_last_page_len_cpu[:raw_bs].copy_(cache.last_page_len_cpu[:raw_bs])
        self.cross_last_page_len_cpu[raw_bs:bs] = 1
        pages = self.cross_kv_indptr_cpu[1 : bs + 1] - self.cross_kv_indptr_cpu[:bs]
        kv_lens = torch.clamp(pages - 1, min=0) * self.page_size + self.cross_last_page_len_cpu[:bs] * (pages > 0)
        torch.cumsum(kv_lens, dim=0, out=self.mask_indptr_cpu[1 : bs + 1])
        rows = [torch.arange(n) < e for n, e in zip(kv_lens.tolist(), cache.enc_lens_cpu[:bs].tolist())]  # ok: FC101
        return torch.cat(rows)

    def _ensure_cross_out(self) -> torch.Tensor:
        self.cross_out = torch.empty(self.max_bs, self.num_heads, self.head_dim, dtype=torch.bfloat16, device=self.device) if self.cross_out is None else self.cross_out  # ok: FC107
        return self.cross_out

    # ------------------------------------------------------------------ decoder: eager
    def init_forward_metadata(self, dec: DecodeBatch) -> None:
        bs = dec.batch_size
        cache = dec.encoder_cache
        self._stage_self(bs, bs, dec.dec_lens_cpu)
        self.dec_kv_indptr[: bs + 1].copy_(self.dec_kv_indptr_cpu[: bs + 1], non_blocking=True)
        self.dec_bias_row_indptr[: bs + 1].copy_(self.dec_bias_row_indptr_cpu[: bs + 1], non_blocking=True)
        fill_pages_kernel[(bs,)](self.req_to_page, dec.req_pool_indices, self.dec_kv_indptr, self.dec_kv_indices, self.req_to_page.stride(0), BLOCK=64)
        self.dec_bias_table.fill_decoder_rows(self.dec_bias, self.dec_bias_row_indptr, dec.positions, bs)
        self.dec_self_wrapper.plan(
            self.dec_qo_indptr_cpu[: bs + 1], self.dec_kv_indptr_cpu[: bs + 1], self.dec_kv_indices, self.dec_last_page_len_cpu[:bs],
            *self.heads, self.page_size, **self.plan_kw,
        )
        cross = self.cross_wrapper
        mask: Optional[torch.Tensor] = None
        if dec.encoder_unpadded:
            cross = self.cross_nomask_wrapper
        else:
            mask = self._stage_cross(bs, bs, cache)
        cross.plan(  # expect: FC102
            self.dec_qo_indptr_cpu[: bs + 1], cache.kv_indptr, cache.kv_indices, cache.last_page_len_cpu[:bs],
            *self.heads, self.page_size, custom_mask=mask, **self.plan_kw,
        )
        self._ensure_cross_out()
        self.forward_metadata = T5DecodeMeta(
            self.dec_self_wrapper, cross, dec.encoder_unpadded, dec.out_cache_loc, cache.block_tables[:bs], cache.enc_lens[:bs]
        )

    # ------------------------------------------------------------------ decoder: graphs
    def init_forward_metadata_capture_cuda_graph(self, bs: int, dec: DecodeBatch) -> None:
        cache = dec.encoder_cache
        self_w = BatchPrefillWithPagedKVCacheWrapper(
            self.dec_workspace, "NHD", use_cuda_graph=True,
            qo_indptr_buf=self.dec_qo_indptr[: bs + 1], paged_kv_indptr_buf=self.dec_kv_indptr[: bs + 1],
            paged_kv_indices_buf=self.dec_kv_indices, paged_kv_last_page_len_buf=self.dec_last_page_len[:bs],
            jit_args=self.dec_jit_args,
        )
        cross_w = BatchPrefillWithPagedKVCacheWrapper(
            self.cross_workspace, "NHD", use_cuda_graph=True,
            qo_indptr_buf=self.dec_qo_indptr[: bs + 1], paged_kv_indptr_buf=self.cross_kv_indptr[: bs + 1],
            paged_kv_indices_buf=self.cross_kv_indices, paged_kv_last_page_len_buf=self.cross_last_page_len[:bs],
            custom_mask_buf=self.cross_mask_buf, mask_indptr_buf=self.cross_mask_indptr[: bs + 1], backend="fa2",
        )
        self.graph_self_wrappers[bs] = self_w
        self.graph_cross_wrappers[bs] = cross_w
        self._stage_self(bs, bs, dec.dec_lens_cpu)
        self_w.plan(
            self.dec_qo_indptr_cpu[: bs + 1], self.dec_kv_indptr_cpu[: bs + 1], self.dec_kv_indices, self.dec_last_page_len_cpu[:bs],
            *self.heads, self.page_size, **self.plan_kw,
        )
        mask = self._stage_cross(bs, bs, cache)
        cross_w.plan(
            self.dec_qo_indptr_cpu[: bs + 1], self.cross_kv_indptr_cpu[: bs + 1], self.cross_kv_indices, self.cross_last_page_len_cpu[:bs],
            *self.heads, self.page_size, custom_mask=mask, **self.plan_kw,
        )
        self._ensure_cross_out()
        self.forward_metadata = T5DecodeMeta(self_w, cross_w, cache.unpadded, dec.out_cache_loc, cache.block_tables[:bs], cache.enc_lens[:bs])

    def init_forward_metadata_replay_cuda_graph(self, bs: int, raw_bs: int, dec: DecodeBatch) -> None:
        cache = dec.encoder_cache
        self._stage_self(bs, raw_bs, dec.dec_lens_cpu)
        need_rows = int(self.dec_bias_row_indptr_cpu[bs])  # ok: FC101
        if need_rows > self.dec_bias.shape[0]:
            self.dec_bias.resize_(need_rows, self.num_heads)  # expect: FC107
        self.dec_kv_indptr[: bs + 1].copy_(self.dec_kv_indptr_cpu[: bs + 1], non_blocking=True)  # ok: FC104
        self.dec_bias_row_indptr[: bs + 1].copy_(self.dec_bias_row_indptr_cpu[: bs + 1], non_blocking=True)
        fill_pages_kernel[(raw_bs,)](self.req_to_page, dec.req_pool_indices, self.dec_kv_indptr, self.dec_kv_indices, self.req_to_page.stride(0), BLOCK=64)
        self.dec_bias_table.fill_decoder_rows(self.dec_bias, self.dec_bias_row_indptr, dec.positions, raw_bs)
        self.graph_self_wrappers[bs].plan(  # ok: FC102
            self.dec_qo_indptr_cpu[: bs + 1], self.dec_kv_indptr_cpu[: bs + 1], self.dec_kv_indices, self.dec_last_page_len_cpu[:bs],
            *self.heads, self.page_size, **self.plan_kw,
        )
        mask = self._stage_cross(bs, raw_bs, cache)
        self.cross_kv_indices[: cache.num_pages].copy_(cache.kv_indices[: cache.num_pages], non_blocking=True)
        self.graph_cross_wrappers[bs].plan(
            self.dec_qo_indptr_cpu[: bs + 1], self.cross_kv_indptr_cpu[: bs + 1], self.cross_kv_indices, self.cross_last_page_len_cpu[:bs],
            *self.heads, self.page_size, custom_mask=mask, **self.plan_kw,
        )
        # keep the mask offsets of the padded rows in step with the plan
        self.cross_mask_indptr[: bs + 1].copy_(self.mask_indptr_cpu[: bs + 1], non_blocking=True)  # expect: FC104

    def mask_capacity_ok(self, bs: int, need_bytes: int) -> bool:
        w = self.graph_cross_wrappers.get(bs)
        return w is not None and w._custom_mask_buf.numel() >= need_bytes  # expect: FC103

    # ------------------------------------------------------------------ decoder: kernels
    def save_self_kv(self, layer_id: int, k: torch.Tensor, v: torch.Tensor, out_cache_loc: torch.Tensor) -> None:
        k_cache, v_cache = self.self_kv[layer_id]
        loc = out_cache_loc.long()
        k_cache.view(-1, self.num_heads, self.head_dim).index_copy_(0, loc, k)
        v_cache.view(-1, self.num_heads, self.head_dim).index_copy_(0, loc, v)

    def save_cross_kv(self, layer_id: int, k: torch.Tensor, v: torch.Tensor, cross_loc: torch.Tensor) -> None:
        k_cache, v_cache = self.cross_kv[layer_id]
        k_cache.view(-1, self.num_heads, self.head_dim).index_copy_(0, cross_loc.long(), k)
        v_cache.view(-1, self.num_heads, self.head_dim).index_copy_(0, cross_loc.long(), v)

    def forward_self(self, q: torch.Tensor, layer_id: int) -> torch.Tensor:
        md = self.forward_metadata
        return md.self_wrapper.run(q, self.self_kv[layer_id], self.dec_bias, self.dec_bias_row_indptr)

    def forward_cross(self, q: torch.Tensor, layer_id: int) -> torch.Tensor:
        md = self.forward_metadata
        kv = self.cross_kv[layer_id]
        out = self.cross_out[: q.shape[0]]
        if self.cross_backend == "trtllm-gen":
            return trtllm_batch_decode_with_kv_cache(
                q, kv, self.cross_trtllm_workspace, md.cross_block_tables, md.enc_lens, self.max_encoder_len, bmm1_scale=1.0, bmm2_scale=1.0, out=out
            )
        if md.encoder_unpadded:
            return self.cross_nomask_wrapper.run(q, kv, out=out)  # expect: FC108
        return md.cross_wrapper.run(q, kv, out=out)  # ok: FC108
