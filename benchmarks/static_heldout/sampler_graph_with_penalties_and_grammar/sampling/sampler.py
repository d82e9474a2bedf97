"""Graph-captured sampling for plain requests; an eager path for requests that want logprobs."""
from __future__ import annotations

from typing import List, Optional, Tuple

import torch
from flashinfer.sampling import top_k_top_p_sampling_from_logits, top_p_sampling_from_probs

from sampling.grammar import GrammarBitmaskStager, apply_bitmask
from sampling.history import TokenHistory
from sampling.params import SamplingBatch
from sampling.penalties import apply_penalties


class GraphSampler:
    """Static buffers for the largest bucket; ``prepare`` fills them before every replay."""

    def __init__(self, vocab: int, max_bs: int, pad_slot: int, history: TokenHistory,
                 grammar: GrammarBitmaskStager, device: torch.device):
        self.vocab = vocab
        self.max_bs = max_bs
        self.pad_slot = pad_slot
        self.history = history
        self.grammar = grammar
        self.device = device
        f32 = dict(dtype=torch.float32, device=device)
        self.static_logits_bias = torch.zeros(max_bs, vocab, **f32)
        self.static_bitmask = torch.full((max_bs, grammar.words), -1, dtype=torch.int32, device=device)
        self.static_temperature = torch.ones(max_bs, **f32)
        self.static_top_k = torch.full((max_bs,), vocab, dtype=torch.int32, device=device)
        self.static_top_p = torch.ones(max_bs, **f32)
        self.static_rep = torch.ones(max_bs, **f32)
        self.static_presence = torch.zeros(max_bs, **f32)
        self.static_freq = torch.zeros(max_bs, **f32)
        self.static_slots = torch.full((max_bs,), pad_slot, dtype=torch.int64, device=device)

    def sample_body(self, logits: torch.Tensor, bs: int) -> torch.Tensor:
        """Captured with the model's decode step: every op is static-shape and sync-free."""
        x = logits.float() + self.static_logits_bias[:bs]
        counts = self.history.gather(self.static_slots[:bs])
        x = apply_penalties(x, counts, self.static_rep[:bs], self.static_presence[:bs], self.static_freq[:bs])
        x = apply_bitmask(x, self.static_bitmask[:bs])
        x = x / self.static_temperature[:bs, None]
        tokens = top_k_top_p_sampling_from_logits(x, self.static_top_k[:bs], self.static_top_p[:bs], deterministic=True)
        self.history.record(self.static_slots[:bs], tokens)
        return tokens

    def prepare(self, sb: SamplingBatch, bs: int) -> None:
        n = sb.size
        self.static_slots[:n].copy_(sb.slots)
        self.static_slots[n:bs].fill_(self.pad_slot)
        self.static_temperature[:n].copy_(sb.temperature)
        self.static_top_k[:n].copy_(sb.top_k)
        self.static_top_p[:n].copy_(sb.top_p)
        if sb.any_penalty_host:  # ok: FC101
            self.static_rep[:n].copy_(sb.rep_penalty)
            self.static_presence[:n].copy_(sb.presence_penalty)
            self.static_freq[:n].copy_(sb.frequency_penalty)
        else:
            self.static_rep[:n].fill_(1.0)
            self.static_presence[:n].zero_()
            self.static_freq[:n].zero_()
        if sb.logit_bias is not None:
            self.static_logits_bias[:n].copy_(sb.logit_bias)
        else:
            self.static_logits_bias = torch.zeros(self.max_bs, self.vocab, dtype=torch.float32, device=self.device)  # expect: FC107
        if self.grammar.fill(sb.req_ids):
            self.static_bitmask[:n].copy_(self.grammar.bitmask_host[:n], non_blocking=True)  # ok: FC104
        else:
            self.static_bitmask[:n].fill_(-1)


class EagerSampler:
    def __init__(self, vocab: int, max_bs: int, history: TokenHistory, grammar: GrammarBitmaskStager,
                 device: torch.device):
        self.vocab = vocab
        self.max_bs = max_bs
        self.history = history
        self.grammar = grammar
        self.device = device
        self.seen_mask: Optional[torch.Tensor] = None

    def _penalize(self, x: torch.Tensor, sb: SamplingBatch) -> torch.Tensor:
        counts = self.history.gather(sb.slots)
        if self.seen_mask is None:
            self.seen_mask = torch.zeros(self.max_bs, self.vocab, dtype=torch.bool, device=self.device)  # ok: FC107
        seen = torch.gt(counts, 0, out=self.seen_mask[: sb.size])
        scaled = torch.where(x > 0, x / sb.rep_penalty[:, None], x * sb.rep_penalty[:, None])
        x = torch.where(seen, scaled, x)
        return x - sb.frequency_penalty[:, None] * counts - sb.presence_penalty[:, None] * seen

    def sample(self, logits: torch.Tensor, sb: SamplingBatch) -> Tuple[torch.Tensor, torch.Tensor]:
        x = logits.float()
        if sb.logit_bias is not None:
            x = x + sb.logit_bias
        if sb.needs_penalties:
            x = self._penalize(x, sb)
        if self.grammar.fill(sb.req_ids):
            x = apply_bitmask(x, self.grammar.bitmask_host[: sb.size].to(self.device, non_blocking=True))
        x = x / sb.temperature[:, None]
        max_k = int(sb.top_k_np.max())  # ok: FC101
        if max_k < self.vocab:
            tokens = top_k_top_p_sampling_from_logits(x, sb.top_k, sb.top_p)
        else:
            tokens = top_p_sampling_from_probs(torch.softmax(x, dim=-1), sb.top_p)
        self.history.record(sb.slots, tokens)
        return tokens, x

    def sample_with_logprobs(self, logits: torch.Tensor, sb: SamplingBatch) -> Tuple[torch.Tensor, List[list]]:
        tokens, x = self.sample(logits, sb)
        logprobs = torch.log_softmax(x, dim=-1)
        top = logprobs.topk(sb.max_logprobs, dim=-1)
        chosen = logprobs.gather(-1, tokens[:, None].long())
        # one transfer for the chosen logprob, the top values and their ids
        packed = torch.cat([chosen, top.values, top.indices.float()], dim=-1).tolist()  # expect: FC101
        return tokens, packed
