"""FlashInfer attention for the soft-prompt server.

Decode: graph-mode wrappers per batch bucket over shared buffers, an eager
wrapper past the buckets. Prefill: a ragged wrapper for prompts that fit the
prefill graphs, a paged wrapper (trtllm-gen on Blackwell) for long prompts.
"""

from typing import Dict

import torch
from flashinfer import (
    BatchDecodeWithPagedKVCacheWrapper,
    BatchPrefillWithPagedKVCacheWrapper,
    BatchPrefillWithRaggedKVCacheWrapper,
)

from ..config import FLOAT_WS_FIELD, SoftPromptConfig
from ..workspace import decode_workspace, long_prefill_workspace, ragged_workspace
from .metadata import StepMetadata


def _make_paged_prefill(workspace: torch.Tensor, backend: str) -> BatchPrefillWithPagedKVCacheWrapper:
    return BatchPrefillWithPagedKVCacheWrapper(workspace, "NHD", backend=backend)


class SoftPromptAttention:
    def __init__(self, cfg: SoftPromptConfig) -> None:
        self.cfg = cfg
        dev = cfg.device
        max_bs = cfg.max_batch_size
        self.kv_indptr = torch.zeros(max_bs + 1, dtype=torch.int32, device=dev)
        self.kv_indices = torch.zeros(max_bs * cfg.max_pages_per_seq(), dtype=torch.int32, device=dev)
        self.kv_last_page_len = torch.ones(max_bs, dtype=torch.int32, device=dev)
        self.kv_indptr_host = torch.zeros(max_bs + 1, dtype=torch.int32, pin_memory=True)
        self.kv_last_page_len_host = torch.ones(max_bs, dtype=torch.int32, pin_memory=True)
        self.graph_bufs = {
            "kv_indptr": self.kv_indptr,
            "kv_indices": self.kv_indices,
            "kv_last_page_len": self.kv_last_page_len,
        }
        self.decode_ws = decode_workspace(cfg)
        self.decode_wrappers: Dict[int, BatchDecodeWithPagedKVCacheWrapper] = {}
        self.eager_decode_ws = torch.zeros(cfg.decode_workspace_bytes(), dtype=torch.uint8, device=dev)  # ok: FC106
        self.eager_decode = BatchDecodeWithPagedKVCacheWrapper(self.eager_decode_ws, "NHD", backend="fa2")
        self._plan_eager = self.eager_decode.plan
        self.ragged_prefill = BatchPrefillWithRaggedKVCacheWrapper(ragged_workspace(dev), "NHD", backend="fa2")
        if cfg.sm_version >= 100:
            self.long_prefill = _make_paged_prefill(long_prefill_workspace(cfg), "trtllm-gen")
        else:
            self.long_prefill = _make_paged_prefill(long_prefill_workspace(cfg), "fa2")

    # ---------------------------------------------------------------- set-up

    def init_graph_buffers(self) -> None:
        self.kv_indptr.zero_()
        self.kv_last_page_len.fill_(1)  # ok: FC104

    def loader_scratch(self) -> torch.Tensor:
        """Scratch bytes the adapter loader may use between steps."""
        return getattr(self.ragged_prefill, FLOAT_WS_FIELD)  # expect: FC103

    # --------------------------------------------------------------- capture

    def init_forward_metadata_capture_cuda_graph(self, bs: int) -> None:
        cfg = self.cfg
        n = bs + 1
        self.kv_indptr_host[:n].copy_(torch.arange(n, dtype=torch.int32))
        self.kv_last_page_len_host[:bs].fill_(1)
        self.kv_indptr[:n].copy_(self.kv_indptr_host[:n], non_blocking=True)
        w = BatchDecodeWithPagedKVCacheWrapper(
            self.decode_ws,
            "NHD",
            use_cuda_graph=True,
            paged_kv_indptr_buffer=self.kv_indptr[:n],
            paged_kv_indices_buffer=self.kv_indices,
            paged_kv_last_page_len_buffer=self.kv_last_page_len[:bs],
            backend="fa2",
        )
        w.plan(
            self.kv_indptr_host[:n],
            self.kv_indices[:bs],
            self.kv_last_page_len_host[:bs],
            cfg.num_qo_heads,
            cfg.num_kv_heads,
            cfg.head_dim,
            cfg.page_size,
            data_type=torch.bfloat16,
        )
        self.decode_wrappers[bs] = w

    # ---------------------------------------------------------------- replay

    def init_forward_metadata_replay_cuda_graph(self, bs: int, meta: StepMetadata) -> None:
        cfg = self.cfg
        n = bs + 1
        real = meta.bs
        total = int(meta.kv_indptr_cpu[-1])
        self.kv_indptr_host[: real + 1].copy_(meta.kv_indptr_cpu)
        self.kv_indptr_host[real + 1 : n].fill_(total)
        self.kv_last_page_len_host[:real].copy_(meta.kv_last_page_len_cpu)
        self.kv_last_page_len_host[real:bs].fill_(1)
        self.kv_indptr[:n].copy_(self.kv_indptr_host[:n], non_blocking=True)  # ok: FC104
        self.kv_indices[:total].copy_(meta.kv_indices[:total], non_blocking=True)
        self.kv_last_page_len[:bs].copy_(self.kv_last_page_len_host[:bs], non_blocking=True)
        self.decode_wrappers[bs].plan(  # ok: FC102
            self.kv_indptr_host[:n],
            self.kv_indices[:total],
            self.kv_last_page_len_host[:bs],
            cfg.num_qo_heads,
            cfg.num_kv_heads,
            cfg.head_dim,
            cfg.page_size,
            data_type=torch.bfloat16,
        )
        # keep the tail of the shared indptr monotone for the larger buckets' views
        self.graph_bufs["kv_indptr"][n:].fill_(total)  # expect: FC104

    # ----------------------------------------------------------------- eager

    def init_forward_metadata(self, meta: StepMetadata) -> None:
        cfg = self.cfg
        if meta.is_decode:
            self._plan_eager(  # expect: FC102
                meta.kv_indptr,
                meta.kv_indices,
                meta.kv_last_page_len_cpu,
                cfg.num_qo_heads,
                cfg.num_kv_heads,
                cfg.head_dim,
                cfg.page_size,
                data_type=torch.bfloat16,
            )
        elif meta.num_tokens >= cfg.long_prompt_threshold:
            self.long_prefill.plan(  # ok: FC102
                meta.qo_indptr_cpu,
                meta.kv_indptr_cpu,
                meta.kv_indices,
                meta.kv_last_page_len_cpu,
                cfg.num_qo_heads,
                cfg.num_kv_heads,
                cfg.head_dim,
                cfg.page_size,
                causal=True,
            )
        else:
            # fresh prompts attend only to themselves: kv_indptr is qo_indptr
            self.ragged_prefill.plan(  # expect: FC102
                meta.qo_indptr,
                meta.qo_indptr,
                cfg.num_qo_heads,
                cfg.num_kv_heads,
                cfg.head_dim,
                causal=True,
            )

    # --------------------------------------------------------------- forward

    def forward_decode(self, q: torch.Tensor, kv_cache: torch.Tensor, bs: int) -> torch.Tensor:
        return self.decode_wrappers[bs].run(q, kv_cache)  # ok: FC108

    def forward_decode_eager(self, q: torch.Tensor, kv_cache: torch.Tensor) -> torch.Tensor:
        return self.eager_decode.run(q, kv_cache)

    def forward_prefill(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return self.ragged_prefill.run(q, k, v)  # expect: FC108

    def forward_long_prefill(self, q: torch.Tensor, kv_cache: torch.Tensor) -> torch.Tensor:
        return self.long_prefill.run(q, kv_cache)
