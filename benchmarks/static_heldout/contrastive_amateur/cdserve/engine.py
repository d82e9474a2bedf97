import torch

from cdserve.attention.backend import PairedDecodeBackend
from cdserve.batch import DecodeBatch, DecodeRequest
from cdserve.config import CDConfig
from cdserve.graph_runner import PairGraphRunner
from cdserve.scoring import ContrastiveScorer


class ContrastiveEngine:
    def __init__(self, cfg: CDConfig, expert, amateur, device="cuda"):
        self.cfg = cfg
        self.device = device
        self.backend = PairedDecodeBackend(cfg, device)
        self.backend.init_graph_buffers()
        self.scorer = ContrastiveScorer(cfg, cfg.alpha)
        self.runner = PairGraphRunner(self.backend, expert, amateur, self.scorer, device)
        self.expert = expert
        self.amateur = amateur
        self.requests = {}
        self._free = list(range(cfg.max_pages))
        self._free_count = cfg.max_pages
        self.sampled = None

    def _take_pages(self, count):
        pages = self._free[:count]
        del self._free[:count]
        self._free_count -= len(pages)
        assert self._free_count >= 0  # ok: FC109
        return pages

    def add_request(self, rid, prompt_ids, max_new_tokens):
        assert len(prompt_ids) > 0  # expect: FC109
        pages = self._take_pages((len(prompt_ids) + self.cfg.page_size - 1) // self.cfg.page_size)
        self.requests[rid] = DecodeRequest(rid, pages, len(prompt_ids), prompt_ids[-1])
        return rid

    def _release_finished(self, finished, batch: DecodeBatch):
        for row in finished:
            start = int(batch.kv_indptr_cpu[row])
            end = int(batch.kv_indptr_cpu[row + 1])
            self.backend.kv_indices[start:end].zero_()  # expect: FC104

    def step(self):
        reqs = list(self.requests.values())
        batch = DecodeBatch.from_requests(reqs, self.cfg.page_size, self.device)
        bs = batch.size
        if self.sampled is None:
            self.sampled = torch.zeros(self.cfg.max_batch, dtype=torch.long, device=self.device)  # ok: FC107
        if bs in self.runner.graphs:
            next_tokens = self.runner.replay(batch)
        else:
            self.backend.plan_eager(batch)
            q_e, kv_e = self.expert.embed_decode(batch.token_ids, batch.seq_lens)
            q_a, kv_a = self.amateur.embed_decode(batch.token_ids, batch.seq_lens)
            next_tokens = self.scorer.combine(
                self.expert.head(self.backend.forward_expert(q_e, kv_e, bs)),
                self.amateur.head(self.backend.forward_amateur(q_a, kv_a, bs)),
                batch,
            )
        self.sampled[:bs].copy_(next_tokens)
        tokens = self.sampled[:bs].tolist()  # expect: FC101
        lens = batch.seq_lens_cpu.tolist()  # ok: FC101
        finished = [i for i, (t, n) in enumerate(zip(tokens, lens)) if t == 2 or n + 1 >= self.cfg.max_context]
        self._release_finished(finished, batch)
        for req, tok in zip(reqs, tokens):
            req.last_token = tok
            req.context_len += 1
        return tokens
