"""The QA server: documents are prefilled once, then questions stream in against them."""

import logging
from collections import deque
from dataclasses import dataclass, field
from typing import Deque, Dict, List

import numpy as np
import torch
from torch import nn

from docqa.config import QAConfig
from docqa.doc_store import DocStore
from docqa_srv.backend import DocQABackend
from docqa_srv.forward_batch import ForwardBatch
from docqa_srv.graph_runner import DocGraphRunner

logger = logging.getLogger(__name__)


class DocQAModel(nn.Module):
    def __init__(self, cfg: QAConfig, backend: DocQABackend):
        super().__init__()
        self.cfg = cfg
        self.backend = backend
        width = cfg.num_qo_heads * cfg.head_dim
        self.embed = nn.Embedding(152064, width)
        self.q_proj = nn.ModuleList([nn.Linear(width, width, bias=False) for _ in range(cfg.num_layers)])
        self.lm_head = nn.Linear(width, 152064, bias=False)

    def forward_decode(self, input_ids: torch.Tensor, fb: ForwardBatch) -> torch.Tensor:
        h = self.embed(input_ids)
        n = input_ids.shape[0]
        for layer, proj in enumerate(self.q_proj):
            q = proj(h).view(n, self.cfg.num_qo_heads, self.cfg.head_dim)
            h = h + self.backend.forward_decode(q, layer, fb).reshape(n, -1)
        return self.lm_head(h)


@dataclass
class Question:
    req_id: int
    doc_id: str
    token_ids: List[int]
    max_answer: int = 256
    pages: List[int] = field(default_factory=list)
    answer: List[int] = field(default_factory=list)

    @property
    def length(self) -> int:
        return len(self.token_ids) + len(self.answer)


class QAServer:
    def __init__(self, cfg: QAConfig, device="cuda"):
        self.cfg = cfg
        self.device = device
        self.kv_cache = torch.zeros(
            cfg.num_layers, cfg.num_pages, 2, cfg.page_size, cfg.num_kv_heads, cfg.head_dim,
            dtype=torch.bfloat16, device=device,
        )
        self.cite_kv = torch.zeros(
            cfg.num_layers, cfg.num_cite_pages, 2, cfg.page_size, cfg.num_kv_heads, cfg.head_dim,
            dtype=torch.bfloat16, device=device,
        )
        self.store = DocStore(cfg.page_size, list(range(cfg.num_pages - 1, 0, -1)))
        self.backend = DocQABackend(cfg, self.kv_cache, self.cite_kv, device)
        self.model = DocQAModel(cfg, self.backend).to(device)
        self.runner = DocGraphRunner(cfg, self.model, self.backend, device)
        self.waiting: Deque[Question] = deque()
        self.running: List[Question] = []
        self.doc_slot: Dict[str, int] = {}

    def ask(self, q: Question) -> None:
        if q.doc_id not in self.store.docs:
            raise KeyError(f"unknown document {q.doc_id!r}; register it first")
        self.waiting.append(q)

    def _append_answer_pages(self, fb: ForwardBatch) -> None:
        """A request whose answer crossed a page boundary gets a fresh page at the end of its run."""
        need = [i for i, q in enumerate(self.running) if q.length % self.cfg.page_size == 0]
        if not need:
            return
        ends = fb.unique_indptr_np[1:][need]
        new_pages = np.array([self.store.take_page() for _ in need], dtype=np.int32)
        self.backend.unique_kv_indices[torch.from_numpy(ends - 1).to(self.device)] = torch.from_numpy(new_pages).to(self.device)  # expect: FC104
        for i, p in zip(need, new_pages):
            self.running[i].pages.append(int(p))
        self.backend.kv_indptr_host[1][1 : fb.batch_size + 1] += torch.from_numpy(np.cumsum(np.isin(np.arange(fb.batch_size), need)).astype(np.int32))  # ok: FC104

    def _make_batch(self, qs: List[Question], is_decode: bool) -> ForwardBatch:
        slots = self.store.doc_index()
        order = sorted(range(len(qs)), key=lambda i: slots[qs[i].doc_id])
        qs = [qs[i] for i in order]
        doc_ids_np = np.array([slots[q.doc_id] for q in qs], dtype=np.int64)
        q_lens = np.array([1 if is_decode else len(q.token_ids) for q in qs], dtype=np.int64)
        unique_lens = np.array([q.length for q in qs], dtype=np.int64)
        pages = [np.asarray(q.pages, dtype=np.int32) for q in qs]
        last = [q.answer[-1] if q.answer else q.token_ids[-1] for q in qs]
        ids = torch.tensor(last if is_decode else sum((q.token_ids for q in qs), []), device=self.device)
        return ForwardBatch([q.req_id for q in qs], doc_ids_np, q_lens, unique_lens, pages, ids,
                            self.cfg.page_size, self.device, is_decode)

    def step(self) -> int:
        while self.waiting and len(self.running) < self.cfg.max_batch_size:
            self.running.append(self.waiting.popleft())
        if not self.running:
            return 0
        fb = self._make_batch(self.running, is_decode=True)
        if self.runner.can_run(fb):
            logits = self.runner.replay(fb)
        else:
            self.backend.init_forward_metadata(fb)
            logits = self.model.forward_decode(fb.input_ids, fb)
        next_ids = torch.argmax(logits, dim=-1)
        self._append_answer_pages(fb)
        self.pending = next_ids
        return fb.batch_size
