"""One step: n-gram chains (host), draft-model top-k (draft graphs), tree verify (target graphs)."""

from dataclasses import dataclass
from queue import Queue
from typing import List

import numpy as np
import torch

from spec_target.target_model import TargetLM
from spec_target.verifier import AcceptResult, TreeVerifier
from spec_target.verify_attn import TreeVerifyAttention
from spec_target.verify_runner import VerifyGraphRunner
from twospec.config import SpecConfig
from twospec.draft.attn import DraftAttention
from twospec.draft.kv_pool import DraftKVPool
from twospec.draft.model import DraftModel
from twospec.draft.runner import DraftGraphRunner
from twospec.ngram import NgramIndex
from twospec.tree import DraftTree, TreeMaskPacker


@dataclass
class SpecBatch:
    size: int
    histories: List[np.ndarray]
    last_tokens: torch.Tensor
    last_hidden: torch.Tensor
    kv_lens_np: np.ndarray


class TwoLevelSpecEngine:
    def __init__(self, cfg: SpecConfig, scheduler) -> None:
        self.cfg = cfg
        self.scheduler = scheduler
        dev = cfg.device
        self.ngram = NgramIndex(cfg.ngram_n, cfg.ngram_max_proposals)
        self.draft_pool = DraftKVPool(cfg)
        self.draft_attn = DraftAttention(cfg, self.draft_pool)
        self.draft_model = DraftModel(cfg, self.draft_attn).to(dev, torch.bfloat16)
        self.draft_runner = DraftGraphRunner(cfg, self.draft_model, self.draft_attn)
        self.verify_attn = TreeVerifyAttention(cfg)
        self.target_kv = [
            torch.zeros(cfg.target_pages, 2, cfg.page_size, cfg.num_kv_heads, cfg.head_dim, dtype=torch.bfloat16, device=dev)
            for _ in range(cfg.num_layers)
        ]
        self.target = TargetLM(cfg, self.verify_attn, self.target_kv).to(dev, torch.bfloat16)
        self.verify_runner = VerifyGraphRunner(cfg, self.target, self.verify_attn)
        self.verifier = TreeVerifier(cfg, self.draft_pool)
        self.packer = TreeMaskPacker(cfg.mask_bytes(), dev)
        self.accept_ema = torch.full((), 0.5, dtype=torch.float32, device=dev)
        self.depth_budget = torch.full((), cfg.draft_depth, dtype=torch.int32, device=dev)
        self.outputs: "Queue[AcceptResult]" = Queue()

    def capture_graphs(self) -> None:
        for bs in self.cfg.draft_buckets:
            self.draft_runner.record_draft_bucket(bs)
            self.verify_runner.record_verify(bs)

    def step(self) -> int:
        batch: SpecBatch = self.scheduler.next_batch()
        bs = batch.size
        cfg = self.cfg
        longest = int(self.draft_pool.seq_lens_cpu[:bs].max())  # ok: FC101
        if longest + cfg.max_tree_nodes > cfg.max_context:
            raise RuntimeError(f"a row would pass the context limit ({longest} + {cfg.max_tree_nodes})")
        # level one: an n-gram chain per row, on the host
        chain_np = np.stack([self.ngram.propose(h, cfg.ngram_max_proposals) for h in batch.histories])
        # level two: the draft model expands the root for as many depths as acceptance pays for
        ids = batch.last_tokens
        topk: List[torch.Tensor] = []
        for d in range(self.depth_budget):  # expect: FC101
            self.draft_attn.prepare_draft_step(bs, d)
            logits = self.draft_runner.run_draft_bucket(bs, d, ids, batch.last_hidden)
            top = torch.topk(logits, cfg.tree_width, dim=-1).indices
            topk.append(top)
            ids = top[:, 0]
        tree = DraftTree.from_proposals(
            batch.last_tokens, chain_np, torch.stack(topk, dim=1), cfg.tree_width, self.packer, batch.kv_lens_np
        )
        n = bs * tree.num_nodes
        if n > self.verify_runner.static_pos.numel():
            self.verify_runner.static_pos.resize_(n)  # expect: FC107
        self.verify_attn.prepare_verify(bs, tree, batch.kv_lens_np + tree.num_nodes)
        base = torch.from_numpy(batch.kv_lens_np).to(batch.last_tokens.device, non_blocking=True)
        positions = base[:, None] + tree.depth
        logits, _ = self.verify_runner.replay_verify(bs, tree, positions)
        result = self.verifier.accept(tree, logits.argmax(dim=-1), bs)
        self.accept_ema.mul_(0.9).add_(0.1 * result.rate)
        self.depth_budget.copy_(torch.clamp(torch.round(self.accept_ema * cfg.draft_depth), 1, cfg.draft_depth))
        self.outputs.put(result)
        return bs
