"""Attention: a trtllm-gen paged prefill for prompts with tool schemas, FA2 decode graphs per bucket,
and an eager decode over the tool-schema pages that every request shares, merged by LSE."""
from __future__ import annotations

import functools
import os
from dataclasses import dataclass
from typing import Dict

import torch
from flashinfer import BatchDecodeWithPagedKVCacheWrapper, BatchPrefillWithPagedKVCacheWrapper, merge_state

from toolstream import PREFILL_BACKEND, ServerConfig


def _schema_ws_bytes() -> int:
    return 192 * 1024 * 1024


def _decode_ws_bytes(cfg: ServerConfig) -> int:
    default = cfg.max_batch * cfg.num_qo_heads * (cfg.head_dim + 2) * 4 * 32
    return int(os.environ.get("TS_DECODE_WS_BYTES", default))


def _describe_backend(wr, tag: str) -> str:
    return f"{tag}:{wr._backend}"  # expect: FC103


@dataclass
class PrefillBatch:
    input_ids: torch.Tensor
    positions: torch.Tensor
    qo_indptr: torch.Tensor
    kv_indptr_staged: torch.Tensor
    kv_indices: torch.Tensor
    last_len_staged: torch.Tensor
    last_rows: torch.Tensor


class ToolAttention:
    def __init__(self, cfg: ServerConfig, device: torch.device) -> None:
        self.cfg, self.device = cfg, device
        self.workspaces: Dict[str, torch.Tensor] = {}
        self.workspaces["prefill"] = torch.empty(cfg.prefill_ws_bytes(), dtype=torch.uint8, device=device)  # expect: FC105
        self.workspaces["decode"] = torch.empty(_decode_ws_bytes(cfg), dtype=torch.uint8, device=device)  # ok: FC106
        self.schema_workspace = torch.zeros(_schema_ws_bytes(), dtype=torch.uint8, device=device)  # expect: FC106
        self.prefill = BatchPrefillWithPagedKVCacheWrapper(self.workspaces["prefill"], "HND", backend=PREFILL_BACKEND)
        self.schema_decode = BatchDecodeWithPagedKVCacheWrapper(self.schema_workspace, "HND")
        self.decode_graph: Dict[int, BatchDecodeWithPagedKVCacheWrapper] = {}
        self.describe = functools.partial(_describe_backend, self.schema_decode)
        self.bucket = 1
        b = cfg.max_graph_bs
        self.kv_indptr_buf = torch.zeros(b + 1, dtype=torch.int32, device=device)
        self.kv_indices_buf = torch.zeros(b * cfg.max_pages_per_seq, dtype=torch.int32, device=device)
        self.last_len_buf = torch.ones(b, dtype=torch.int32, device=device)

    def _heads(self):
        c = self.cfg
        return c.num_qo_heads, c.num_kv_heads, c.head_dim, c.page_size

    def init_graph(self, bs: int) -> None:
        w = BatchDecodeWithPagedKVCacheWrapper(
            self.workspaces["decode"], "HND", use_cuda_graph=True, backend="fa2",
            paged_kv_indptr_buffer=self.kv_indptr_buf[: bs + 1],
            paged_kv_indices_buffer=self.kv_indices_buf,
            paged_kv_last_page_len_buffer=self.last_len_buf[:bs],
        )
        w.plan(  # ok: FC102
            torch.arange(bs + 1, dtype=torch.int32), self.kv_indices_buf[:bs], torch.ones(bs, dtype=torch.int32),
            *self._heads(),
        )
        self.decode_graph[bs] = w

    def plan_bucket(self, bs: int, kv_indptr_cpu: torch.Tensor, last_len_cpu: torch.Tensor) -> None:
        self.bucket = bs
        self.decode_graph[bs].plan(  # ok: FC102
            kv_indptr_cpu[: bs + 1], self.kv_indices_buf, last_len_cpu[:bs], *self._heads(),
        )

    def plan_schema(self, rows: int, schema_pages: torch.Tensor, schema_last_len: int) -> None:
        """Every row attends to the same schema pages: one indptr row per request."""
        n = schema_pages.shape[0]
        self.schema_decode.plan(
            torch.arange(rows + 1, dtype=torch.int32) * n, schema_pages.repeat(rows),
            torch.full((rows,), schema_last_len, dtype=torch.int32), *self._heads(),
        )

    def plan_prefill(self, batch: PrefillBatch) -> None:
        self.prefill.plan(  # expect: FC102
            batch.qo_indptr, batch.kv_indptr_staged, batch.kv_indices, batch.last_len_staged,
            *self._heads(), causal=True,
        )

    def forward_decode(self, q: torch.Tensor, kv_cache: torch.Tensor) -> torch.Tensor:
        out, lse = self.decode_graph[self.bucket].run(q, kv_cache, return_lse=True)  # ok: FC108
        s_out, s_lse = self.schema_decode.run(q, kv_cache, return_lse=True)  # expect: FC108
        merged, _ = merge_state(out, lse, s_out, s_lse)
        return merged

    def forward_prefill(self, q: torch.Tensor, kv_cache: torch.Tensor) -> torch.Tensor:
        return self.prefill.run(q, kv_cache)
