import collections
from dataclasses import dataclass, field
from typing import List

import numpy as np
import torch

from radix_srv.forward_batch import ForwardBatch, ForwardMode


@dataclass
class Req:
    rid: str
    token_ids: List[int]
    max_new_tokens: int
    row: int = -1
    num_cached: int = 0
    match_pages: List[int] = field(default_factory=list)
    own_pages: List[int] = field(default_factory=list)
    node: object = None
    done: bool = False


class Scheduler:
    """Prefix-matching scheduler: every admitted request locks its tree match; pages it adds are refcounted."""

    def __init__(self, model_runner):
        self.runner = model_runner
        args = model_runner.server_args
        self.page_size = args.page_size
        self.max_running = args.max_running_requests
        self.page_table_np = np.zeros((args.max_running_requests, args.max_pages_per_seq), dtype=np.int32)
        self.free_rows = list(range(args.max_running_requests - 1, -1, -1))
        self.waiting = collections.deque()
        self.running: List[Req] = []

    def add(self, req):
        self.waiting.append(req)

    def _admit(self):
        tree, refs = self.runner.tree, self.runner.refs
        while self.waiting and self.free_rows:
            req = self.waiting.popleft()
            m = tree.match_prefix(req.token_ids)
            tree.lock(m.node)
            req.node = m.node
            req.match_pages = list(m.pages)
            req.num_cached = m.matched_tokens
            need = -(-len(req.token_ids) // self.page_size) - len(m.pages)
            if need > refs.num_free():
                tree.evict(need - refs.num_free())
            req.own_pages = refs.alloc(need)
            req.row = self.free_rows.pop()
            pages = req.match_pages + req.own_pages
            self.page_table_np[req.row, : len(pages)] = pages
            self.running.append(req)

    def event_loop_once(self):
        self._admit()
        if not self.running:
            return
        fb = ForwardBatch.from_matches(self.running, self.page_size, self.page_table_np, self.runner.device)
        logits = self.runner.forward(fb)
        if fb.forward_mode == ForwardMode.EXTEND:
            last = torch.from_numpy(np.cumsum(fb.extend_lens_cpu) - 1).to(logits.device)
            logits = logits[last]
        next_ids = torch.argmax(logits, dim=-1).tolist()
        for req, tok in zip(self.running, next_ids):
            req.token_ids.append(tok)
            req.num_cached = len(req.token_ids) - 1
            if len(req.token_ids) % self.page_size == 1:
                new_page = self.runner.refs.alloc(1)
                req.own_pages.extend(new_page)
                self.page_table_np[req.row, len(req.match_pages) + len(req.own_pages) - 1] = new_page[0]
            req.done = len(req.token_ids) >= req.max_new_tokens
        self._retire()

    def _retire(self):
        tree, refs = self.runner.tree, self.runner.refs
        keep = []
        for req in self.running:
            if not req.done:
                keep.append(req)
                continue
            full = len(req.token_ids) // self.page_size * self.page_size
            pages = req.match_pages + req.own_pages
            tree.insert(req.token_ids[:full], pages[: full // self.page_size])
            tree.unlock(req.node)
            refs.decref(req.own_pages)
            self.free_rows.append(req.row)
        self.running = keep
