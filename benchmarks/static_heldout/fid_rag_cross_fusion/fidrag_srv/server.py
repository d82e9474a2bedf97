"""The RAG server: retrieve, encode the passages not cached yet, decode answers over all passages."""

import logging
from dataclasses import dataclass, field
from typing import List

import numpy as np
import torch

from fidrag.config import FiDConfig
from fidrag.passage_cache import PassageCache, doc_hash, hash_words
from fidrag_srv.cross_attn import CrossAttnBackend, DecodeBatch
from fidrag_srv.encoder_attn import EncodeBatch, RaggedEncoderBackend
from fidrag_srv.model import FiDModel
from fidrag_srv.runner import FiDGraphRunner

logger = logging.getLogger(__name__)


@dataclass
class Request:
    rid: int
    query_ids: List[int]
    passages: List[List[int]]
    keys: List[bytes] = field(default_factory=list)
    answer: List[int] = field(default_factory=list)
    self_pages: List[int] = field(default_factory=list)
    scores: List[float] = field(default_factory=list)


class FiDServer:
    def __init__(self, cfg: FiDConfig):
        self.cfg = cfg
        self.device = torch.device("cuda")
        self.cache = PassageCache(cfg, cfg.cross_pool_pages)
        self.encoder = RaggedEncoderBackend(cfg, self.device)
        self.cross = CrossAttnBackend(cfg, self.device)
        self.model = FiDModel(cfg, self.encoder, self.cross).to(self.device)
        kv_shape = (cfg.page_size, cfg.num_kv_heads, cfg.head_dim)
        self.model.bind_pools(
            torch.zeros((cfg.num_dec_layers, cfg.self_pool_pages, 2) + kv_shape, dtype=torch.bfloat16, device=self.device),
            torch.zeros((cfg.num_dec_layers, cfg.cross_pool_pages, 2) + kv_shape, dtype=torch.bfloat16, device=self.device),
        )
        self.runner = FiDGraphRunner(cfg, self.model, self.cross, self.device)
        self.pending: List[Request] = []
        self.running: List[Request] = []
        self.next_rid = 0

    def start(self) -> None:
        self.runner.capture_all()

    # ---- admission -------------------------------------------------------------------------------------
    def submit(self, query_ids: List[int], passages: List[List[int]], scores: List[float]) -> int:
        self._check_passages(passages)
        rid = self.next_rid
        self.next_rid += 1
        self.pending.append(Request(rid, query_ids, passages, scores=scores))
        return rid

    def _check_passages(self, passages: List[List[int]]) -> None:
        assert len(passages) <= self.cfg.passages_per_query, "too many passages for one query"  # expect: FC109

    # ---- encoding ----------------------------------------------------------------------------------------
    def encode_pending(self) -> None:
        reqs, self.pending = self.pending, []
        keys = []
        for r in reqs:
            r.keys = [doc_hash(p) for p in r.passages]
            keys.extend(r.keys)
        hits = self.cache.lookup(keys)
        fresh = [(k, p) for r in reqs for k, p in zip(r.keys, r.passages)]
        fresh = [kp for kp, hit in zip(fresh, hits.tolist()) if not hit]
        if fresh:
            self._encode(fresh)
        if self.cache._backend == "host":  # ok: FC103
            logger.warning("passage cache spilled to host memory; cross pages will be re-uploaded")
        self.running.extend(reqs)

    def _encode(self, fresh) -> None:
        lens = [len(p) for _, p in fresh]
        lens_cpu = torch.tensor(lens, dtype=torch.int32)
        words = torch.tensor([hash_words(k) for k, _ in fresh], dtype=torch.int64)
        batch = EncodeBatch(
            num_passages=len(fresh),
            total_tokens=sum(lens),
            passage_lens_dev=lens_cpu.to(self.device, non_blocking=True),
            passage_lens_cpu=lens_cpu,
            doc_hash_dev=words.to(self.device, non_blocking=True),
            token_ids=torch.tensor([t for _, p in fresh for t in p], dtype=torch.int64, device=self.device),
        )
        self.encoder.init_forward_metadata(batch)
        self.model.encode(batch.token_ids)
        for (key, _), n in zip(fresh, lens):
            pages = self.cache.alloc(-(-n // self.cfg.page_size))
            self.cache.insert(key, pages, n)

    def refresh_relocated(self, rows: np.ndarray, new_pages: np.ndarray) -> None:
        """Passages re-encoded after an eviction: patch the live cross page lists."""
        self.cross.relocate_passage(
            torch.from_numpy(rows).to(self.device), torch.from_numpy(new_pages.astype(np.int32)).to(self.device)
        )

    # ---- decoding -----------------------------------------------------------------------------------------
    def _decode_batch(self) -> DecodeBatch:
        reqs = self.running[: self.cfg.max_batch]
        ps = self.cfg.page_size
        cross_lists, cross_last, summary = [], [], []
        self_lists, self_last = [], []
        for r in reqs:
            entries = [self.cache.get(k) for k in r.keys]
            cross_lists.append(np.concatenate([e.pages for e in entries]))
            cross_last.append((entries[-1].num_tokens - 1) % ps + 1)
            summary.append(np.array([e.pages[0] for e in entries], dtype=np.int32))
            self_lists.append(np.asarray(r.self_pages, dtype=np.int32))
            self_last.append((len(r.answer) - 1) % ps + 1 if r.answer else 1)
        cross_indptr = np.concatenate([[0], np.cumsum([c.size for c in cross_lists])]).astype(np.int32)
        hits = self.cache.lookup([k for r in reqs for k in r.keys])
        scores = torch.tensor([r.scores for r in reqs], dtype=torch.float32)
        return DecodeBatch(
            bs=len(reqs),
            input_ids=torch.tensor([r.answer[-1] if r.answer else 0 for r in reqs], dtype=torch.int64, device=self.device),
            cross_indptr_np=cross_indptr,
            cross_indices_np=np.concatenate(cross_lists),
            cross_last_np=np.asarray(cross_last, dtype=np.int32),
            cross_indptr_dev=torch.from_numpy(cross_indptr).to(self.device),
            self_indptr_np=np.concatenate([[0], np.cumsum([s.size for s in self_lists])]).astype(np.int32),
            self_indices_np=np.concatenate(self_lists),
            self_last_np=np.asarray(self_last, dtype=np.int32),
            summary_indptr_np=np.concatenate([[0], np.cumsum([s.size for s in summary])]).astype(np.int32),
            summary_indices_np=np.concatenate(summary),
            cache_hit_np=hits,
            passage_scores=scores.to(self.device, non_blocking=True),
        )

    def decode_step(self) -> List[int]:
        batch = self._decode_batch()
        if self.runner.bucket_for(batch.bs):
            logits = self.runner.replay(batch)
        else:
            self.cross.init_forward_metadata(batch)
            logits = self.model.decode_eager(batch.input_ids, batch.passage_scores.flatten())
        return self.collect_outputs(logits.argmax(dim=-1))

    def collect_outputs(self, next_ids: torch.Tensor) -> List[int]:
        tokens = next_ids.tolist()  # ok: FC101
        for r, t in zip(self.running, tokens):
            r.answer.append(t)
        return tokens
