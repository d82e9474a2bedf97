"""One speculative step: draft (graph replay), verify (tree prefill, graph replay), accept."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Dict, List

import numpy as np
import torch

from spec_tree.attention.draft_backend import DraftDecodeBackend
from spec_tree.attention.tree_attn_backend import TreeAttnBackend, VerifyBatch
from spec_tree.config import SpecConfig
from spec_tree.draft_graph_runner import DraftGraphRunner, EagleDraftHead
from spec_tree.verifier import TreeVerifier

logger = logging.getLogger(__name__)


@dataclass
class Req:
    rid: str
    output_ids: List[int] = field(default_factory=list)


@dataclass
class SpecBatch:
    reqs: List[Req]
    hidden_states: torch.Tensor
    seq_lens: torch.Tensor
    seq_lens_cpu: torch.Tensor
    kv_indices: torch.Tensor
    num_kv_pages_cpu: np.ndarray
    draft_pages_per_seq: np.ndarray
    draft_last_page_len: np.ndarray


@dataclass
class AcceptStats:
    steps: int = 0
    accepted: int = 0

    def record(self, num_accepted: int, bs: int) -> None:
        self.steps += 1
        self.accepted += num_accepted


class VerifyGraphRunner:
    def __init__(self, target_model, backend: TreeAttnBackend, kv_cache: torch.Tensor, cfg: SpecConfig):
        self.target_model = target_model
        self.backend = backend
        self.kv_cache = kv_cache
        self.cfg = cfg
        self.n = cfg.tree.num_nodes
        self.capture_bs = list(cfg.capture_bs)
        self.graphs: Dict[int, torch.cuda.CUDAGraph] = {}
        self.outputs: Dict[int, torch.Tensor] = {}
        self.device = torch.device("cuda", torch.cuda.current_device())
        max_tokens = max(self.capture_bs) * self.n
        self.q_buf = torch.zeros(max_tokens, cfg.num_qo_heads, cfg.head_dim, dtype=cfg.dtype, device=self.device)

    def _forward(self, bs: int, wrapper) -> torch.Tensor:
        q = self.q_buf[: bs * self.n]
        o = wrapper.run(q, self.kv_cache)  # ok: FC108
        return self.target_model.lm_head(o.view(bs * self.n, -1))

    def capture(self) -> None:
        for bs in reversed(self.capture_bs):
            dummy = VerifyBatch(
                bs=bs,
                seq_lens_cpu=torch.ones(bs, dtype=torch.int32),
                kv_last_page_len=torch.ones(bs, dtype=torch.int32, device=self.device),
                kv_indices=torch.zeros(bs, dtype=torch.int32, device=self.device),
                num_kv_pages_cpu=np.ones(bs, dtype=np.int32),
                tree=self.cfg.tree,
            )
            wrapper = self.backend.prepare_verify(dummy, use_graph=True)
            self._forward(bs, wrapper)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                self.outputs[bs] = self._forward(bs, wrapper)
            self.graphs[bs] = graph

    def run(self, bs: int, wrapper) -> torch.Tensor:
        if bs in self.graphs:
            self.graphs[bs].replay()
            return self.outputs[bs]
        return self._forward(bs, wrapper)


class SpecDecodeWorker:
    def __init__(self, cfg: SpecConfig, target_model, draft_head: EagleDraftHead, kv_cache: torch.Tensor):
        self.cfg = cfg
        self.tree = cfg.tree
        device = kv_cache.device
        self.verify_backend = TreeAttnBackend(cfg, device)
        self.draft_backend = DraftDecodeBackend(cfg, device)
        self.draft_runner = DraftGraphRunner(self.draft_backend, draft_head, kv_cache, cfg)
        self.verify_runner = VerifyGraphRunner(target_model, self.verify_backend, kv_cache, cfg)
        self.verifier = TreeVerifier(cfg.tree, cfg.eos_token_id, device)
        self.stats = AcceptStats()

    def _rollback_rejected(self, bs: int, accept_lens: torch.Tensor) -> None:
        # the verify pass wrote KV for every node; drop the rejected tail of each request
        rejected = (self.tree.depth - 1 - accept_lens).to(torch.int32)
        self.verify_backend.kv_last_page_len[:bs] -= rejected  # expect: FC104

    def step(self, batch: SpecBatch) -> List[Req]:
        bs = len(batch.reqs)
        assert bs <= self.cfg.max_batch_size, "batch larger than the configured maximum"  # expect: FC109
        n = self.tree.num_nodes
        if bs in self.draft_runner.graphs:
            draft_tokens = self.draft_runner.replay(bs, batch.hidden_states, batch.draft_pages_per_seq, batch.draft_last_page_len)
        else:
            draft_tokens = self.draft_runner.run_eager(bs, batch.hidden_states, batch.draft_pages_per_seq, batch.draft_last_page_len)
        vb = VerifyBatch(
            bs=bs,
            seq_lens_cpu=batch.seq_lens_cpu,
            kv_last_page_len=(batch.seq_lens + n - 1) % self.cfg.page_size + 1,
            kv_indices=batch.kv_indices,
            num_kv_pages_cpu=batch.num_kv_pages_cpu,
            tree=self.tree,
        )
        wrapper = self.verify_backend.prepare_verify(vb, use_graph=bs in self.verify_runner.graphs)
        logits = self.verify_runner.run(bs, wrapper)
        out = self.verifier.verify(logits, draft_tokens.view(bs, -1)[:, :n], bs)
        self._rollback_rejected(bs, out.accept_lens)
        num_accepted = sum(out.accept_lens_cpu)  # ok: FC101
        finished = [req for i, req in enumerate(batch.reqs) if out.hit_eos[i]]  # expect: FC101
        self.stats.record(num_accepted, bs)
        return finished
