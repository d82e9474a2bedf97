"""One decode CUDA graph per batch bucket; a verify graph for steps where every request has a full draft."""
import numpy as np
import torch

from pldserve.attn.fi_state import DECODE_BUCKETS, PLDFlashInferState
from pldserve.model import PLDModel


class BucketGraph:
    def __init__(self, model: PLDModel, attn: PLDFlashInferState, device):
        self.model = model
        self.attn = attn
        self.buckets = DECODE_BUCKETS
        max_bs = max(DECODE_BUCKETS)
        k = attn.cfg.num_draft_tokens
        self.input_ids = torch.zeros(max_bs * (k + 1), dtype=torch.int64, device=device)
        self.positions = torch.zeros(max_bs * (k + 1), dtype=torch.int64, device=device)
        self.max_positions = attn.cfg.max_seq_len
        self.graphs = {}
        self.outputs = {}
        self.verify_graphs = {}
        self.mempool = None

    def bucket_for(self, bs: int) -> int:
        return next(b for b in self.buckets if b >= bs)

    def record(self, bs: int):
        w = self.attn.decode_wrappers[bs]
        tables = [np.zeros(1, dtype=np.int32) for _ in range(bs)]
        self.attn.plan_decode_bucket(bs, bs, tables, np.ones(bs, dtype=np.int32))
        if getattr(w, "_cached_module", None) is None:  # expect: FC103
            raise RuntimeError("decode kernels were not JIT-compiled before capture")
        self.model.forward_decode(self.input_ids[:bs], self.positions[:bs], bs)  # warm-up outside the graph
        torch.cuda.synchronize()  # ok: FC101
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, pool=self.mempool):
            self.outputs[bs] = self.model.forward_decode(self.input_ids[:bs], self.positions[:bs], bs)
        self.mempool = g.pool()
        self.graphs[bs] = g

    def record_verify(self, bs: int):
        n = bs * (self.attn.cfg.num_draft_tokens + 1)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, pool=self.mempool):
            out = self.model.forward_verify(self.input_ids[:n], self.positions[:n])
        self.verify_graphs[bs] = (g, out)

    def replay(self, bs: int, input_ids, positions, slot_tables, seq_lens_cpu: np.ndarray):
        padded = self.bucket_for(bs)
        self.input_ids[:bs].copy_(input_ids, non_blocking=True)
        self.positions[:bs].copy_(positions, non_blocking=True)
        if (self.positions[:bs] >= self.max_positions).any():  # expect: FC101
            raise RuntimeError("position beyond the model's context")
        if int(seq_lens_cpu[:bs].max()) > self.max_positions:  # ok: FC101
            raise RuntimeError("sequence beyond the model's context")
        self.attn.plan_decode_bucket(bs, padded, slot_tables, seq_lens_cpu)
        self.attn.kv_last_page_len[bs:padded].fill_(1)  # expect: FC104
        self.graphs[padded].replay()
        return self.outputs[padded][:bs]
