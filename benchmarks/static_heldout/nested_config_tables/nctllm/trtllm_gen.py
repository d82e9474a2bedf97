"""trtllm-gen decode / context path (TensorRT-LLM's ``TrtllmAttention`` on FlashInfer's kernels).

Used when ``cfg["attention"]["decode_backend"] == "trtllm-gen"``; options arrive as ``**cfg["decode"]``.
"""

from __future__ import annotations

import math
from typing import Any, Mapping

import torch
from flashinfer.decode import trtllm_batch_decode_with_kv_cache
from flashinfer.prefill import trtllm_batch_context_with_kv_cache

from nctllm.metadata import FlashInferAttentionMetadata
from nctllm.options import AttnOptions
from nctllm.workspace import default_trtllm_workspace, shared_workspace

_TRT_DEFAULTS = {"workspace_mb": 256, "max_seq_len": 32768, "zero_workspace": True}


class TrtllmGenDecodeOp:
    def __init__(self, cfg: Mapping[str, Any], opts: AttnOptions, device: torch.device):
        trt = {**_TRT_DEFAULTS, **cfg.get("trtllm", {})}
        sched = cfg.get("scheduler", {})
        self.device = device
        self.page_size = opts.page_size
        self.sm_scale = opts.sm_scale
        self.max_seq_len = trt["max_seq_len"]
        self.ws_bytes = trt["workspace_mb"] << 20
        max_bs = sched.get("max_batch_size", 64)
        max_pages = cfg.get("kv_cache", {}).get("max_pages_per_req", 2048)
        self.workspace = torch.empty(self.ws_bytes, dtype=torch.uint8, device=device)  # expect: FC105
        self.draft_workspace = default_trtllm_workspace(device)
        spec_ws = torch.empty(self.ws_bytes, dtype=torch.uint8, device=device)  # ok: FC105
        spec_ws.zero_()
        self.spec_workspace = spec_ws
        self.block_tables = torch.zeros(max_bs, max_pages, dtype=torch.int32, device=device)

    def _fill_block_tables(self, pages: torch.Tensor, kv_indptr: torch.Tensor, bs: int, max_pages: int) -> torch.Tensor:
        bt = self.block_tables[:bs, :max_pages]
        cols = torch.arange(max_pages, device=self.device)
        idx = (kv_indptr[:bs, None] + cols[None, :]).clamp_(max=pages.numel() - 1)
        bt.copy_(pages[idx])
        return bt

    def forward(self, q, kv_cache, meta: FlashInferAttentionMetadata, *, use_tensor_cores: bool = True,
                check_inputs: bool = False, pos_encoding_mode: str = "NONE") -> torch.Tensor:
        if check_inputs and meta.max_seq_len > self.max_seq_len:
            raise ValueError(f"max_seq_len {meta.max_seq_len} > trtllm.max_seq_len {self.max_seq_len}")
        bs = meta.batch_size
        pages = meta.kv_indices[: meta.kv_indptr_gpu[-1]]  # expect: FC101
        max_pages = math.ceil(meta.seq_lens.max() / self.page_size)  # expect: FC101
        block_tables = self._fill_block_tables(pages, meta.kv_indptr_gpu, bs, max_pages)
        return trtllm_batch_decode_with_kv_cache(
            query=q,
            kv_cache=kv_cache,
            workspace_buffer=self.workspace,
            block_tables=block_tables,
            seq_lens=meta.seq_lens,
            max_seq_len=max_pages * self.page_size,
            bmm1_scale=self.sm_scale,
            bmm2_scale=1.0,
        )

    def forward_draft(self, q, kv_cache, meta: FlashInferAttentionMetadata) -> torch.Tensor:
        bs = meta.batch_size
        max_pages = (meta.max_seq_len + self.page_size - 1) // self.page_size
        block_tables = self._fill_block_tables(meta.kv_indices, meta.kv_indptr_gpu, bs, max_pages)
        return trtllm_batch_decode_with_kv_cache(
            query=q,
            kv_cache=kv_cache,
            workspace_buffer=self.draft_workspace,
            block_tables=block_tables,
            seq_lens=meta.seq_lens,
            max_seq_len=meta.max_seq_len,
            bmm1_scale=self.sm_scale,
            bmm2_scale=1.0,
        )

    def forward_context(self, q, kv_cache, meta: FlashInferAttentionMetadata, *, verify: bool = False) -> torch.Tensor:
        bs = meta.batch_size
        max_pages = (meta.max_seq_len + self.page_size - 1) // self.page_size
        block_tables = self._fill_block_tables(meta.kv_indices, meta.kv_indptr_gpu, bs, max_pages)
        ws = self.spec_workspace if verify else shared_workspace("trtllm_ctx", self.ws_bytes, str(self.device))
        return trtllm_batch_context_with_kv_cache(
            query=q,
            kv_cache=kv_cache,
            workspace_buffer=ws,
            block_tables=block_tables,
            seq_lens=meta.seq_lens,
            max_q_len=meta.max_seq_len,
            max_kv_len=meta.max_seq_len,
            bmm1_scale=self.sm_scale,
            bmm2_scale=1.0,
            batch_size=bs,
            cum_seq_lens_q=meta.qo_indptr,
            cum_seq_lens_kv=meta.kv_indptr_gpu,
        )
