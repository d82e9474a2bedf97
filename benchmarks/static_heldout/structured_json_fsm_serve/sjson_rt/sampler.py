"""Grammar-constrained sampling: host-compiled bitmasks unpacked on the device."""
from typing import Optional, Sequence

import numpy as np
import torch

from sjson.config import ServerConfig
from sjson.grammar.fsm import GrammarMatcher


class GrammarSampler:
    def __init__(self, cfg: ServerConfig, device: torch.device):
        self.device = device
        self.vocab_size = cfg.vocab_size
        self.mask_words = cfg.mask_words
        self.eos_id = cfg.eos_token_id
        self.bitmask_np = np.full((cfg.max_batch_size, cfg.mask_words), -1, dtype=np.int32)
        self.suppress_eos_np = np.zeros(cfg.max_batch_size, dtype=bool)
        self.token_bitmask = torch.full((cfg.max_batch_size, cfg.mask_words), -1, dtype=torch.int32, device=device)
        self.bit_shifts = torch.arange(32, dtype=torch.int32, device=device)
        self.eos_onehot: Optional[torch.Tensor] = None

    def sample(self, logits: torch.Tensor, matchers: Sequence[Optional[GrammarMatcher]], min_tokens_left: Sequence[int]) -> torch.Tensor:
        bs = logits.shape[0]
        self.token_bitmask = torch.full((bs, self.mask_words), -1, dtype=torch.int32, device=self.device)  # expect: FC107
        for row, matcher in enumerate(matchers):
            if matcher is None:
                self.bitmask_np[row, :] = -1
            else:
                matcher.fill_bitmask(self.bitmask_np, row)
            self.suppress_eos_np[row] = min_tokens_left[row] > 0
        self.token_bitmask.copy_(torch.from_numpy(self.bitmask_np[:bs]), non_blocking=True)
        bits = (self.token_bitmask.unsqueeze(-1) >> self.bit_shifts) & 1
        allowed = bits.flatten(1)[:, : self.vocab_size].bool()
        masked = logits.masked_fill(~allowed, float("-inf"))
        dead_rows = torch.nonzero(~allowed.any(dim=-1)).flatten()  # expect: FC101
        if dead_rows.numel() > 0:
            # the automaton reached a dead end: fall back to the unconstrained distribution for those rows
            masked[dead_rows] = logits[dead_rows]
        if self.eos_onehot is None:
            self.eos_onehot = torch.zeros(self.vocab_size, dtype=torch.bool, device=self.device)  # ok: FC107
            self.eos_onehot[self.eos_id] = True
        suppress = torch.from_numpy(self.suppress_eos_np[:bs]).to(self.device, non_blocking=True)
        masked = masked.masked_fill(suppress[:, None] & self.eos_onehot[None, :], float("-inf"))
        return torch.argmax(masked, dim=-1)
