"""Jump-forward decoding: when the grammar admits a single continuation (a key literal, `", "`, a closing brace), the
tokens are appended without sampling and prefilled as an extend batch on the next step."""
import logging
from typing import TYPE_CHECKING, List, Sequence

import torch

if TYPE_CHECKING:
    from sjson_rt.attention import StructuredAttention
    from sjson_rt.server import Request

logger = logging.getLogger(__name__)


class JumpForwardDecoder:
    def __init__(self, attn: "StructuredAttention", max_jump: int, device: torch.device):
        self.attn = attn
        self.max_jump = max_jump
        self.device = device
        # forced tokens on the device, scattered into the output ids by the detokenizer stream
        self.forced_dev = torch.zeros(attn.cfg.max_batch_size, max_jump, dtype=torch.int64, device=device)

    def collect(self, reqs: Sequence["Request"]) -> List[List[int]]:
        return [req.matcher.forced_run() for req in reqs]

    def apply(self, reqs: Sequence["Request"], runs: List[List[int]]) -> int:
        longest = max((len(run) for run in runs), default=0)
        if longest == 0:
            return 0
        if longest > self.forced_dev.shape[1]:
            self.forced_dev = torch.zeros(self.forced_dev.shape[0], longest, dtype=torch.int64, device=self.device)  # expect: FC107
        bs = len(runs)
        padded = [run + [0] * (longest - len(run)) for run in runs]
        self.forced_dev[:bs, :longest].copy_(torch.tensor(padded, dtype=torch.int64), non_blocking=True)
        n_forced = torch.tensor([len(run) for run in runs], dtype=torch.int32).to(self.device, non_blocking=True)
        logger.debug("jump-forward appended %s tokens", n_forced)  # ok: FC101
        # keep the decode graph's last-page lengths in step with the appended tokens
        self.attn.kv_last_page_len[:bs].add_(n_forced)  # expect: FC104
        for req, run in zip(reqs, runs):
            for tok in run:
                req.matcher.advance(tok)
            req.output_ids.extend(run)
            req.pending_extend += len(run)
        return longest
