import torch

from evalserve.engine.attention import EvalAttention
from evalserve.engine.runner import EvalModel
from evalserve.requests import EvalLimits, ScoreBatch, build_score_batch


class LoglikScorer:
    def __init__(self, limits: EvalLimits, model: EvalModel, attn: EvalAttention, kv_caches, device="cuda"):
        self.limits = limits
        self.model = model
        self.attn = attn
        self.kv_caches = kv_caches
        self.device = device
        self.sum_buf = None
        self.sum_cpu = torch.zeros(limits.max_reqs, dtype=torch.float32, pin_memory=True)
        self.row_ids = torch.arange(limits.max_reqs, device=device)
        self.done_event = torch.cuda.Event()
        self.pending = []
        self._pending_tokens = 0

    def submit(self, context_ids, continuation_ids):
        assert len(continuation_ids) > 0  # expect: FC109
        self.pending.append((list(context_ids), list(continuation_ids)))
        self._pending_tokens += len(context_ids) + len(continuation_ids)

    def _drain(self):
        assert self._pending_tokens <= self.limits.max_tokens  # ok: FC109
        contexts = [c for c, _ in self.pending]
        conts = [c for _, c in self.pending]
        self.pending = []
        self._pending_tokens = 0
        return build_score_batch(contexts, conts, self.device)

    def score_batch(self, batch: ScoreBatch):
        n = batch.num_reqs
        if self.sum_buf is None:
            self.sum_buf = torch.zeros(self.limits.max_reqs, dtype=torch.float32, device=self.device)  # ok: FC107
        self.attn.kv_indices[: batch.page_ids.shape[0]].copy_(batch.page_ids)  # expect: FC104
        self.attn.plan_ragged(batch)
        logits = self.model.score(batch.input_ids)
        logp = torch.log_softmax(logits.float(), dim=-1)
        valid_targets = batch.target_ids[batch.target_ids >= 0]  # expect: FC101
        spans = batch.cont_spans_cpu.tolist()  # ok: FC101
        rows = torch.repeat_interleave(self.row_ids[:n], batch.cont_lens, output_size=batch.num_cont_tokens)  # ok: FC101
        tok_lp = logp[torch.cat([torch.arange(s, e, device=self.device) for s, e in spans])]
        tok_lp = tok_lp.gather(-1, valid_targets.unsqueeze(-1)).squeeze(-1)
        self.sum_buf[:n].zero_()
        self.sum_buf.index_add_(0, rows, tok_lp)
        self.sum_cpu[:n].copy_(self.sum_buf[:n], non_blocking=True)  # ok: FC101
        self.done_event.record()
        totals = self.sum_buf[:n].tolist()  # expect: FC101
        return totals

    def collect(self, n: int):
        self.done_event.synchronize()
        return self.sum_cpu[:n].tolist()
