from typing import List

import numpy as np
import torch

from cgt import BucketPolicy, ServingConfig, make_decode_batch
from cgt.batch import Request
from cg_attn.backend import GraphTreeAttnBackend
from cg_attn.metadata import DecodeMetadataBuilder
from cg_run.compiled import CompiledStepRunner
from cg_run.dispatcher import StepDispatcher
from cg_run.hand_graphs import HandGraphRunner
from cg_run.model import DecoderModel, ForwardCtx


class ServingEngine:
    def __init__(self, cfg: ServingConfig):
        self.cfg = cfg
        self.device = torch.device(cfg.device)
        self.backend = GraphTreeAttnBackend(cfg)
        self.model = DecoderModel(cfg, self.backend).to(self.device, cfg.dtype)
        self.builder = DecodeMetadataBuilder(cfg)
        self.policy = BucketPolicy(cfg.hand_buckets, cfg.compiled_buckets)
        self.hand = HandGraphRunner(self.model, self.backend, self.builder, cfg)
        self.compiled = CompiledStepRunner(self.model, self.backend, cfg)
        self.dispatcher = StepDispatcher(self.policy, self.builder, self.backend, self.hand, self.compiled, self.model)
        self.running: List[Request] = []
        self.free_pages = list(range(cfg.max_pages - 1, 0, -1))

    def start(self) -> None:
        self.hand.capture_all()
        self.compiled.warmup(self.builder, self._dummy_batch)

    def _dummy_batch(self, n: int):
        reqs = [Request(-1 - i, 0, 1, [0]) for i in range(n)]
        return make_decode_batch(reqs, self.cfg.page_size, self.cfg.max_pages_per_seq, self.device)

    def prefill(self, req_id: int, prompt: List[int]) -> int:
        page, n = self.cfg.page_size, len(prompt)
        pages = [self.free_pages.pop() for _ in range((n + page - 1) // page)]
        kv_indices = torch.tensor(pages, dtype=torch.int32).to(self.device)
        self.backend.plan_prefill(torch.tensor([0, n], dtype=torch.int32), torch.tensor([0, len(pages)], dtype=torch.int32),
                                  kv_indices, torch.tensor([(n - 1) % page + 1], dtype=torch.int32))
        pos_np = np.arange(n)
        slots = torch.from_numpy(np.asarray(pages)[pos_np // page] * page + pos_np % page).to(self.device)
        ctx = ForwardCtx(None, 1, slots, kv_indices[None], torch.tensor([n], device=self.device), n)
        logits = self.model.forward_prefill(torch.tensor(prompt, device=self.device),
                                            torch.from_numpy(pos_np).to(self.device), ctx)
        first = int(logits[-1].argmax().cpu())
        self.running.append(Request(req_id, first, n + 1, pages))
        return first

    def step(self) -> torch.Tensor:
        page = self.cfg.page_size
        for r in (r for r in self.running if (r.seq_len - 1) // page >= len(r.pages)):
            r.pages.append(self.free_pages.pop())
        batch = make_decode_batch(self.running, page, self.cfg.max_pages_per_seq, self.device)
        logits = self.dispatcher.dispatch(batch)
        for r, tok in zip(self.running, logits.argmax(-1).cpu().tolist()):
            r.last_token, r.seq_len = tok, r.seq_len + 1
        return logits
