"""Fine-tunes the draft on the target's accepted tokens: one small training step every
``train_every`` serving steps, on a side stream, teacher-forced over windows of the ring."""
import logging
from typing import TYPE_CHECKING, Optional

import flashcheck
import torch
import torch.nn.functional as F

from .buffer import AcceptedTokenBuffer

if TYPE_CHECKING:
    from dd_attn.attention import DraftAttention
    from dd_run.models import DraftLM

logger = logging.getLogger(__name__)


class DraftTrainer:
    def __init__(
        self, model: "DraftLM", attn: "DraftAttention", buffer: AcceptedTokenBuffer,
        lr: float, train_every: int, window: int,
    ):
        assert lr > 0 and train_every > 0, "bad distillation schedule"  # expect: FC109
        self.model, self.attn, self.buffer = model, attn, buffer
        self.train_every, self.window = train_every, window
        self.optim = torch.optim.AdamW(model.parameters(), lr=lr)
        self.stream = torch.cuda.Stream()
        self.updated = torch.cuda.Event()
        self.step_count = 0
        self.version = 0
        self.last_loss = float("nan")
        self._logit_scratch: Optional[torch.Tensor] = None

    @flashcheck.hot_path
    def maybe_train(self) -> bool:
        self.step_count += 1
        if self.step_count % self.train_every != 0 or not self.buffer.ready:
            return False
        self.stream.wait_stream(torch.cuda.current_stream())  # ok: FC101
        with torch.cuda.stream(self.stream):
            hidden, tokens = self.buffer.sample(self.buffer.batch_tokens)
            loss = self._train_step(hidden, tokens)
            self.updated.record(self.stream)
        logger.debug("draft loss %s", loss)  # ok: FC101
        self.last_loss = loss.item()  # expect: FC101
        # the draft's KV was written by the old weights: start its page table over
        self.attn.kv_indptr_buf.zero_()  # expect: FC104
        self.buffer.reset_count()
        self.version += 1
        return True

    def _train_step(self, hidden: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        self.model.train()
        self.attn.train_mode = True
        # fail early when the ragged workspace cannot hold this batch's split-k partials
        if self.attn.train_wrapper._float_workspace_buffer.numel() < hidden.shape[0] * hidden.shape[1] * 4:  # expect: FC103
            raise RuntimeError(f"draft train workspace too small for {hidden.shape[0]} tokens")
        self.attn.plan_train(self.window, hidden.shape[0])
        out = self.model.train_forward(hidden)
        if self._logit_scratch is None:
            self._logit_scratch = torch.empty(self.window, out.shape[-1], dtype=torch.float32, device=out.device)  # ok: FC107
        loss = torch.zeros((), dtype=torch.float32, device=tokens.device)
        for start in range(0, hidden.shape[0], self.window):
            chunk = out[start : start + self.window].float()
            self._logit_scratch[: chunk.shape[0]].copy_(chunk)
            loss = loss + F.cross_entropy(self._logit_scratch[: chunk.shape[0]], tokens[start : start + self.window], reduction="sum")
        (loss / hidden.shape[0]).backward()
        self.optim.step()
        self.optim.zero_grad(set_to_none=True)
        self.attn.train_mode = False
        self.model.eval()
        return loss.detach() / hidden.shape[0]
