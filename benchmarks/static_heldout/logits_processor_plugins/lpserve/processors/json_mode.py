"""JSON mode: a packed vocabulary bitmask per row, filled on the host from a token FSM and
applied inside the decode graph."""
from __future__ import annotations

import logging
from typing import Dict, Optional, Tuple

import numpy as np
import torch

from lpserve.processors.base import GraphLogitsProcessor
from lpserve.registry import register_processor

logger = logging.getLogger(__name__)


class TokenFSM:
    """A JSON acceptor lifted to tokens: allowed ids per state, transitions per (state, token)."""

    def __init__(self, allowed_by_state: Dict[int, np.ndarray], transitions: Dict[Tuple[int, int], int], vocab: int):
        self.allowed_by_state = allowed_by_state
        self.transitions = transitions
        self.state = 0
        self._all = np.arange(vocab, dtype=np.int64)

    def allowed(self) -> np.ndarray:
        return self.allowed_by_state.get(self.state, self._all)

    def advance(self, tok: int) -> None:
        self.state = self.transitions.get((self.state, tok), self.state)


def compile_schema(schema: str, vocab: int) -> TokenFSM:
    # the real compiler lives in the grammar service; an unknown schema accepts any token
    return TokenFSM({}, {}, vocab)


def pack_allowed(ids: np.ndarray, out: np.ndarray) -> None:
    out[:] = 0
    bits = np.left_shift(np.int64(1), ids & 31).astype(np.uint32).view(np.int32)
    np.bitwise_or.at(out, ids >> 5, bits)


class _BitmaskOps:
    """Torch fallback of the packed-bitmask kernel (the CUDA one is built on first use)."""

    def __init__(self, vocab: int, device: torch.device):
        self.vocab = vocab
        self.shifts = torch.arange(32, dtype=torch.int32, device=device)

    def apply(self, logits, bitmask, scratch, enabled):
        bs = logits.shape[0]
        bits = (bitmask.unsqueeze(-1) >> self.shifts) & 1
        allowed = bits.view(bs, -1)[:, : self.vocab].bool()
        torch.logical_and(~allowed, enabled.unsqueeze(1), out=scratch)
        return logits.masked_fill_(scratch, float("-inf"))


def load_bitmask_module(vocab: int, device: torch.device) -> _BitmaskOps:
    return _BitmaskOps(vocab, device)


@register_processor("json_mode")
class JsonModeMask(GraphLogitsProcessor):
    def __init__(self, cfg, device, attn):
        super().__init__(cfg, device, attn)
        self.vocab = cfg.vocab_size
        self.words = cfg.mask_words
        # the device mask is big (one bit per token per row): sized to the buckets only
        self.bitmask = torch.full((self.max_rows, self.words), -1, dtype=torch.int32, device=device)
        self.bitmask_cpu = torch.full((cfg.max_batch_size, self.words), -1, dtype=torch.int32, pin_memory=True)
        self.row_enabled = torch.zeros(cfg.max_batch_size, dtype=torch.bool, device=device)
        self.row_enabled_cpu = torch.zeros(cfg.max_batch_size, dtype=torch.bool, pin_memory=True)
        self.fsms: Dict[int, TokenFSM] = {}
        self._cached_module: Optional[_BitmaskOps] = None
        self._unpack: Optional[torch.Tensor] = None

    def add_request(self, rid, req):
        if req.json_schema is not None:
            self.fsms[rid] = compile_schema(req.json_schema, self.vocab)

    def release(self, rid):
        self.fsms.pop(rid, None)

    def on_tokens(self, rids, tokens):
        for rid, tok in zip(rids, tokens):
            fsm = self.fsms.get(rid)
            if fsm is not None:
                fsm.advance(tok)

    def prepare_step(self, batch):
        n = batch.num_rows
        for row, rid in enumerate(batch.rids):
            fsm = self.fsms.get(rid)
            self.row_enabled_cpu[row] = fsm is not None
            if fsm is not None:
                pack_allowed(fsm.allowed(), self.bitmask_cpu[row].numpy())
        if self.bitmask.shape[0] < n:
            self.bitmask = torch.empty(n, self.words, dtype=torch.int32, device=self.device)  # expect: FC107
        self.bitmask[:n].copy_(self.bitmask_cpu[:n], non_blocking=True)
        self.row_enabled[:n].copy_(self.row_enabled_cpu[:n], non_blocking=True)
        logger.debug("json-mode rows this step: %s", self.row_enabled[:n])  # ok: FC101

    def _kernel(self) -> _BitmaskOps:
        if self._cached_module is None:  # ok: FC103
            self._cached_module = load_bitmask_module(self.vocab, self.device)
        return self._cached_module

    def _scratch(self, bs: int) -> torch.Tensor:
        if self._unpack is None:
            self._unpack = self.attn.scratch_for_plugins(self.cfg.max_batch_size * self.vocab)
        return self._unpack[: bs * self.vocab].view(torch.bool).view(bs, self.vocab)

    def apply_graph(self, logits, bs):
        return self._kernel().apply(logits, self.bitmask[:bs], self._scratch(bs), self.row_enabled[:bs])
