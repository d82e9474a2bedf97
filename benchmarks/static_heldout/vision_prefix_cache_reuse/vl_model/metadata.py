"""Per-step attention metadata for mixed image-prefix / text batches."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Dict, List, Optional, Sequence

import numpy as np
import torch

from vlcache.image_cache import CachedImage, ImageKVCache

if TYPE_CHECKING:
    from vl_model.attention import VLAttentionBackend


@dataclass
class VLRequestView:
    req_id: int
    image_hashes: List[str]
    num_computed: int  # text tokens whose KV is cached
    num_new: int  # text tokens scheduled this step
    text_pages: List[int]
    rope_delta: int = 0

    @property
    def text_kv_len(self) -> int:
        return self.num_computed + self.num_new


@dataclass
class VLBatch:
    is_decode: bool
    reqs: List[VLRequestView]
    input_ids_np: np.ndarray
    image_rows: int = 0  # requests in the batch that carry an image prefix


@dataclass
class DecodeTable:
    bs: int
    kv_indptr_np: np.ndarray
    last_np: np.ndarray
    kv_indices: torch.Tensor
    seq_lens_np: np.ndarray

    @property
    def nnz(self) -> int:
        return int(self.kv_indptr_np[-1])


@dataclass
class VLForwardMetadata:
    mode: str
    bs: int
    text_qo_indptr_cpu: Optional[torch.Tensor] = None
    prefix_kv_indptr_cpu: Optional[torch.Tensor] = None
    prefix_lens: Optional[torch.Tensor] = None
    prefix_last_page_len: Optional[torch.Tensor] = None
    max_prefix_len: int = 0
    has_prefix: bool = False
    max_text_len: int = 0
    positions: Optional[torch.Tensor] = None
    shared_prefix: bool = False
    graph_bs: Optional[int] = None
    long_ctx: bool = False
    block_tables: Optional[torch.Tensor] = None
    seq_lens: Optional[torch.Tensor] = None
    max_seq_len: int = 0
    extra: Dict[str, int] = field(default_factory=dict)


def shares_one_prefix(hash_lists: Sequence[Sequence[str]]) -> bool:
    return len(hash_lists) > 1 and bool(hash_lists[0]) and all(list(h) == list(hash_lists[0]) for h in hash_lists)


class VLMetadataBuilder:
    def __init__(self, backend: "VLAttentionBackend", cache: ImageKVCache, cfg, device: torch.device):
        self.backend = backend
        self.cache = cache
        self.cfg = cfg
        self.device = device
        self._plan_info: Dict[str, tuple] = {}
        self.prefix_indices: Optional[torch.Tensor] = None
        self._empty_indices = torch.zeros(0, dtype=torch.int32, device=device)
        self._mrope_scratch: Optional[torch.Tensor] = None
        self.text_qo_indptr_host = torch.zeros(cfg.max_batch + 1, dtype=torch.int32, pin_memory=True)
        self.text_pos_dev = torch.zeros(cfg.max_num_tokens, dtype=torch.int64, device=device)

    def _entries(self, req: VLRequestView) -> List[CachedImage]:
        out = []
        for h in req.image_hashes:
            e = self.cache.lookup(h)
            if e is None:
                raise KeyError(f"request {req.req_id}: image {h[:12]} is not cached; encode it before scheduling")
            out.append(e)
        return out

    def build(self, batch: VLBatch) -> VLForwardMetadata:
        if batch.is_decode:
            return self._build_decode(batch)
        return self._build_prefill(batch)

    def _build_prefill(self, batch: VLBatch) -> VLForwardMetadata:
        cfg, b = self.cfg, self.backend
        n = len(batch.reqs)
        entries = [self._entries(r) for r in batch.reqs]
        prefix_pages = np.array([sum(e.num_pages for e in es) for es in entries], dtype=np.int32)
        text_lens_cpu = torch.tensor([r.num_new for r in batch.reqs], dtype=torch.int32)
        max_text = int(text_lens_cpu.max())  # ok: FC101
        if n + 1 > self.text_qo_indptr_host.numel():
            self.text_qo_indptr_host = torch.zeros(2 * n + 1, dtype=torch.int32, pin_memory=True)  # ok: FC107
        qo = self.text_qo_indptr_host[: n + 1]
        qo[0] = 0
        torch.cumsum(text_lens_cpu, 0, dtype=torch.int32, out=qo[1:])
        num_tokens = int(qo[n])

        meta = VLForwardMetadata(mode="prefill", bs=n, text_qo_indptr_cpu=qo, max_text_len=max_text,
                                 has_prefix=bool(prefix_pages.any()))
        kv_indptr = np.zeros(n + 1, dtype=np.int32)
        np.cumsum(prefix_pages, out=kv_indptr[1:])
        meta.prefix_kv_indptr_cpu = torch.from_numpy(kv_indptr)
        flat = [e for es in entries for e in es]
        self.prefix_indices = torch.cat([e.pages_dev for e in flat] or [self._empty_indices])  # expect: FC107
        self.cache.record_hits(flat)

        valid = [sum(e.valid_tokens for e in es) for es in entries]
        meta.prefix_lens = torch.tensor(valid, dtype=torch.int32, device=self.device)
        meta.max_prefix_len = max(meta.prefix_lens)  # expect: FC101
        # images are tile-padded to whole pages, so a request's prefix ends on a full page
        last = np.where(prefix_pages > 0, cfg.page_size, 1).astype(np.int32)
        meta.prefix_last_page_len = torch.from_numpy(last).to(self.device, non_blocking=True)

        b.prefix_prefill.plan(  # expect: FC102
            qo,
            meta.prefix_kv_indptr_cpu,
            self.prefix_indices,
            meta.prefix_last_page_len,
            cfg.num_qo_heads,
            cfg.num_kv_heads,
            cfg.head_dim,
            cfg.page_size,
            causal=False,
            sm_scale=cfg.sm_scale,
            q_data_type=cfg.dtype,
        )
        b.ragged.plan(  # ok: FC102
            qo,
            qo,
            cfg.num_qo_heads,
            cfg.num_kv_heads,
            cfg.head_dim,
            causal=True,
            sm_scale=cfg.sm_scale,
            q_data_type=cfg.dtype,
        )
        self._plan_info["prefill"] = (n, num_tokens, max_text)  # ok: FC103

        # text positions continue after the image's grid (mrope: the same index on all three axes)
        pos_np = np.concatenate([v + r.num_computed + np.arange(r.num_new) for v, r in zip(valid, batch.reqs)])
        self.text_pos_dev[:num_tokens].copy_(torch.from_numpy(pos_np), non_blocking=True)  # ok: FC104
        if self._mrope_scratch is None:
            self._mrope_scratch = torch.empty(3, cfg.max_num_tokens, dtype=torch.int64, device=self.device)  # ok: FC107
        self._mrope_scratch[:, :num_tokens].copy_(self.text_pos_dev[:num_tokens].expand(3, num_tokens))
        meta.positions = self._mrope_scratch[:, :num_tokens]
        return meta

    def decode_table(self, batch: VLBatch) -> DecodeTable:
        cfg = self.cfg
        lists, lens = [], []
        for r in batch.reqs:
            es = self._entries(r)
            pages = [p for e in es for p in e.page_ids] + r.text_pages
            n_text_pages = -(-r.text_kv_len // cfg.page_size)
            lists.append(np.asarray(pages[: len(pages) - len(r.text_pages) + n_text_pages], dtype=np.int32))
            lens.append(sum(e.num_tokens for e in es) + r.text_kv_len)
        indptr = np.zeros(len(lists) + 1, dtype=np.int32)
        np.cumsum([len(x) for x in lists], out=indptr[1:])
        seq_lens = np.asarray(lens, dtype=np.int32)
        last = ((seq_lens - 1) % cfg.page_size + 1).astype(np.int32)
        indices = torch.from_numpy(np.concatenate(lists)).to(self.device, non_blocking=True)
        return DecodeTable(len(lists), indptr, last, indices, seq_lens)

    def _build_decode(self, batch: VLBatch) -> VLForwardMetadata:
        cfg, b = self.cfg, self.backend
        table = self.decode_table(batch)
        n = table.bs
        max_len = int(table.seq_lens_np.max())
        if max_len > cfg.long_context_threshold:
            return self._long_ctx(batch, table, max_len)

        meta = VLForwardMetadata(mode="decode", bs=n)
        if shares_one_prefix([r.image_hashes for r in batch.reqs]):
            es = self._entries(batch.reqs[0])
            shared_pages = sum(e.num_pages for e in es)
            shared_idx = torch.cat([e.pages_dev for e in es])
            unique_lists = [np.asarray(r.text_pages[: -(-r.text_kv_len // cfg.page_size)], dtype=np.int32)
                            for r in batch.reqs]
            unique_counts = torch.tensor([len(u) for u in unique_lists], dtype=torch.int32, device=self.device)
            unique_kv_indptr = torch.zeros(n + 1, dtype=torch.int32, device=self.device)
            torch.cumsum(unique_counts, 0, dtype=torch.int32, out=unique_kv_indptr[1:])
            unique_idx = torch.from_numpy(np.concatenate(unique_lists)).to(self.device, non_blocking=True)
            text_last = torch.from_numpy(
                np.array([(r.text_kv_len - 1) % cfg.page_size + 1 for r in batch.reqs], dtype=np.int32))
            b.cascade.plan(  # expect: FC102
                [torch.tensor([0, n], dtype=torch.int32), torch.arange(n + 1, dtype=torch.int32)],
                [torch.tensor([0, shared_pages], dtype=torch.int32), unique_kv_indptr],
                [shared_idx, unique_idx],
                [torch.tensor([cfg.page_size], dtype=torch.int32), text_last],
                cfg.num_qo_heads,
                cfg.num_kv_heads,
                cfg.head_dim,
                cfg.page_size,
                sm_scale=cfg.sm_scale,
                q_data_type=cfg.dtype,
            )
            meta.shared_prefix = True
            return meta

        b.eager_decode.plan(
            torch.from_numpy(table.kv_indptr_np),
            table.kv_indices,
            torch.from_numpy(table.last_np),
            cfg.num_qo_heads,
            cfg.num_kv_heads,
            cfg.head_dim,
            cfg.page_size,
            sm_scale=cfg.sm_scale,
            q_data_type=cfg.dtype,
        )
        return meta

    def _long_ctx(self, batch: VLBatch, table: DecodeTable, max_len: int) -> VLForwardMetadata:
        starts = table.kv_indptr_np
        bt = np.zeros((table.bs, int(np.diff(starts).max())), dtype=np.int32)
        flat = np.concatenate([np.asarray(self._row_pages(r), dtype=np.int32) for r in batch.reqs])
        for i in range(table.bs):
            row = flat[starts[i]: starts[i + 1]]
            bt[i, : len(row)] = row
        return VLForwardMetadata(
            mode="decode", bs=table.bs, long_ctx=True,
            block_tables=torch.from_numpy(bt).to(self.device, non_blocking=True),
            seq_lens=torch.from_numpy(table.seq_lens_np).to(self.device, non_blocking=True),
            max_seq_len=max_len,
        )

    def _row_pages(self, r: VLRequestView) -> List[int]:
        es = self._entries(r)
        n_text = -(-r.text_kv_len // self.cfg.page_size)
        return [p for e in es for p in e.page_ids] + r.text_pages[:n_text]
