"""The decode worker: persistent decode rows, graph-mode decode wrappers per bucket, on the decode partition."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Optional

import numpy as np
import torch
from flashinfer import BatchDecodeWithPagedKVCacheWrapper

from semipd.config import DECODE_WS_MB, SemiPDConfig
from semipd.kvpool.handoff import HandoffRecord
from semipd.kvpool.unified_pool import UnifiedKVPool
from semipd.model import SPDModel


@dataclass
class DecodeBatch:
    bs: int
    bucket: Optional[int]  # None: eager
    nnz: int
    version: int
    seq_lens_cpu: torch.Tensor
    kv_indptr_cpu: torch.Tensor
    kv_indices: torch.Tensor
    last_page_cpu: torch.Tensor
    last_page_gpu: torch.Tensor
    positions: torch.Tensor
    slot_mapping: torch.Tensor


class DecodeWorker:
    def __init__(self, cfg: SemiPDConfig, pool: UnifiedKVPool, model: SPDModel, device: torch.device):
        self.cfg = cfg
        self.pool = pool
        self.model = model
        self.device = device
        self._backend = "fa2"
        self._plan_info: Optional[tuple] = None
        self.version = 0
        max_bs = cfg.max_decode_bs

        self.graph_ws = torch.empty(cfg.graph_ws_bytes(), dtype=torch.uint8, device=device)  # ok: FC105
        self.eager_ws = torch.zeros(DECODE_WS_MB << 20, dtype=torch.uint8, device=device)  # expect: FC106
        self.eager_decode = BatchDecodeWithPagedKVCacheWrapper(self.eager_ws, "NHD", use_tensor_cores=True)
        self.window_decode = BatchDecodeWithPagedKVCacheWrapper(self.eager_ws, "NHD", use_tensor_cores=True)

        # persistent rows [0, num_rows); host tables, device inputs of the graphs
        self.num_rows = 0
        self.row_rid: List[Optional[str]] = [None] * max_bs
        self.row_pages: List[List[int]] = [[] for _ in range(max_bs)]
        self.row_len_np = np.zeros(max_bs, dtype=np.int64)
        self.decode_tokens = torch.zeros(max_bs, dtype=torch.int64, device=device)
        self.finished_gpu = torch.zeros(max_bs, dtype=torch.bool, device=device)
        self.last_page_gpu = torch.ones(max_bs, dtype=torch.int32, device=device)
        self.positions_gpu = torch.zeros(max_bs, dtype=torch.int64, device=device)
        self.slots_gpu = torch.zeros(max_bs, dtype=torch.int64, device=device)
        self.indices_gpu = torch.zeros(max_bs * cfg.max_pages_per_req, dtype=torch.int32, device=device)
        self.next_ids_cpu = torch.zeros(max_bs, dtype=torch.int64, pin_memory=True)
        self.init_decode_buffers(max_bs)

    def init_decode_buffers(self, max_bs: int) -> None:
        dev = self.device
        self.kv_indptr_graph = torch.zeros(max_bs + 1, dtype=torch.int32, device=dev)
        self.kv_indices_graph = torch.zeros(max_bs * self.cfg.max_pages_per_req, dtype=torch.int32, device=dev)
        self.kv_last_page_graph = torch.ones(max_bs, dtype=torch.int32, device=dev)
        self.kv_indptr_cpu = torch.zeros(max_bs + 1, dtype=torch.int32, pin_memory=True)
        self.kv_last_page_cpu = torch.ones(max_bs, dtype=torch.int32, pin_memory=True)
        self.graph_wrappers: Dict[int, BatchDecodeWithPagedKVCacheWrapper] = {
            bs: BatchDecodeWithPagedKVCacheWrapper(
                self.graph_ws,
                "NHD",
                use_cuda_graph=True,
                use_tensor_cores=True,
                paged_kv_indptr_buffer=self.kv_indptr_graph[: bs + 1],
                paged_kv_indices_buffer=self.kv_indices_graph,
                paged_kv_last_page_len_buffer=self.kv_last_page_graph[:bs],
            )
            for bs in self.cfg.decode_buckets
        }

    # ------------------------------------------------------------------ rows
    def admit(self, rec: HandoffRecord) -> None:
        row = self.num_rows
        if row >= self.cfg.max_decode_bs:
            raise RuntimeError("decode rows exhausted; the scheduler must hold prompts back")
        self.num_rows += 1
        self.row_rid[row] = rec.rid
        self.row_pages[row] = list(rec.pages)
        self.row_len_np[row] = rec.prompt_len
        self.kv_last_page_graph[row] = rec.last_page_len  # expect: FC104
        self.decode_tokens = torch.cat([self.decode_tokens[:row], rec.first_ids])  # expect: FC107
        self.version += 1

    def retire(self) -> List[str]:
        bs = self.num_rows
        finished = [i for i in range(bs) if self.finished_gpu[i]]  # expect: FC101
        done = []
        for row in reversed(finished):
            last = self.num_rows - 1
            done.append(self.row_rid[row])
            self.pool.free(self.row_pages[row])
            if row != last:
                self.row_rid[row] = self.row_rid[last]
                self.row_pages[row] = self.row_pages[last]
                self.row_len_np[row] = self.row_len_np[last]
                self.decode_tokens[row] = self.decode_tokens[last]
            self.row_rid[last] = None
            self.num_rows -= 1
        if finished:
            self.version += 1
        return done

    def _grow_pages(self) -> None:
        ps = self.cfg.page_size
        for row in range(self.num_rows):
            if self.row_len_np[row] % ps == 0:
                self.row_pages[row].extend(self.pool.alloc(1))
                self.version += 1

    # ------------------------------------------------------------------ per step
    def build_step(self) -> DecodeBatch:
        self._grow_pages()
        bs = self.num_rows
        ps = self.cfg.page_size
        bucket = next((b for b in self.cfg.decode_buckets if b >= bs), None)
        lens = self.row_len_np[:bs] + 1
        counts = -(-lens // ps)
        indptr = np.zeros(bs + 1, dtype=np.int32)
        np.cumsum(counts, out=indptr[1:])
        nnz = int(indptr[-1])
        indices = np.concatenate([np.asarray(self.row_pages[r][: counts[r]], dtype=np.int32) for r in range(bs)])
        last = (lens - (counts - 1) * ps).astype(np.int32)
        positions = self.row_len_np[:bs].copy()
        slots = np.asarray([self.row_pages[r][positions[r] // ps] * ps + positions[r] % ps for r in range(bs)])
        self.indices_gpu[:nnz].copy_(torch.from_numpy(indices), non_blocking=True)
        self.last_page_gpu[:bs].copy_(torch.from_numpy(last), non_blocking=True)
        self.positions_gpu[:bs].copy_(torch.from_numpy(positions), non_blocking=True)
        self.slots_gpu[:bs].copy_(torch.from_numpy(slots.astype(np.int64)), non_blocking=True)
        self.row_len_np[:bs] += 1
        return DecodeBatch(
            bs=bs,
            bucket=bucket,
            nnz=nnz,
            version=self.version,
            seq_lens_cpu=torch.from_numpy(lens.astype(np.int32)),
            kv_indptr_cpu=torch.from_numpy(indptr).pin_memory(),
            kv_indices=self.indices_gpu[:nnz],
            last_page_cpu=torch.from_numpy(last).pin_memory(),
            last_page_gpu=self.last_page_gpu[:bs],
            positions=self.positions_gpu[:bs],
            slot_mapping=self.slots_gpu[:bs],
        )

    def dummy_batch(self, bs: int, slot_mapping: torch.Tensor) -> DecodeBatch:
        """Every row of a capture batch reads one token of the null page."""
        self.indices_gpu[:bs].zero_()
        return DecodeBatch(
            bs=bs,
            bucket=bs,
            nnz=bs,
            version=-1,
            seq_lens_cpu=torch.ones(bs, dtype=torch.int32),
            kv_indptr_cpu=torch.arange(bs + 1, dtype=torch.int32).pin_memory(),
            kv_indices=self.indices_gpu[:bs],
            last_page_cpu=torch.ones(bs, dtype=torch.int32).pin_memory(),
            last_page_gpu=self.last_page_gpu[:bs],
            positions=self.positions_gpu[:bs],
            slot_mapping=slot_mapping,
        )

    def plan_decode(self, fb: DecodeBatch) -> None:
        cfg = self.cfg
        bs, nnz = fb.bs, fb.nnz
        key = (fb.bucket, bs, nnz, fb.version)
        if self._plan_info == key:
            return
        self._plan_info = key  # ok: FC103
        long_ctx = bool((fb.seq_lens_cpu[:bs] > cfg.long_ctx_threshold).any())  # ok: FC101
        h, kvh, d, ps = cfg.num_qo_heads, cfg.num_kv_heads, cfg.head_dim, cfg.page_size
        self.window_decode.plan(
            fb.kv_indptr_cpu, fb.kv_indices, fb.last_page_cpu, h, kvh, d, ps,
            window_left=cfg.window - 1, q_data_type=torch.bfloat16,
        )
        if fb.bucket is None:
            self.eager_decode.plan(  # expect: FC102
                fb.kv_indptr_cpu, fb.kv_indices, fb.last_page_gpu, h, kvh, d, ps,
                q_data_type=torch.bfloat16, disable_split_kv=not long_ctx,
            )
            return
        bucket = fb.bucket
        self.kv_indptr_cpu[: bs + 1].copy_(fb.kv_indptr_cpu)
        self.kv_indptr_cpu[bs + 1 : bucket + 1].fill_(nnz)
        self.kv_last_page_cpu[:bs].copy_(fb.last_page_cpu)
        self.kv_indices_graph[:nnz].copy_(fb.kv_indices, non_blocking=True)  # ok: FC104
        w = self.graph_wrappers[bucket]
        w.plan(  # ok: FC102
            self.kv_indptr_cpu[: bucket + 1], self.kv_indices_graph[:nnz], self.kv_last_page_cpu[:bucket],
            h, kvh, d, ps, q_data_type=torch.bfloat16, disable_split_kv=not long_ctx,
        )
        self.kv_last_page_graph[:bucket].clamp_(min=1)  # expect: FC104

    def attend(self, q: torch.Tensor, layer_id: int, window: int, fb: DecodeBatch) -> torch.Tensor:
        kv = self.pool.layer_kv(layer_id)
        if window > 0:
            return self.window_decode.run(q, kv)  # expect: FC108
        w = self.graph_wrappers.get(fb.bucket, self.eager_decode)
        return w.run(q, kv)  # ok: FC108

    def forward_decode(self, fb: DecodeBatch, slot_mapping: torch.Tensor) -> torch.Tensor:
        n = fb.bs if fb.bucket is None else fb.bucket
        h = self.model.embed(self.decode_tokens[:n])
        for layer in self.model.layers:
            q, k, v = layer.pre_attn(h, fb.positions, self.model.cos_sin)
            self.pool.write(layer.layer_id, k, v, slot_mapping)
            h = layer.post_attn(h, self.attend(q, layer.layer_id, layer.window, fb))
        next_ids = torch.argmax(self.model.logits(h), dim=-1)
        if not hasattr(self, "_stop_ids"):
            self._stop_ids = torch.tensor([self.cfg.eos_token_id], dtype=torch.int64, device=self.device)  # ok: FC107
        self.finished_gpu[:n] = torch.isin(next_ids, self._stop_ids)
        self.decode_tokens[:n].copy_(next_ids)
        return next_ids
