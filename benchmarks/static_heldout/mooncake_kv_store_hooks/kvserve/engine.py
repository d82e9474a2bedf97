"""The engine: prefix pages from the store before prefill, write-back after decode, decode graphs per bucket."""

from __future__ import annotations

import logging
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Deque, Dict, List, Optional

import flashcheck
import numpy as np
import torch

from kvserve.attention import StoreAwareFlashInferBackend
from kvserve.connector import KVStoreConnector
from kvserve.graphs import DecodeGraphs
from kvserve.metadata import DecodeMetadata, PrefillMetadata
from kvserve.model import StoreLM
from kvserve.page_pool import LocalPagePool
from kvstore import MooncakeStoreClient, StoreConfig, TransferEngine, hex_keys, page_hashes

logger = logging.getLogger(__name__)


@dataclass
class Request:
    rid: int
    prompt_ids: List[int]
    max_new_tokens: int
    output_ids: List[int] = field(default_factory=list)
    pages: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int32))
    page_keys: List[str] = field(default_factory=list)
    hit_pages: int = 0
    seq_len: int = 0

    @property
    def tokens(self) -> List[int]:
        return self.prompt_ids + self.output_ids


class Engine:
    def __init__(self, cfg: StoreConfig, native_store: Any, num_pages: int, device: str = "cuda") -> None:
        self.cfg = cfg
        self.device = torch.device(device)
        self.native_store = native_store
        self.num_pages = num_pages
        self.waiting: Deque[Request] = deque()
        self.running: List[Request] = []
        self.by_id: Dict[int, Request] = {}

    def start(self) -> None:
        cfg = self.cfg
        self.pool = LocalPagePool(cfg, self.num_pages, self.device)
        transfer = TransferEngine(self.native_store, cfg.protocol)
        self.store = MooncakeStoreClient(cfg, transfer, self.pool.page_bytes)
        self.connector = KVStoreConnector(cfg, self.store, self.pool, self._key_of_page, self.device)
        self.backend = StoreAwareFlashInferBackend(cfg, self.pool, self.connector.load_event, self.device)
        self.backend.init_decode_graph_buffers(cfg.graph_buckets)
        self.model = StoreLM(cfg, self.backend).to(self.device, dtype=self.pool.kv_dtype)
        self._warmup_kernels()
        self.graphs = DecodeGraphs(self.model, self.backend, cfg, self.device)
        self.graphs.capture_all()

    def _warmup_kernels(self) -> None:
        """JIT the prefill kernels once unless an earlier engine in this process already did."""
        if hasattr(self.backend.prefill_wrapper, "_cached_module"):  # expect: FC103
            return
        req = Request(rid=-1, prompt_ids=[0] * (2 * self.cfg.page_size + 1), max_new_tokens=1)
        req.pages = self.pool.alloc(3)
        req.seq_len = len(req.prompt_ids)
        self._prefill([req])
        self.pool.release(req.pages)

    def _key_of_page(self, rid: int, page_idx: int) -> Optional[str]:
        req = self.by_id.get(rid)
        if req is None:
            return None
        end = (page_idx + 1) * self.cfg.page_size
        hashes = page_hashes(req.tokens[:end], self.cfg.page_size)
        return hex_keys(hashes[-1:], self.cfg.model_id)[0] if len(hashes) == page_idx + 1 else None

    def add_request(self, req: Request) -> None:
        self.by_id[req.rid] = req
        self.waiting.append(req)

    # ---------------------------------------------------------------- batches

    def _prefill(self, reqs: List[Request]) -> torch.Tensor:
        cfg, dev = self.cfg, self.device
        bs = len(reqs)
        starts = np.array([r.hit_pages * cfg.page_size for r in reqs], dtype=np.int64)
        lens = np.array([r.seq_len for r in reqs], dtype=np.int64)
        q_lens = lens - starts
        qo_indptr = np.zeros(bs + 1, dtype=np.int32)
        np.cumsum(q_lens, out=qo_indptr[1:])
        pages = (lens + cfg.page_size - 1) // cfg.page_size
        kv_indptr = np.zeros(bs + 1, dtype=np.int32)
        np.cumsum(pages, out=kv_indptr[1:])
        last_np = ((lens - 1) % cfg.page_size + 1).astype(np.int32)
        positions = np.concatenate([np.arange(s, n) for s, n in zip(starts, lens)])
        rows = np.repeat(np.arange(bs), q_lens)
        table = [r.pages for r in reqs]
        slots = np.array([table[r][p // cfg.page_size] * cfg.page_size + p % cfg.page_size for r, p in zip(rows, positions)])
        ids = np.concatenate([np.asarray(r.prompt_ids[s:], dtype=np.int64) for r, s in zip(reqs, starts)])
        meta = PrefillMetadata(
            batch_size=bs,
            num_tokens=int(qo_indptr[-1]),
            qo_indptr_host=torch.from_numpy(qo_indptr),
            kv_indptr_host=torch.from_numpy(kv_indptr),
            kv_indices=torch.from_numpy(np.concatenate(table).astype(np.int32)).to(dev, non_blocking=True),
            kv_last_page_len=torch.as_tensor(last_np, device=dev),
            input_ids=torch.from_numpy(ids).to(dev, non_blocking=True),
            positions=torch.from_numpy(positions.astype(np.int64)).to(dev, non_blocking=True),
            out_cache_loc=torch.from_numpy(slots.astype(np.int64)).to(dev, non_blocking=True),
            last_token_rows=torch.from_numpy((qo_indptr[1:] - 1).astype(np.int64)).to(dev, non_blocking=True),
        )
        self.backend.init_forward_metadata(meta)
        return self.model.forward_prefill(meta)

    def _decode_metadata(self) -> DecodeMetadata:
        cfg, dev = self.cfg, self.device
        for r in self.running:
            if r.seq_len >= r.pages.size * cfg.page_size:
                r.pages = np.concatenate([r.pages, self.pool.alloc(1)])
            r.seq_len += 1
        lens = np.array([r.seq_len for r in self.running], dtype=np.int32)
        pages = (lens + cfg.page_size - 1) // cfg.page_size
        indptr = np.zeros(lens.size + 1, dtype=np.int32)
        np.cumsum(pages, out=indptr[1:])
        flat = np.concatenate([r.pages[:n] for r, n in zip(self.running, pages)]).astype(np.int32)
        table = np.zeros((lens.size, int(pages.max())), dtype=np.int32)
        for i, (r, n) in enumerate(zip(self.running, pages)):
            table[i, :n] = r.pages[:n]
        pos = (lens - 1).astype(np.int64)
        slots = table[np.arange(lens.size), pos // cfg.page_size].astype(np.int64) * cfg.page_size + pos % cfg.page_size
        seq_lens_cpu = torch.from_numpy(lens).pin_memory()
        prefix = self._common_prefix_pages()
        return DecodeMetadata(
            batch_size=lens.size,
            max_seq_len=int(lens.max()),
            req_ids=[r.rid for r in self.running],
            seq_lens=seq_lens_cpu.to(dev, non_blocking=True),
            seq_lens_cpu=seq_lens_cpu,
            page_lists=[r.pages for r in self.running],
            block_table=torch.from_numpy(table).to(dev, non_blocking=True),
            kv_indptr_np=indptr,
            kv_last_page_len_np=((lens - 1) % cfg.page_size + 1).astype(np.int32),
            kv_indices=torch.from_numpy(flat).to(dev, non_blocking=True),
            input_ids=torch.tensor([r.tokens[-1] for r in self.running], dtype=torch.int64, device=dev),
            positions=torch.from_numpy(pos).to(dev, non_blocking=True),
            out_cache_loc=torch.from_numpy(slots).to(dev, non_blocking=True),
            shared_prefix_pages=prefix,
            use_trtllm=int(lens.max()) >= cfg.trtllm_min_seq_len,
        )

    def _common_prefix_pages(self) -> int:
        """Pages every running request shares (a system prompt the store handed back to all of them)."""
        if len(self.running) < 2:
            return 0
        first = self.running[0].pages
        n = min(r.hit_pages for r in self.running)
        while n and any(not np.array_equal(r.pages[:n], first[:n]) for r in self.running[1:]):
            n -= 1
        return n

    # ------------------------------------------------------------------ step

    @flashcheck.hot_path
    def step(self) -> Optional[torch.Tensor]:
        new: List[Request] = []
        while self.waiting and len(self.running) + len(new) < self.cfg.max_batch:
            new.append(self.waiting.popleft())
        if new:
            self.connector.match_prefixes(new)
            for r in new:
                r.pages = self.pool.alloc((len(r.prompt_ids) + self.cfg.page_size) // self.cfg.page_size)
                r.seq_len = len(r.prompt_ids)
            self.connector.load_prefix_hits(new)
            self._prefill(new)
            self.running.extend(new)
        if not self.running:
            return None
        meta = self._decode_metadata()
        if meta.batch_size <= self.graphs.max_bs and not meta.use_trtllm and not meta.shared_prefix_pages:
            logits = self.graphs.replay(meta)
        else:
            self.backend.init_forward_metadata(meta)
            logits = self.model.forward_decode(meta.input_ids, meta.out_cache_loc, meta)
        self.connector.write_back(meta)
        return logits.argmax(dim=-1)
