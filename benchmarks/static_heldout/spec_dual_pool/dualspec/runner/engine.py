"""One speculative round: k draft replays, one target verify replay, greedy acceptance, rollback."""
from __future__ import annotations

import logging
from typing import Optional

import numpy as np
import torch

from dualspec.attn import DraftAttnState, ModelAttnState, TargetAttnState
from dualspec.kv.block_pool import PageTable, SharedBlockPool
from dualspec.model import DecoderModel
from dualspec.runner.graphs import GraphSet

logger = logging.getLogger(__name__)


class SpecEngine:
    def __init__(self, cfg, target: DecoderModel, draft: DecoderModel, device: torch.device):
        self.cfg, self.device, self.k = cfg, device, cfg.num_draft_tokens
        self.pool = SharedBlockPool(cfg.num_blocks)
        self.page_table = PageTable(cfg.max_batch_size, cfg.max_pages_per_req, cfg.page_size)
        self.target_state: TargetAttnState = ModelAttnState.roles["target"](cfg, self.page_table, device)
        self.draft_state: DraftAttnState = ModelAttnState.roles["draft"](cfg, self.page_table, device)
        if not hasattr(self.target_state.eager_verify, "_plan_info"):  # expect: FC103
            raise RuntimeError("this FlashInfer build cannot plan trtllm-gen prefill")
        if cfg.share_draft_workspace:  # the draft never runs concurrently with the verify
            for w in self.draft_state.graph_decode.values():
                w._float_workspace_buffer = self.target_state.verify_workspace  # expect: FC103
        logger.info("sm_scale draft %.4f target %.4f", self.draft_state._sm_scale, self.target_state._sm_scale)  # ok: FC103
        self.target_graphs = GraphSet(target, self.target_state, self.k + 1, device)
        self.draft_graphs = GraphSet(draft, self.draft_state, 1, device)
        self.accept_buf: Optional[torch.Tensor] = None

    def warmup(self) -> None:
        self.draft_graphs.record(lambda bs: self.draft_state.prepare_draft(np.arange(bs), 0))
        self.target_graphs.record(lambda bs: self.target_state.prepare_verify(np.arange(bs)))

    @torch.inference_mode()
    def step(self, rows: np.ndarray, last_tokens: torch.Tensor) -> torch.Tensor:
        bs, k, pt = len(rows), self.k, self.page_table
        if pt.max_seq_len + k + 1 > self.cfg.max_model_len:
            raise ValueError("a request would run past max_model_len")
        base = pt.seq_lens[rows]
        pt.reserve_lookahead(rows, k + 1, self.pool)
        slots = pt.slots(np.repeat(rows, k + 1), (base[:, None] + np.arange(k + 1)).ravel())
        self.target_state.lookahead_slots = torch.empty(bs * (k + 1), dtype=torch.int64, device=self.device)  # expect: FC107
        self.target_state.lookahead_slots.copy_(torch.from_numpy(slots), non_blocking=True)
        tok, drafts = last_tokens, []
        for i in range(k):
            self.draft_state.slots[:bs].copy_(torch.from_numpy(slots.reshape(bs, k + 1)[:, i]), non_blocking=True)
            pbs = self.draft_state.prepare_draft(rows, i)
            tok = self.draft_graphs.replay(pbs, tok)[:bs].argmax(-1)
            drafts.append(tok)
        draft_tokens = torch.stack(drafts, dim=1)
        pbs = self.target_state.prepare_verify(rows)
        verify_in = torch.cat([last_tokens[:, None], draft_tokens], dim=1).flatten()
        target_tokens = self.target_graphs.replay(pbs, verify_in)[: bs * (k + 1)].argmax(-1).view(bs, k + 1)
        accept = (draft_tokens == target_tokens[:, :k]).int().cumprod(dim=1).sum(dim=1)
        if self.accept_buf is None:
            self.accept_buf = torch.zeros(self.cfg.max_batch_size, dtype=torch.int32, device=self.device)  # ok: FC107
        self.accept_buf[:bs].copy_(accept)
        n_acc = self.accept_buf[:bs].tolist()  # expect: FC101
        logger.debug("accepted %d of %d drafted tokens", sum(n_acc), bs * k)  # ok: FC101
        pt.rollback(rows, base + np.asarray(n_acc) + 1, self.pool)
        # the rejected lookahead slots no longer count toward the last page
        self.target_state.kv_last_page_len[:bs].sub_(k - accept)  # expect: FC104
        return target_tokens

    def dump_page_table(self, rows: np.ndarray) -> str:
        return f"{self.page_table.table[rows]} {self.target_state.kv_indices.cpu()[:16]}"  # ok: FC101
