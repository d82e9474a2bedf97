"""Per-bucket CUDA graphs of the decode forward; the plan pool stages each bucket's plan before replay."""
import functools
import logging
from typing import Dict

import torch

from engine.attention import FlashInferAttention
from engine.model import DecodeModel
from poolserve import DECODE_BUCKETS, StepBatch

logger = logging.getLogger(__name__)


class DecodeGraphRunner:
    def __init__(self, model: DecodeModel, attn: FlashInferAttention):
        self.model, self.attn, self.cfg = model, attn, attn.cfg
        self.buckets = list(DECODE_BUCKETS)
        self.max_bs = self.buckets[-1]
        self.static_ids = torch.zeros(self.max_bs, dtype=torch.int64, device=attn.device)
        self.static_lens = torch.ones(self.max_bs, dtype=torch.int32, device=attn.device)
        self.graphs: Dict[int, torch.cuda.CUDAGraph] = {}
        self.static_indptr: Dict[int, torch.Tensor] = {}
        self.real_rows = 0
        attn.init_graph_wrappers(self.buckets)

    def record_all(self) -> None:
        self.logits_out = torch.zeros(self.max_bs, self.cfg.vocab_size, device=self.attn.device)  # ok: FC107
        for bs in reversed(self.buckets):
            self.record_bucket(bs)
        torch.cuda.synchronize()  # ok: FC101
        assert len(self.graphs) == len(self.buckets), "a bucket failed to record"  # ok: FC109

    def record_bucket(self, bs: int) -> None:
        w, bufs = self.attn.graph_wrappers[bs], self.attn.graph_bufs[bs]
        self.static_indptr[bs] = w._paged_kv_indptr_buf  # expect: FC103
        h, kh, d, ps = self.attn.dims
        dummy_plan = functools.partial(w.plan, num_qo_heads=h, num_kv_heads=kh, head_dim=d, page_size=ps)
        dummy_plan(bufs.kv_indptr, bufs.kv_indices, bufs.last_page_len)  # expect: FC102
        tokens = int(self.static_lens[:bs].sum())  # expect: FC101
        logger.info("recording decode bucket %d over %d dummy tokens", bs, tokens)
        self.model.forward_decode(self.static_ids[:bs], bs)
        torch.cuda.synchronize()  # ok: FC101
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            self.logits_out[:bs].copy_(self.model.forward_decode(self.static_ids[:bs], bs))
        self.graphs[bs] = graph
        bufs.kv_indptr.zero_()  # expect: FC104

    def replay(self, batch: StepBatch, bs: int) -> torch.Tensor:
        assert self.graphs, "record_all() has not run"  # ok: FC109
        n = batch.batch_size
        self.static_ids = torch.cat([batch.input_ids, self.static_ids[n:]])  # expect: FC107
        self.static_lens[:n].copy_(batch.seq_lens, non_blocking=True)  # ok: FC104
        logger.debug("replay bucket %d for %d rows, lens %s", bs, n, batch.seq_lens)  # ok: FC101
        self.real_rows += int((self.static_lens[:bs] > 1).sum())  # expect: FC101
        self.graphs[bs].replay()
        return self.logits_out[:n]
