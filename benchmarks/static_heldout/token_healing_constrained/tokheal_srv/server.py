"""Healing server: admission re-prefills the backed-off tail, steps decode under the trie mask."""
from __future__ import annotations

import dataclasses
import logging
from typing import Callable, Dict, List, Optional, Sequence, Tuple

import numpy as np
import torch

from tokheal.config import HealConfig
from tokheal.healer import HealPlan, TokenHealer
from tokheal.mask.kernels import apply_token_bitmask_inplace
from tokheal.mask.vocab_mask import VocabMaskBuilder
from tokheal.spec.prefix_match import SpeculativePrefixMatcher
from tokheal.trie import PrefixTrie
from tokheal_srv.attention import HealAttention
from tokheal_srv.graphs import ConstrainedDecodeGraphs
from tokheal_srv.model import HealLM
from tokheal_srv.pages import HostPageTable

logger = logging.getLogger(__name__)


@dataclasses.dataclass
class HealRequest:
    req_id: int
    row: int
    seq_len: int
    last_token: int
    plan: Optional[HealPlan] = None
    output: List[int] = dataclasses.field(default_factory=list)

    @property
    def healing(self) -> bool:
        return self.plan is not None and bool(self.plan.remaining)


class HealingServer:
    def __init__(
        self,
        cfg: HealConfig,
        vocab: Sequence[Tuple[int, bytes]],
        detokenize: Callable[[List[int]], bytes],
        device: str = "cuda",
    ) -> None:
        self.cfg = cfg
        self.device = torch.device(device)
        self.vocab_text: Dict[int, bytes] = dict(vocab)
        self.trie = PrefixTrie.from_vocab(vocab)
        self.healer = TokenHealer(self.trie, detokenize)
        self.masker = VocabMaskBuilder(cfg.vocab_size, cfg.max_batch, self.device)
        self.matcher = SpeculativePrefixMatcher(cfg.spec_k, cfg.max_batch, self.device)
        self.pages = HostPageTable(cfg)
        shape = (cfg.num_pages, 2, cfg.page_size, cfg.num_kv_heads, cfg.head_dim)
        self.kv = [torch.zeros(shape, dtype=cfg.dtype, device=self.device) for _ in range(cfg.num_layers)]
        self.attn = HealAttention(cfg, self.kv, self.device)
        self.model = HealLM(cfg, self.attn).to(self.device)
        self.graphs = ConstrainedDecodeGraphs(self.model, self.attn, self.masker, cfg, self.device)
        self.active: List[HealRequest] = []
        self.accepted_host: Optional[torch.Tensor] = None
        self.copy_done = torch.cuda.Event()

    def heal_request(self, req: HealRequest, prompt_ids: List[int]) -> None:
        plan = self.healer.back_off(prompt_ids, self.cfg.max_heal_tokens)
        req.plan = plan
        tail = prompt_ids[len(plan.kept_ids):]
        req.seq_len = len(plan.kept_ids)
        self.pages.ensure_pages(req.row, len(prompt_ids))
        layout = self.pages.layout(np.array([req.row]), np.array([req.seq_len]), extra=len(tail))
        tail_lens = torch.tensor([len(tail)], dtype=torch.int32, device=self.device)
        self.attn.plan_heal(tail_lens, layout)
        self.model.prefill_tail(torch.tensor(tail, dtype=torch.int64, device=self.device))
        self.active.append(req)

    def step(self) -> None:
        reqs = self.active
        n = len(reqs)
        if n == 0:
            return
        rows_allowed = [r.plan.allowed_next(self.trie) if r.healing else None for r in reqs]
        is_constrained = np.array([a is not None for a in rows_allowed])
        constrained_rows = np.nonzero(is_constrained)[0].tolist()  # ok: FC101
        mask = self.masker.fill_step_mask(rows_allowed)
        rows_np = np.array([r.row for r in reqs], dtype=np.int64)
        lens_np = np.array([r.seq_len for r in reqs], dtype=np.int64)
        spec = bool(constrained_rows)
        layout = self.pages.layout(rows_np, lens_np, extra=self.cfg.spec_k + 1 if spec else 1)
        bs = self.graphs.bucket_for(min(n, self.graphs.buckets[-1]))
        positions = torch.from_numpy(lens_np).to(self.device, non_blocking=True)
        if spec:
            drafts = self.matcher.propose([r.plan for r in reqs if r.plan is not None] or [], self.trie)
            ids = torch.zeros((n, self.cfg.spec_k + 1), dtype=torch.int64, device=self.device)
            ids[:, 0] = torch.tensor([r.last_token for r in reqs], device=self.device)
            ids[: drafts.shape[0], 1:] = torch.from_numpy(drafts).to(self.device)
        else:
            ids = torch.tensor([r.last_token for r in reqs], dtype=torch.int64, device=self.device)
        if n > self.graphs.buckets[-1]:
            # past the largest bucket: eager, unconstrained by drafts
            self.attn.plan_eager_decode(layout)
            logits = self.model.decode_tokens(ids[:, 0] if spec else ids)
            apply_token_bitmask_inplace(logits, mask)
            out = logits.argmax(-1)
            spec = False
        else:
            self.graphs.static_mask[:n].copy_(mask)  # ok: FC104
            out = self.graphs.launch(bs, n, spec, ids, positions, layout)
        if spec:
            target = out.view(n, -1)
            accepted_len, tokens = self.matcher.match(ids[:, 1:], target, ids[:, 0])
            rejected = (self.cfg.spec_k - accepted_len).to(torch.int32)
            # the rejected drafts' slots must not stay visible to the next step
            self.attn.graph_last_page_len[:n].sub_(rejected)  # expect: FC104
            out = tokens[:, 0]
        logger.debug("step tokens %s", out)  # ok: FC101
        if any(r.healing for r in reqs):
            healed = out.tolist()  # expect: FC101
            for r, tok in zip(reqs, healed):
                if r.healing:
                    r.plan.advance(self.vocab_text.get(tok, b""))
        self.accepted_host = torch.empty(n, dtype=torch.int64, pin_memory=True)  # ok: FC107
        self.accepted_host.copy_(out, non_blocking=True)
        self.copy_done.record()

    def collect(self) -> List[int]:
        """Output thread: waits for the step's copy, then hands the tokens out."""
        self.copy_done.synchronize()
        toks = self.accepted_host.tolist() if self.accepted_host is not None else []
        for r, t in zip(self.active, toks):
            r.output.append(t)
            r.seq_len += 1
            r.last_token = t
        return toks

    def debug_state(self) -> Dict[str, torch.Tensor]:
        return self.graphs.replay_debug_dump(self.graphs.bucket_for(max(len(self.active), 1)))
