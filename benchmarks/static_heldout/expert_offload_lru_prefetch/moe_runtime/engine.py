import collections
from dataclasses import dataclass, field
from typing import List

import numpy as np
import torch

from moe_runtime.attention import OffloadAttention
from moe_runtime.batch import ForwardBatch
from moe_runtime.expert_cache import ExpertCache
from moe_runtime.graphs import DecodeGraphRunner
from moe_runtime.model import OffloadModel
from moe_runtime.prefetch import ExpertPrefetcher
from moeoffload.config import OffloadConfig
from moeoffload.host_store import HostExpertStore


@dataclass
class Request:
    rid: str
    token_ids: List[int]
    row: int
    num_cached: int = 0
    max_new_tokens: int = 256
    output_ids: List[int] = field(default_factory=list)


class OffloadEngine:
    def __init__(self, cfg: OffloadConfig, device="cuda"):
        self.cfg = cfg
        self.device = torch.device(device)
        self.store = HostExpertStore(cfg)
        self.cache = ExpertCache(cfg, self.store, self.device)
        self.prefetcher = ExpertPrefetcher(cfg, self.cache, self.device)
        kv_cache = torch.zeros(
            (cfg.num_layers, cfg.max_pages, 2, cfg.page_size, cfg.num_kv_heads, cfg.head_dim),
            dtype=torch.bfloat16,
            device=self.device,
        )
        self.attn = OffloadAttention(cfg, kv_cache, self.device)
        self.model = OffloadModel(cfg, self.attn, self.cache, self.prefetcher).to(self.device)
        self.graphs = DecodeGraphRunner(self.model, self.attn, cfg, self.device)
        self.page_table_np = np.zeros((cfg.max_batch, cfg.max_seq_len // cfg.page_size), dtype=np.int32)
        self.running: List[Request] = []
        self.out_pinned = torch.zeros(cfg.max_batch, dtype=torch.int64, pin_memory=True)
        self.out_ready = torch.cuda.Event()
        self.pending_outputs = collections.deque()

    def warmup(self):
        if not self.attn.jit_ready():
            self.attn.prefill_wrapper.plan(
                torch.tensor([0, 1], dtype=torch.int32),
                torch.tensor([0, 1], dtype=torch.int32),
                torch.zeros(1, dtype=torch.int32, device=self.device),
                torch.ones(1, dtype=torch.int32),
                self.cfg.num_qo_heads,
                self.cfg.num_kv_heads,
                self.cfg.head_dim,
                self.cfg.page_size,
            )
        self.graphs.capture()

    def step(self):
        reqs = self.running[: self.cfg.max_batch]
        if not reqs:
            return 0
        bs = len(reqs)
        fb = self._build_batch(reqs)
        if fb.use_graph:
            logits = self.graphs.replay(fb)
        else:
            self.attn.init_forward_metadata(fb)
            logits = self.model(fb.input_ids, fb.positions, fb)
            last = (fb.qo_indptr_cpu[1:] - 1).to(self.device, non_blocking=True)
            logits = logits[last]
        next_ids = torch.argmax(logits, dim=-1)
        if fb.use_graph:
            # padded rows of the bucket must look like one-token sequences on the next replay
            self.attn.kv_last_page_len[bs : fb.bucket].fill_(1)  # expect: FC104
        self.out_pinned[:bs].copy_(next_ids, non_blocking=True)
        self.out_ready.record()
        self.pending_outputs.append([r.rid for r in reqs])
        return bs

    def drain_outputs(self):
        """Output thread: wait for the last step's ids and hand them to the streams."""
        if not self.pending_outputs:
            return {}
        rids = self.pending_outputs.popleft()
        self.out_ready.synchronize()
        ids = self.out_pinned[: len(rids)].tolist()
        return dict(zip(rids, ids))

    def stats(self):
        return self.cache.residency_report()

    def _build_batch(self, reqs):
        cfg = self.cfg
        page = cfg.page_size
        bs = len(reqs)
        seq_lens_np = np.array([len(r.token_ids) for r in reqs], dtype=np.int32)
        q_lens_np = np.array([len(r.token_ids) - r.num_cached for r in reqs], dtype=np.int32)
        is_decode = bool((q_lens_np == 1).all())
        pages_np = (seq_lens_np + page - 1) // page
        qo_indptr_np = np.zeros(bs + 1, dtype=np.int32)
        np.cumsum(q_lens_np, out=qo_indptr_np[1:])
        kv_indptr_np = np.zeros(bs + 1, dtype=np.int32)
        np.cumsum(pages_np, out=kv_indptr_np[1:])
        indices_np = np.concatenate([self.page_table_np[r.row, : pages_np[i]] for i, r in enumerate(reqs)])
        last_np = ((seq_lens_np - 1) % page + 1).astype(np.int32)
        win_pages_np = np.minimum(pages_np, cfg.window // page)
        win_indptr_np = np.zeros(bs + 1, dtype=np.int32)
        np.cumsum(win_pages_np, out=win_indptr_np[1:])
        win_indices_np = np.concatenate(
            [self.page_table_np[r.row, pages_np[i] - win_pages_np[i] : pages_np[i]] for i, r in enumerate(reqs)]
        )
        ids_np = np.concatenate([np.asarray(r.token_ids[r.num_cached :], dtype=np.int64) for r in reqs])
        pos_np = np.concatenate([np.arange(r.num_cached, len(r.token_ids), dtype=np.int64) for r in reqs])
        bucket = cfg.bucket_for(bs) if is_decode else 0
        dev = self.device
        return ForwardBatch(
            bs=bs,
            is_decode=is_decode,
            input_ids=torch.from_numpy(ids_np).to(dev, non_blocking=True),
            positions=torch.from_numpy(pos_np).to(dev, non_blocking=True),
            seq_lens_cpu=seq_lens_np,
            qo_indptr_cpu=torch.from_numpy(qo_indptr_np),
            kv_indptr_cpu=torch.from_numpy(kv_indptr_np),
            kv_indices=torch.from_numpy(indices_np).to(dev, non_blocking=True),
            kv_indices_np=indices_np,
            last_page_len=torch.from_numpy(last_np).to(dev, non_blocking=True),
            last_page_len_cpu=torch.from_numpy(last_np),
            block_tables=torch.from_numpy(self.page_table_np[[r.row for r in reqs]]).to(dev, non_blocking=True),
            seq_lens_dev=torch.from_numpy(seq_lens_np).to(dev, non_blocking=True),
            max_kv_len=int(seq_lens_np.max()),
            bucket=bucket,
            use_graph=bucket > 0,
            window_layers=cfg.window_layers,
            window_indptr_np=win_indptr_np,
            window_indices=torch.from_numpy(win_indices_np).to(dev, non_blocking=True),
        )


def build_engine(device="cuda"):
    engine = OffloadEngine(OffloadConfig(), device)
    engine.warmup()
    return engine
