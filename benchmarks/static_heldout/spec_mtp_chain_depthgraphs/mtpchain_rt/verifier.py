"""Greedy chain acceptance: the target scores ``1 + depth`` positions per request."""

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Optional

import torch

from mtpchain.config import MTPConfig
from mtpchain_rt.metadata import longest_chain

if TYPE_CHECKING:
    from mtpchain_rt.attention import ChainAttention

logger = logging.getLogger(__name__)


@dataclass
class VerifyResult:
    tokens: torch.Tensor        # [bs, depth + 1], -1 after the first rejection
    accept_lens: torch.Tensor   # [bs]
    keep_depths: int


class ChainVerifier:
    def __init__(self, cfg: MTPConfig, attn: "ChainAttention", device):
        self.cfg = cfg
        self.attn = attn
        self.device = device
        self.max_bs = cfg.max_batch_size
        self.accept_lens_buf: Optional[torch.Tensor] = None
        self.out_tokens = torch.full((cfg.max_batch_size, cfg.num_mtp_heads + 1), -1, dtype=torch.int64, device=device)

    def verify(self, draft_tokens: torch.Tensor, target_logits: torch.Tensor, bs: int) -> VerifyResult:
        if bs > self.max_bs:
            raise ValueError(f"verify batch {bs} > max {self.max_bs}; drafts={draft_tokens}")  # ok: FC101
        if self.accept_lens_buf is None:
            self.accept_lens_buf = torch.zeros(self.max_bs, dtype=torch.int64, device=self.device)  # ok: FC107
        depth = draft_tokens.shape[1]
        target_tok = torch.argmax(target_logits.view(bs, depth + 1, -1), dim=-1)
        match = (draft_tokens[:bs] == target_tok[:, :depth]).to(torch.int64)
        accept_lens = self.accept_lens_buf[:bs]
        torch.sum(torch.cumprod(match, dim=1), dim=1, out=accept_lens)
        pos = torch.arange(depth + 1, device=self.device)[None, :]
        keep = pos <= accept_lens[:, None]
        out = self.out_tokens[:bs]
        out.copy_(torch.where(keep, target_tok, torch.full_like(target_tok, -1)))  # ok: FC101
        logger.debug("accepted lengths %s", accept_lens)  # ok: FC101
        keep_depths = longest_chain(accept_lens)
        self._rollback_rejected(accept_lens, bs, depth)
        return VerifyResult(tokens=out, accept_lens=accept_lens, keep_depths=keep_depths)

    def _rollback_rejected(self, accept_lens: torch.Tensor, bs: int, depth: int) -> None:
        # Depth 0's last page held every drafted token; drop the rejected ones so the
        # next chain step's graph attends only committed tokens.
        rejected = (depth - accept_lens).to(torch.int32)
        last = self.attn.kv_last_page_len[0, :bs]
        last.sub_(rejected).clamp_(min=1)  # expect: FC104

    def commit_host_lengths(self, emitted, bs: int) -> None:
        # host mirror kept in step with the pool's numpy lengths
        rej = torch.tensor([self.cfg.num_mtp_heads + 1 - n for n in emitted], dtype=torch.int32)
        self.attn.kv_last_page_len_cpu[0, :bs] -= rej  # ok: FC104
        self.attn.kv_last_page_len_cpu[0, :bs].clamp_(min=1)
