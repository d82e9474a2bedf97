"""Cross-decoder attention: every cross layer attends to the one global KV cache.

One plan per step serves all cross layers. During prefill only the last token of each prompt goes through the
cross-decoder (YOCO's early exit), which makes the prefill step a decode over the global cache as well.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Optional, Tuple

import numpy as np
import torch
from flashinfer import BatchDecodeWithPagedKVCacheWrapper

from yoco.attention.base import AttentionBackend
from yoco.config import ServerArgs, YocoConfig
from yoco.forward_batch import ForwardBatch
from yoco.mem.pools import GlobalKVPool


@dataclass
class CrossMetadata:
    decode_wrapper: Optional[BatchDecodeWithPagedKVCacheWrapper] = None
    rows: Optional[torch.Tensor] = None  # token rows that enter the cross-decoder


class CrossPlanCache:
    """Remembers what each bucket was last planned for, so an unchanged batch skips ``plan()``."""

    def __init__(self) -> None:
        self._plan_info: Dict[int, Tuple[bytes, object]] = {}  # ok: FC103

    def hit(self, bs: int, key: bytes) -> bool:
        entry = self._plan_info.get(bs)
        return entry is not None and entry[0] == key

    def remember(self, bs: int, key: bytes, info: object) -> None:
        self._plan_info[bs] = (key, info)


class CrossAttnBackend(AttentionBackend):
    def __init__(self, cfg: YocoConfig, server_args: ServerArgs, pool: GlobalKVPool, device: torch.device):
        self.cfg = cfg
        self.pool = pool
        self.device = device
        self.page_size = server_args.page_size
        self.max_context_len = server_args.max_context_len
        self.decode_backend = "trtllm-gen" if server_args.is_blackwell else "fa2"
        ws_bytes = server_args.cross_workspace_mb << 20
        self.cross_workspace = torch.empty(ws_bytes, dtype=torch.uint8, device=device)  # expect: FC105
        self.cross_eager_workspace = torch.empty(ws_bytes, dtype=torch.uint8, device=device)  # ok: FC105
        self.cross_eager_workspace.zero_()

        self.max_bs = max(server_args.graph_batch_sizes)
        max_pages = self.max_bs * (-(-server_args.max_context_len // self.page_size))
        self.cross_kv_indptr = torch.zeros(self.max_bs + 1, dtype=torch.int32, device=device)
        self.cross_kv_indices = torch.zeros(max_pages, dtype=torch.int32, device=device)
        self.cross_last_page_len = torch.ones(self.max_bs, dtype=torch.int32, device=device)
        self.cross_kv_indptr_cpu = torch.zeros(self.max_bs + 1, dtype=torch.int32, pin_memory=True)
        self.cross_last_page_len_cpu = torch.ones(self.max_bs, dtype=torch.int32, pin_memory=True)
        # eager steps (prefill, oversized decode batches) build their indptr on the device for the page gather
        self.eager_kv_indptr = torch.zeros(server_args.max_running_requests + 1, dtype=torch.int32, device=device)

        self.decode_wrappers: Dict[int, BatchDecodeWithPagedKVCacheWrapper] = {}
        self.eager_decode = BatchDecodeWithPagedKVCacheWrapper(
            self.cross_eager_workspace, "NHD", backend=self.decode_backend
        )
        self.plan_cache = CrossPlanCache()
        self.row_ids: Optional[torch.Tensor] = None
        self.forward_metadata = CrossMetadata()

    def _plan_kwargs(self) -> dict:
        c = self.cfg
        return dict(
            num_qo_heads=c.num_heads,
            num_kv_heads=c.num_kv_heads,
            head_dim=c.head_dim,
            page_size=self.page_size,
            q_data_type=torch.bfloat16,
        )

    def _rows(self, bs: int) -> torch.Tensor:
        rows = self.row_ids
        if rows is None:
            rows = self.row_ids = torch.arange(self.max_bs, dtype=torch.int64, device=self.device)  # ok: FC107
        return rows[:bs]

    # ------------------------------------------------------------------ eager
    def init_forward_metadata(self, fb: ForwardBatch) -> None:
        bs = fb.batch_size
        if int(fb.seq_lens_cpu.max()) >= self.max_context_len:  # ok: FC101
            raise ValueError(f"context longer than max_context_len={self.max_context_len}")
        kv_lens = fb.seq_lens.tolist()  # expect: FC101
        indptr_np, indices_np, last_np = self.pool.page_lists(fb.req_slots_np, np.asarray(kv_lens, dtype=np.int64))
        kv_indptr = self.eager_kv_indptr[: bs + 1]
        kv_indptr.copy_(torch.from_numpy(indptr_np), non_blocking=True)
        self.eager_decode.plan(  # expect: FC102
            kv_indptr,
            torch.from_numpy(indices_np).to(self.device, non_blocking=True),
            torch.from_numpy(last_np),
            **self._plan_kwargs(),
        )
        rows = None
        if fb.forward_mode.is_extend():
            # early exit: only the last token of every prompt goes on into the cross-decoder
            rows = torch.cumsum(fb.extend_seq_lens, dim=0) - 1
        self.forward_metadata = CrossMetadata(decode_wrapper=self.eager_decode, rows=rows)

    # ------------------------------------------------------------------ graphs
    def init_forward_metadata_capture_cuda_graph(self, bs, req_slots, req_slots_np, seq_lens, seq_lens_cpu) -> None:
        w = BatchDecodeWithPagedKVCacheWrapper(
            self.cross_workspace,
            "NHD",
            use_cuda_graph=True,
            backend=self.decode_backend,
            paged_kv_indptr_buffer=self.cross_kv_indptr[: bs + 1],
            paged_kv_indices_buffer=self.cross_kv_indices,
            paged_kv_last_page_len_buffer=self.cross_last_page_len[:bs],
        )
        self.cross_last_page_len[:bs].fill_(1)  # ok: FC104
        self.decode_wrappers[bs] = w
        w.plan(
            torch.arange(bs + 1, dtype=torch.int32),
            self.cross_kv_indices[:bs],
            torch.ones(bs, dtype=torch.int32),
            **self._plan_kwargs(),
        )
        self.forward_metadata = CrossMetadata(decode_wrapper=w, rows=self._rows(bs))

    def init_forward_metadata_replay_cuda_graph(self, bs, req_slots, req_slots_np, seq_lens, seq_lens_cpu, raw_bs) -> None:
        seq_lens_np = seq_lens_cpu.numpy()
        if (seq_lens_np[:raw_bs] >= self.max_context_len).any():  # ok: FC101
            raise ValueError("a request ran past max_context_len")
        indptr_np, indices_np, last_np = self.pool.page_lists(req_slots_np, seq_lens_np)
        self.cross_kv_indptr_cpu.numpy()[: bs + 1] = indptr_np
        self.cross_last_page_len_cpu.numpy()[:bs] = last_np
        self.cross_kv_indices[: len(indices_np)].copy_(torch.from_numpy(indices_np), non_blocking=True)
        w = self.decode_wrappers[bs]
        key = indptr_np.tobytes() + last_np.tobytes()
        if not self.plan_cache.hit(bs, key):
            w.plan(  # ok: FC102
                self.cross_kv_indptr_cpu[: bs + 1],
                self.cross_kv_indices,
                self.cross_last_page_len_cpu[:bs],
                **self._plan_kwargs(),
            )
            self.plan_cache.remember(bs, key, w._plan_info)  # expect: FC103
        if raw_bs < bs:
            self.cross_last_page_len[raw_bs:bs].fill_(1)  # expect: FC104
        self.forward_metadata = CrossMetadata(decode_wrapper=w, rows=self._rows(bs))

    # ------------------------------------------------------------------ forward
    def forward(self, q: torch.Tensor, fb: ForwardBatch) -> torch.Tensor:
        return self.forward_metadata.decode_wrapper.run(q, self.pool.cache)
