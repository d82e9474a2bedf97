"""LM attention for every adapter: one set of decode graphs shared by all of them."""

from __future__ import annotations

import itertools
from typing import Dict

import torch
from flashinfer import (
    BatchDecodeWithPagedKVCacheWrapper,
    BatchPrefillWithPagedKVCacheWrapper,
    BatchPrefillWithRaggedKVCacheWrapper,
)

from mavl import DecodeRoute, PromptRoute, RouterConfig, fill_tail
from mv_attn.workspaces import decode_workspace_bytes, make_prompt_workspace


class LMAttentionBackend:
    def __init__(self, cfg: RouterConfig, vision_workspace: torch.Tensor, device: torch.device):
        self.cfg = cfg
        self.device = device
        max_bs = cfg.max_batch
        self.kv_indptr = torch.zeros(max_bs + 1, dtype=torch.int32, device=device)
        self.kv_indices = torch.zeros(cfg.max_pages, dtype=torch.int32, device=device)
        self.kv_last_page_len = torch.ones(max_bs, dtype=torch.int32, device=device)
        self.kv_indptr_host = torch.zeros(max_bs + 1, dtype=torch.int32, pin_memory=True)
        self.last_page_len_host = torch.ones(max_bs, dtype=torch.int32, pin_memory=True)

        ws_bytes = decode_workspace_bytes(max_bs, cfg.num_qo_heads, cfg.head_dim, cfg.max_pages)
        self.graph_workspace = torch.zeros(ws_bytes, dtype=torch.uint8, device=device)  # ok: FC106
        self.eager_workspace = torch.empty(ws_bytes, dtype=torch.uint8, device=device)  # ok: FC105
        self.prompt_workspace = make_prompt_workspace(cfg.prompt_workspace_bytes, device)

        self.graph_wrappers: Dict[int, BatchDecodeWithPagedKVCacheWrapper] = {
            bs: BatchDecodeWithPagedKVCacheWrapper(
                self.graph_workspace, "NHD", use_cuda_graph=True,
                paged_kv_indptr_buffer=self.kv_indptr[: bs + 1],
                paged_kv_indices_buffer=self.kv_indices,
                paged_kv_last_page_len_buffer=self.kv_last_page_len[:bs],
            )
            for bs in cfg.buckets
        }
        self.eager_decode = BatchDecodeWithPagedKVCacheWrapper(self.eager_workspace, "NHD", backend="fa2")
        self.prompt_prefill = BatchPrefillWithPagedKVCacheWrapper(
            self.prompt_workspace, "NHD", backend="trtllm-gen"
        )
        self.cross_wrapper = BatchPrefillWithRaggedKVCacheWrapper(vision_workspace, "NHD")
        self.plan_kw = dict(
            num_qo_heads=cfg.num_qo_heads, num_kv_heads=cfg.num_kv_heads, head_dim=cfg.head_dim,
            page_size=cfg.page_size, q_data_type=torch.bfloat16,
        )
        # image K/V the cross-attention layers read; filled when a prompt is encoded
        img_shape = (cfg.max_image_tokens, cfg.num_kv_heads, cfg.head_dim)
        self.img_k = torch.zeros(img_shape, dtype=torch.bfloat16, device=device)
        self.img_v = torch.zeros(img_shape, dtype=torch.bfloat16, device=device)
        self.bucket = None

    def init_graph_buffers(self) -> None:
        self.kv_indices.zero_()  # ok: FC104

    def plan_capture(self, bs: int) -> None:
        self.kv_indptr_host[: bs + 1] = torch.arange(bs + 1, dtype=torch.int32)
        self.graph_wrappers[bs].plan(
            self.kv_indptr_host[: bs + 1], self.kv_indices[:bs], self.last_page_len_host[:bs], **self.plan_kw
        )
        self.bucket = bs

    def prepare_replay(self, bs: int, route: DecodeRoute) -> None:
        n = route.batch_size
        nnz = int(route.kv_indptr_cpu[n])
        self.kv_indptr_host[: n + 1].copy_(route.kv_indptr_cpu)
        self.kv_indptr_host[n + 1 : bs + 1] = nnz
        self.last_page_len_host[:n].copy_(route.last_page_len_cpu)
        self.kv_indices[:nnz].copy_(route.kv_indices, non_blocking=True)  # ok: FC104
        self.graph_wrappers[bs].plan(  # ok: FC102
            self.kv_indptr_host[: bs + 1], self.kv_indices[:nnz], self.last_page_len_host[:bs], **self.plan_kw
        )
        fill_tail(self.kv_last_page_len[:bs], n, 1)  # expect: FC104
        self.bucket = bs

    def plan_eager(self, route: DecodeRoute) -> None:
        self.eager_decode.plan(route.kv_indptr_cpu, route.kv_indices, route.last_page_len_cpu, **self.plan_kw)
        self.bucket = None

    def plan_prompt(self, route: PromptRoute) -> None:
        cfg = self.cfg
        plan = self.prompt_prefill.plan
        plan(  # expect: FC102
            route.qo_indptr, route.kv_indptr_cpu, route.kv_indices, route.last_page_len_cpu,
            cfg.num_qo_heads, cfg.num_kv_heads, cfg.head_dim, cfg.page_size, causal=True,
        )

    def plan_cross(self, qo_indptr_cpu: torch.Tensor, img_indptr_cpu: torch.Tensor) -> None:
        cfg = self.cfg
        self.cross_wrapper.plan(
            qo_indptr_cpu, img_indptr_cpu, cfg.num_qo_heads, cfg.num_kv_heads, cfg.head_dim, causal=False
        )

    def forward_decode(self, q: torch.Tensor, kv_cache: torch.Tensor) -> torch.Tensor:
        if self.bucket is not None:
            w = self.graph_wrappers[self.bucket]
        else:
            w = self.eager_decode
        return w.run(q, kv_cache)  # ok: FC108

    def forward_cross(self, q: torch.Tensor) -> torch.Tensor:
        return self.cross_wrapper.run(q, self.img_k, self.img_v)  # expect: FC108

    def forward_prompt(self, q: torch.Tensor, kv_cache: torch.Tensor) -> torch.Tensor:
        return self.prompt_prefill.run(q, kv_cache)

    def workspace_report(self) -> Dict[str, int]:
        total = 0
        for w in itertools.chain(self.graph_wrappers.values(), [self.prompt_prefill]):
            total += w._float_workspace_buffer.numel()  # expect: FC103
        return {"float_workspace_bytes": total, "graphs": len(self.graph_wrappers)}
