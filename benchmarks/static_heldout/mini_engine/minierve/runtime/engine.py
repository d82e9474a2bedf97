import logging

import torch

from flashcheck import hot_path
from minierve.attention.paged import PagedDecodeBackend
from minierve.moe.router import TopKRouter

log = logging.getLogger("minierve")


def gather_lens(lens_table, slots):
    return lens_table[slots]


class Engine:
    def __init__(self, cfg, model, device="cuda"):
        self.cfg = cfg
        self.model = model
        self.device = device
        self.max_bs = 32
        self.backend = PagedDecodeBackend(cfg, device)
        self.router = TopKRouter(cfg.num_experts, cfg.top_k, device)
        self.router.allocate()
        self.lens_table = torch.zeros(cfg.max_slots, dtype=torch.int32, device=device)
        with torch.device(device):
            self.temperature = torch.full((), cfg.temperature)
            self.prev_logits = torch.zeros(self.max_bs, cfg.vocab_size)
        self.graphs = {}
        self.warmup()

    def warmup(self):
        x = torch.randn(4, self.cfg.hidden_size, device=self.device)
        torch.cuda.synchronize()  # ok: FC101
        log.info("warmup norm %.3f", x.norm().item())  # ok: FC101

    def capture_all(self, q, kv):
        for bs in self.backend.buckets:
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g):
                self.backend.decode_graph(bs, q[:bs], kv)
                self.backend.decode_eager(bs, q[:bs], kv)
            self.graphs[bs] = g

    @hot_path
    def step(self, batch, q, kv):
        n = len(batch.slots)
        assert n <= self.max_bs, f"batch of {n} exceeds {self.max_bs}"  # expect: FC109
        bs = next(b for b in self.backend.buckets if b >= n)
        lens = gather_lens(self.lens_table, batch.slots)
        lens_list = lens.tolist()  # expect: FC101
        self.backend.plan_decode(bs, torch.tensor(batch.lens_host, dtype=torch.int32))
        self.graphs[bs].replay()
        self.backend.advance(lens)
        logits = self.model.logits(q[:n])
        if torch.allclose(logits, self.prev_logits[:n]):  # expect: FC101
            log.warning("logits unchanged")
        probs = torch.softmax(logits / float(self.temperature), -1)  # expect: FC101
        log.debug("step bs=%d lens=%s", n, batch.lens_host)  # ok: FC101
        return probs, lens_list
