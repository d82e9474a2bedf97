"""Per-step metadata: decode-only steps (graph replay) and mixed steps (decode rows + prefill chunks)."""

from dataclasses import dataclass
from typing import Dict, List, Optional

import numpy as np
import torch

from chunkserve.config import ChunkConfig
from chunkserve.request import Request, StepPlan


class DevicePageTable:
    """[max_running, max_pages_per_seq] page ids on the device, with a numpy mirror."""

    def __init__(self, cfg: ChunkConfig, device):
        self.cfg = cfg
        self.device = device
        self.table = torch.zeros(cfg.max_running, cfg.max_pages_per_seq, dtype=torch.int32, device=device)
        self.table_np = np.zeros((cfg.max_running, cfg.max_pages_per_seq), dtype=np.int32)
        self.row_of: Dict[str, int] = {}
        self._synced: Dict[str, int] = {}
        self._free_rows = list(range(cfg.max_running - 1, -1, -1))

    def row(self, req: Request) -> int:
        if req.request_id not in self.row_of:
            self.row_of[req.request_id] = self._free_rows.pop()
        return self.row_of[req.request_id]

    def sync(self, reqs: List[Request]) -> None:
        for req in reqs:
            r, n = self.row(req), len(req.pages)
            done = self._synced.get(req.request_id, 0)
            if done == n:
                continue
            self.table_np[r, done:n] = req.pages[done:n]
            self.table[r, done:n].copy_(torch.from_numpy(self.table_np[r, done:n]), non_blocking=True)
            self._synced[req.request_id] = n

    def release(self, req: Request) -> None:
        self._free_rows.append(self.row_of.pop(req.request_id))
        self._synced.pop(req.request_id, None)


class HostStaging:
    def __init__(self, cfg: ChunkConfig):
        rows = cfg.max_running + 1
        self.dec_indptr_cpu = torch.zeros(rows, dtype=torch.int32, pin_memory=True)
        self.dec_last_cpu = torch.zeros(rows, dtype=torch.int32, pin_memory=True)
        self.qo_indptr_cpu = torch.zeros(rows + cfg.token_budget, dtype=torch.int32, pin_memory=True)


@dataclass
class DecodeOnlyMetadata:
    num_decode: int
    total_pages: int
    dec_kv_indptr_cpu: torch.Tensor
    dec_kv_indptr_dev: torch.Tensor
    dec_last_page_len_cpu: torch.Tensor
    dec_kv_indices: torch.Tensor
    dec_rows: torch.Tensor
    pages_per_row: torch.Tensor
    slot_mapping: torch.Tensor
    positions: torch.Tensor
    graph_bs: Optional[int] = None


@dataclass
class ChunkMetadata:
    num_decode: int
    num_chunks: int
    num_tokens: int
    qo_indptr: torch.Tensor
    qo_indptr_cpu: torch.Tensor
    # ragged: each chunk's own tokens against themselves (causal)
    ragged_qo_indptr: torch.Tensor
    ragged_qo_indptr_cpu: torch.Tensor
    # paged: each chunk against the prefix computed by its earlier chunks
    prefix_kv_indptr_cpu: torch.Tensor
    prefix_kv_indptr_gpu: torch.Tensor
    prefix_last_page_len_cpu: torch.Tensor
    chunk_rows_dev: torch.Tensor
    prefix_pages_dev: torch.Tensor
    # decode rows riding along
    dec_kv_indptr_cpu: torch.Tensor
    dec_kv_indices: torch.Tensor
    dec_last_page_len_cpu: torch.Tensor
    dec_seq_lens: torch.Tensor
    dec_block_tables: torch.Tensor
    dec_max_len: int
    use_trtllm: bool
    chunk_end_dev: torch.Tensor
    prompt_len_dev: torch.Tensor
    logit_rows: torch.Tensor
    slot_mapping: torch.Tensor
    positions: torch.Tensor
    num_patch: int
    patch_pos: torch.Tensor
    patch_pages: torch.Tensor

    @property
    def num_rows(self) -> int:
        return self.num_decode + self.num_chunks


def _dev(host: np.ndarray, device, dtype=torch.int32) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(host)).to(dtype).pin_memory().to(device, non_blocking=True)


def _decode_rows(reqs: List[Request], table: DevicePageTable, page: int, indptr: np.ndarray, last: np.ndarray):
    lens = np.array([r.seq_len + 1 for r in reqs], dtype=np.int64)
    pages = (lens + page - 1) // page
    indptr[0] = 0
    np.cumsum(pages, out=indptr[1 : len(reqs) + 1])
    last[: len(reqs)] = lens - (pages - 1) * page
    rows = np.array([table.row(r) for r in reqs], dtype=np.int64)
    slots = table.table_np[rows, (lens - 1) // page].astype(np.int64) * page + (lens - 1) % page
    return lens, pages, rows, slots


def build_decode_only_metadata(plan: StepPlan, table: DevicePageTable, staging: HostStaging, cfg: ChunkConfig, device) -> DecodeOnlyMetadata:
    reqs = plan.decodes
    n = len(reqs)
    table.sync(reqs)
    indptr = staging.dec_indptr_cpu.numpy()
    last = staging.dec_last_cpu.numpy()
    lens, pages, rows, slots = _decode_rows(reqs, table, cfg.page_size, indptr, last)
    indices = np.concatenate([table.table_np[r, :p] for r, p in zip(rows, pages)])
    return DecodeOnlyMetadata(
        num_decode=n,
        total_pages=int(indptr[n]),
        dec_kv_indptr_cpu=staging.dec_indptr_cpu[: n + 1],
        dec_kv_indptr_dev=staging.dec_indptr_cpu[: n + 1].to(device, non_blocking=True),
        dec_last_page_len_cpu=staging.dec_last_cpu[:n],
        dec_kv_indices=_dev(indices, device),
        dec_rows=_dev(rows, device, torch.int64),
        pages_per_row=_dev(pages, device, torch.int64),
        slot_mapping=_dev(slots, device, torch.int64),
        positions=_dev(lens - 1, device, torch.int64),
    )


def build_chunk_metadata(plan: StepPlan, table: DevicePageTable, staging: HostStaging, cfg: ChunkConfig, device) -> ChunkMetadata:
    page = cfg.page_size
    reqs = plan.decodes
    nd, nc = len(reqs), len(plan.chunks)
    table.sync(reqs + [c.req for c in plan.chunks])
    dec_indptr = np.zeros(nd + 1, dtype=np.int32)
    dec_last = np.zeros(max(nd, 1), dtype=np.int32)
    lens, pages, rows, dec_slots = _decode_rows(reqs, table, page, dec_indptr, dec_last)
    dec_indices = [table.table_np[r, :p] for r, p in zip(rows, pages)]
    # rows whose new token opens a page: where that page sits in the decode graphs' page list
    crossed = np.flatnonzero((lens - 1) % page == 0) if nd else np.zeros(0, dtype=np.int64)
    patch_pos = dec_indptr[crossed + 1] - 1 if nd else crossed
    patch_pages = table.table_np[rows[crossed], pages[crossed] - 1] if nd else crossed
    width = int(pages.max()) if nd else 1
    block_tables = np.zeros((max(nd, 1), width), dtype=np.int32)
    for i, (r, p) in enumerate(zip(rows, pages)):
        block_tables[i, :p] = table.table_np[r, :p]

    q_lens = np.array([c.num_tokens for c in plan.chunks], dtype=np.int32)
    ragged = np.zeros(nc + 1, dtype=np.int32)
    np.cumsum(q_lens, out=ragged[1:])
    prefix_pages = np.array([c.start // page for c in plan.chunks], dtype=np.int64)
    prefix_indptr = np.zeros(nc + 1, dtype=np.int32)
    np.cumsum(prefix_pages, out=prefix_indptr[1:])
    prefix_last = np.full(nc, page, dtype=np.int32)
    chunk_rows = np.array([table.row(c.req) for c in plan.chunks], dtype=np.int64)
    chunk_pos = [np.arange(c.start, c.end) for c in plan.chunks]
    chunk_slots = [
        table.table_np[r, p // page].astype(np.int64) * page + p % page for r, p in zip(chunk_rows, chunk_pos)
    ]

    qo = staging.qo_indptr_cpu.numpy()
    qo[0] = 0
    qo[1 : nd + 1] = np.arange(1, nd + 1)
    qo[nd + 1 : nd + nc + 1] = nd + ragged[1:]
    n_tok = nd + int(ragged[-1])
    logit_rows = np.concatenate([np.arange(nd), nd + ragged[1:] - 1])
    ragged_cpu = torch.from_numpy(ragged).pin_memory()
    prefix_cpu = torch.from_numpy(prefix_indptr).pin_memory()
    return ChunkMetadata(
        num_decode=nd,
        num_chunks=nc,
        num_tokens=n_tok,
        qo_indptr=staging.qo_indptr_cpu[: nd + nc + 1].to(device, non_blocking=True),
        qo_indptr_cpu=staging.qo_indptr_cpu[: nd + nc + 1],
        ragged_qo_indptr=ragged_cpu.to(device, non_blocking=True),
        ragged_qo_indptr_cpu=ragged_cpu,
        prefix_kv_indptr_cpu=prefix_cpu,
        prefix_kv_indptr_gpu=prefix_cpu.to(device, non_blocking=True),
        prefix_last_page_len_cpu=torch.from_numpy(prefix_last).pin_memory(),
        chunk_rows_dev=_dev(chunk_rows, device, torch.int64),
        prefix_pages_dev=_dev(prefix_pages, device, torch.int64),
        dec_kv_indptr_cpu=torch.from_numpy(dec_indptr).pin_memory(),
        dec_kv_indices=_dev(np.concatenate(dec_indices) if nd else np.zeros(0, dtype=np.int32), device),
        dec_last_page_len_cpu=torch.from_numpy(dec_last[:nd]).pin_memory(),
        dec_seq_lens=_dev(lens, device),
        dec_block_tables=_dev(block_tables, device),
        dec_max_len=int(lens.max()) if nd else 0,
        use_trtllm=bool(nd) and int(lens.max()) > cfg.long_context_threshold,
        chunk_end_dev=_dev(np.array([c.end for c in plan.chunks]), device),
        prompt_len_dev=_dev(np.array([c.req.prompt_len for c in plan.chunks]), device),
        logit_rows=_dev(logit_rows, device, torch.int64),
        slot_mapping=_dev(np.concatenate([dec_slots] + chunk_slots), device, torch.int64),
        positions=_dev(np.concatenate([lens - 1] + chunk_pos), device, torch.int64),
        num_patch=len(crossed),
        patch_pos=_dev(patch_pos, device, torch.int64),
        patch_pages=_dev(patch_pages, device),
    )


def dummy_decode_only(bs: int, device) -> DecodeOnlyMetadata:
    arange = torch.arange(bs + 1, dtype=torch.int32)
    return DecodeOnlyMetadata(
        num_decode=bs,
        total_pages=bs,
        dec_kv_indptr_cpu=arange,
        dec_kv_indptr_dev=arange.to(device),
        dec_last_page_len_cpu=torch.ones(bs, dtype=torch.int32),
        dec_kv_indices=torch.zeros(bs, dtype=torch.int32, device=device),
        dec_rows=torch.zeros(bs, dtype=torch.int64, device=device),
        pages_per_row=torch.ones(bs, dtype=torch.int64, device=device),
        slot_mapping=torch.zeros(bs, dtype=torch.int64, device=device),
        positions=torch.zeros(bs, dtype=torch.int64, device=device),
        graph_bs=bs,
    )
