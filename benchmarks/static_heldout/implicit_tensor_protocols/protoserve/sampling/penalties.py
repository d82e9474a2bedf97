"""Per-request penalty state kept on the device, indexed by request slot."""

import torch

from protoserve.forward_batch import SamplingBatchInfo


class Penalizer:
    def __init__(self, max_reqs: int, vocab_size: int, history: int, device: torch.device):
        self.max_reqs = max_reqs
        self.vocab_size = vocab_size
        self.device = device
        self.token_counts = torch.zeros(max_reqs, vocab_size, dtype=torch.int32, device=device)
        # Last `history` sampled tokens per slot, newest at the end, -1 where empty.
        self.history = torch.full((max_reqs, history), -1, dtype=torch.int64, device=device)
        self._ngram_bias = None

    def apply_penalties(self, logits: torch.Tensor, info: SamplingBatchInfo) -> None:
        counts = self.token_counts[info.req_slots].to(logits.dtype)
        seen = counts > 0
        logits -= info.frequency_penalties[:, None] * counts
        logits -= info.presence_penalties[:, None] * seen
        rep = info.repetition_penalties[:, None]
        logits.copy_(torch.where(seen, torch.where(logits > 0, logits / rep, logits * rep), logits))
        self._check_counts()

    def _check_counts(self) -> None:
        assert (self.token_counts >= 0).all(), "token counts went negative"  # expect: FC101

    def block_stop_tokens(self, logits: torch.Tensor, info: SamplingBatchInfo) -> None:
        """Keep stop tokens out of reach until a request has produced min_new_tokens."""
        need = (info.min_new_tokens > info.output_lens)[:, None]
        stop = torch.zeros_like(logits, dtype=torch.bool)
        stop.scatter_(1, info.stop_token_ids.clamp(min=0), info.stop_token_ids >= 0)
        logits.masked_fill_(need & stop, float("-inf"))

    def apply_no_repeat_ngram(self, logits: torch.Tensor, info: SamplingBatchInfo) -> None:
        if self._ngram_bias is None:
            self._ngram_bias = torch.zeros(self.max_reqs, self.vocab_size, device=self.device)  # ok: FC107
        hist = self.history[info.req_slots]
        bs, width = hist.shape
        bias = self._ngram_bias[:bs].zero_()
        for n in range(2, info.no_repeat_ngram_sizes.max() + 1):  # expect: FC101
            if width < n:
                break
            windows = hist.unfold(1, n, 1)  # [bs, width - n + 1, n]
            tail = hist[:, width - n + 1 :]
            hit = (windows[:, :, :-1] == tail[:, None, :]).all(-1)
            hit &= (windows[:, :, -1] >= 0) & (info.no_repeat_ngram_sizes[:, None] >= n)
            bias.scatter_add_(1, windows[:, :, -1].clamp(min=0), hit.to(bias.dtype) * -1e4)
        logits += bias

    def record(self, info: SamplingBatchInfo, next_ids: torch.Tensor) -> None:
        ones = torch.ones_like(next_ids, dtype=torch.int32)
        self.token_counts.index_put_((info.req_slots, next_ids), ones, accumulate=True)
        rows = self.history[info.req_slots].roll(-1, dims=1)
        rows[:, -1] = next_ids
        self.history.index_copy_(0, info.req_slots, rows)

    def reset_slot(self, slot: int) -> None:
        self.token_counts[slot].zero_()
        self.history[slot].fill_(-1)

    def reset_rows(self, req_slots: torch.Tensor, finished: torch.Tensor) -> None:
        keep = (~finished).to(torch.int32)[:, None]
        self.token_counts.index_copy_(0, req_slots, self.token_counts[req_slots] * keep)
