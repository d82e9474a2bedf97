"""The tick loop: every ~50 ms of game time every talking NPC emits one token."""
from __future__ import annotations

import logging
from typing import Dict, List, Optional

import numpy as np
import torch

import flashcheck
from npcserve.attention.backend import NPCAttnBackend
from npcserve.config import NPCServerConfig
from npcserve.graphs import NPCGraphRunner
from npcserve.model import NPCDialogueModel
from npcserve.scheduler import TickScheduler
from npcserve.sessions.persona import PersonaPinner
from npcserve.sessions.table import SessionTable

logger = logging.getLogger(__name__)


class NPCEngine:
    def __init__(self, cfg: NPCServerConfig, device: str = "cuda"):
        self.cfg = cfg
        self.device = torch.device(device)
        self.table = SessionTable(cfg, self.device)
        self.personas = PersonaPinner(self.table)
        self.backend = NPCAttnBackend(cfg, self.table, self.device)
        self.backend.allocate_kv_cache()
        self.model = NPCDialogueModel(cfg, self.backend).to(self.device)
        self.graphs = NPCGraphRunner(cfg, self.model, self.backend)
        self.scheduler = TickScheduler(cfg, self.table, self.device)
        self.pending_lines: Dict[int, List[int]] = {}
        self.emote_logits: Optional[torch.Tensor] = None
        self.tick_no = 0

    def start(self) -> None:
        self.backend.warmup_greeting_kernel()
        self.graphs.capture_all()

    # --------------------------------------------------------------- sessions
    def open(self, session_id: int, npc_id: int, persona_ids: List[int]) -> None:
        if not self.personas.has(npc_id):
            self.personas.reserve(npc_id, len(persona_ids))
            self.pending_lines[session_id] = list(persona_ids)
        pages = self.personas.pin(npc_id)
        self.table.open_session(session_id, npc_id, pages, self.personas.lengths[npc_id])

    def close(self, session_id: int) -> None:
        slot = self.table.slots.get(session_id)
        if slot is not None:
            self.personas.unpin(slot.npc_id)
            self.table.close_session(session_id)

    def submit_line(self, session_id: int, token_ids: List[int]) -> None:
        assert len(token_ids) <= self.cfg.max_line_tokens  # expect: FC109
        self.pending_lines.setdefault(session_id, []).extend(token_ids)

    # ------------------------------------------------------------------- tick
    @flashcheck.hot_path
    def tick(self) -> Dict[int, int]:
        self.tick_no += 1
        new_lines = self.scheduler.take_new_lines(self.pending_lines)
        if new_lines:
            self.backend.prefill_new_sessions(new_lines, self.model)
        batch = self.scheduler.next_batch()
        if batch is None:
            return {}
        logger.debug("tick %d seq_lens %s", self.tick_no, batch.seq_lens_device)  # ok: FC101
        logits, emotes = self.graphs.run(batch)
        next_tokens = torch.argmax(logits, dim=-1)
        if self.emote_logits is None:
            self.emote_logits = torch.zeros(self.cfg.max_active, self.cfg.num_emotes, device=self.device)  # ok: FC107
        self.emote_logits[: batch.size].mul_(0.9).add_(emotes.float(), alpha=0.1)
        if self.scheduler.same_rows_as_last_tick and batch.size <= self.cfg.graph_max_bs:
            # same speakers as last tick: bump the bound last-page lengths on the device, skip re-staging
            self.backend.kv_last_page_len[: batch.size].remainder_(self.cfg.page_size).add_(1)  # expect: FC104
        tokens = next_tokens.tolist()  # expect: FC101
        self.scheduler.last_tokens_np[batch.rows] = tokens
        self.table.advance(batch.rows, 1)
        self._compact_if_fragmented()
        return dict(zip(batch.session_ids, tokens))

    def _compact_if_fragmented(self) -> None:
        if self.tick_no % 256:
            return
        moves = self.table.compact()
        if moves is None:
            return
        remap = torch.arange(self.cfg.num_pages, dtype=torch.int32, device=self.device)
        remap[torch.from_numpy(moves.old).to(self.device)] = torch.from_numpy(moves.new).to(self.device)
        n = self.backend.pages_in_flight
        self.backend.kv_indices[:n] = remap[self.backend.kv_indices[:n].long()]  # expect: FC104
        for layer_cache in self.backend.kv_cache:
            layer_cache[torch.from_numpy(moves.new).to(self.device).long()] = layer_cache[
                torch.from_numpy(moves.old).to(self.device)]
