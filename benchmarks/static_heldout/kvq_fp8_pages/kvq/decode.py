"""FP8 decode: XQA on Hopper, trtllm-gen on Blackwell, graph-mode FA2 wrappers elsewhere; the
quantization-sensitive heads are recomputed from their bf16 shadow pages."""

from __future__ import annotations

from typing import TYPE_CHECKING, Dict, Sequence

import torch
from flashinfer import BatchDecodeWithPagedKVCacheWrapper
from flashinfer.decode import trtllm_batch_decode_with_kv_cache, xqa_batch_decode_with_kv_cache

from .page_pool import DecodeBatch, KVQuantConfig, QuantPagePool

if TYPE_CHECKING:
    from .requant import RequantScheduler


class QuantDecodeBackend:
    @staticmethod
    def fallback_workspace_bytes() -> int:
        return 256 << 20

    def __init__(self, cfg: KVQuantConfig, pool: QuantPagePool, device: torch.device) -> None:
        self.cfg, self.pool, self.device = cfg, pool, device
        self.requant: "RequantScheduler" = None
        major = torch.cuda.get_device_capability(device)[0]
        self.kernel = "trtllm-gen" if major >= 10 else ("xqa" if major == 9 else "fa2")
        self._kv_layout = "HND" if self.kernel == "trtllm-gen" else "NHD"
        self.sm_scale = cfg.head_dim ** -0.5
        split_bytes = cfg.max_bs * cfg.num_heads * cfg.max_kv_splits * (cfg.head_dim + 2) * 4
        self.xqa_ws = torch.empty(split_bytes, dtype=torch.uint8, device=device)  # expect: FC105
        self.trtllm_ws = torch.empty(split_bytes, dtype=torch.uint8, device=device)  # ok: FC105
        self.trtllm_ws.zero_()
        self.fallback_ws = torch.empty(self.fallback_workspace_bytes(), dtype=torch.uint8, device=device)  # expect: FC106
        max_bs = cfg.max_bs
        self.seq_lens = torch.zeros(max_bs, dtype=torch.int32, device=device)
        self.block_tables = torch.zeros(max_bs, cfg.max_pages_per_seq, dtype=torch.int32, device=device)
        self.kv_indptr = torch.zeros(max_bs + 1, dtype=torch.int32, device=device)
        self.kv_indices = torch.zeros(max_bs * cfg.max_pages_per_seq, dtype=torch.int32, device=device)
        self.kv_last_page_len = torch.ones(max_bs, dtype=torch.int32, device=device)
        self.kv_indptr_host = torch.zeros(max_bs + 1, dtype=torch.int32, pin_memory=True)
        self.last_page_len_host = torch.ones(max_bs, dtype=torch.int32, pin_memory=True)
        self.scales = torch.stack([pool.k_scale, pool.v_scale])
        self.shadow_wrapper = BatchDecodeWithPagedKVCacheWrapper(self.fallback_ws, "NHD")
        self.fallback_wrappers: Dict[int, BatchDecodeWithPagedKVCacheWrapper] = {}
        self.bs, self.nnz, self.max_seq_len = 0, 0, 0

    def init_graph_wrappers(self, batch_sizes: Sequence[int]) -> None:
        for bs in batch_sizes:
            self.fallback_wrappers[bs] = BatchDecodeWithPagedKVCacheWrapper(
                self.fallback_ws, "NHD", use_cuda_graph=True, paged_kv_indptr_buffer=self.kv_indptr[: bs + 1],
                paged_kv_indices_buffer=self.kv_indices, paged_kv_last_page_len_buffer=self.kv_last_page_len[:bs])

    def _plan_shadow(self, bs: int, nnz: int) -> None:
        c, heads = self.cfg, len(self.cfg.sensitive_heads)
        self.shadow_wrapper.plan(self.kv_indptr_host[: bs + 1], self.kv_indices[:nnz], self.kv_last_page_len[:bs],  # expect: FC102
                                 heads, heads, c.head_dim, c.page_size, q_data_type=torch.bfloat16)

    def prepare_decode(self, bs: int, fb: DecodeBatch) -> None:
        c, raw = self.cfg, fb.batch_size
        self.requant.flush()
        self.bs = bs
        self.seq_lens_host = fb.seq_lens_cpu[:raw].clone()  # ok: FC107
        self.seq_lens[:raw].copy_(fb.seq_lens)
        self.max_seq_len = fb.seq_lens.amax().item()  # expect: FC101
        pages = (self.seq_lens_host + c.page_size - 1) // c.page_size
        self.kv_indptr_host[1 : raw + 1] = torch.cumsum(pages, 0)
        self.kv_indptr_host[raw + 1 : bs + 1] = self.kv_indptr_host[raw]
        self.last_page_len_host[:raw] = self.seq_lens_host - (pages - 1) * c.page_size
        self.nnz = nnz = int(self.kv_indptr_host[raw])
        self.kv_indices[:nnz].copy_(fb.kv_indices, non_blocking=True)
        self.kv_last_page_len[:bs].copy_(self.last_page_len_host[:bs], non_blocking=True)
        self._plan_shadow(bs, nnz)
        if self.kernel == "fa2":
            self.fallback_wrappers[bs].plan(self.kv_indptr_host[: bs + 1], self.kv_indices[:nnz],  # ok: FC102
                                            self.last_page_len_host[:bs], c.num_heads, c.num_kv_heads, c.head_dim,
                                            c.page_size, kv_data_type=torch.float8_e4m3fn)
        self.block_tables[:raw].copy_(fb.block_tables)  # ok: FC104
        self.block_tables[raw:bs].zero_()

    def forward_decode(self, q: torch.Tensor, layer_id: int) -> torch.Tensor:
        kv = self.pool.kv_pages[layer_id]
        if self._kv_layout == "HND":  # ok: FC103
            kv = kv.transpose(-3, -2)
        bmm1, bmm2 = self.scales[0, layer_id] * self.sm_scale, self.scales[1, layer_id]
        bs = self.bs
        if self.kernel == "xqa":
            out = xqa_batch_decode_with_kv_cache(q, kv, self.xqa_ws, self.block_tables[:bs], self.seq_lens[:bs],
                                                 self.max_seq_len, bmm1_scale=bmm1, bmm2_scale=bmm2)
        elif self.kernel == "trtllm-gen":
            out = trtllm_batch_decode_with_kv_cache(q, kv, self.trtllm_ws, self.block_tables[:bs], self.seq_lens[:bs],
                                                    self.max_seq_len, bmm1_scale=bmm1, bmm2_scale=bmm2)
        else:
            out = self.fallback_wrappers[bs].run(q, kv, k_scale=bmm1 / self.sm_scale, v_scale=bmm2)  # ok: FC108
        hs = list(self.cfg.sensitive_heads)
        out[:, hs] = self.shadow_wrapper.run(q[:, hs].to(torch.bfloat16), self.pool.shadow_kv[layer_id]).to(out.dtype)  # expect: FC108
        return out
