"""Decode graphs per batch bucket, sampling and logprob gathering included in the graph."""
from __future__ import annotations

from typing import Dict, Optional, Tuple

import numpy as np
import torch

from rlroll.config import RolloutConfig
from rlroll_engine.attn_backend import HostPageTables, RolloutAttnBackend, RolloutBatch
from rlroll_engine.logprobs import LogprobCollector, gumbel_sample
from rlroll_engine.model import RolloutPolicy


class RolloutGraphRunner:
    def __init__(
        self,
        model: RolloutPolicy,
        backend: RolloutAttnBackend,
        collector: LogprobCollector,
        cfg: RolloutConfig,
        device: torch.device,
    ):
        self.model = model
        self.backend = backend
        self.collector = collector
        self.cfg = cfg
        self.device = device
        self.max_bs = max(cfg.graph_buckets)
        self.static_input_ids = torch.zeros(self.max_bs, dtype=torch.int64, device=device)
        self.static_positions = torch.zeros(self.max_bs, dtype=torch.int64, device=device)
        self.static_out_loc = torch.zeros(self.max_bs, dtype=torch.int64, device=device)
        self.static_temperature = torch.full((self.max_bs,), cfg.temperature, dtype=torch.float32, device=device)
        self.static_row_ids = torch.arange(self.max_bs, device=device)
        self.graphs: Dict[int, torch.cuda.CUDAGraph] = {}
        self.outputs: Dict[int, Tuple[torch.Tensor, torch.Tensor]] = {}
        self.pool = torch.cuda.graph_pool_handle()
        self.backend.init_graph_state()

    def bucket(self, n: int) -> Optional[int]:
        return next((bs for bs in self.cfg.graph_buckets if bs >= n), None)

    def _dummy_batch(self, bs: int) -> RolloutBatch:
        c, ps, dev = self.cfg, self.cfg.page_size, self.device
        groups = max(1, bs // c.n_samples)
        pre = c.cascade_min_prefix // ps
        tables = HostPageTables(
            kv_indptr=np.arange(bs + 1, dtype=np.int32) * (pre + 1),
            kv_indices=np.zeros(bs * (pre + 1), dtype=np.int32),
            last_page_len=np.ones(bs, dtype=np.int32),
            shared_indptr=np.arange(groups + 1, dtype=np.int32) * pre,
            shared_indices=np.zeros(groups * pre, dtype=np.int32),
            shared_last_page_len=np.full(groups, ps, dtype=np.int32),
            own_indptr=np.arange(bs + 1, dtype=np.int32),
            own_indices=np.zeros(bs, dtype=np.int32),
            own_last_page_len=np.ones(bs, dtype=np.int32),
        )
        sizes = torch.full((groups,), bs // groups, dtype=torch.int64)
        prefix = torch.full((groups,), pre * ps, dtype=torch.int32)
        seq_lens = torch.full((bs,), pre * ps + 1, dtype=torch.int32)
        return RolloutBatch(
            is_prefill=False,
            batch_size=bs,
            input_ids=self.static_input_ids[:bs],
            positions=self.static_positions[:bs],
            out_cache_loc=self.static_out_loc[:bs],
            seq_lens=seq_lens.to(dev),
            seq_lens_cpu=seq_lens,
            block_tables=torch.zeros(bs, 1, dtype=torch.int32, device=dev),
            num_groups=groups,
            group_sizes=sizes.to(dev),
            group_sizes_cpu=sizes,
            prefix_lens=prefix.to(dev),
            prefix_lens_cpu=prefix,
            tables=tables,
            graph_bs=bs,
        )

    def capture(self) -> None:
        for bs in sorted(self.cfg.graph_buckets, reverse=True):
            self.capture_one_batch_size(bs)

    def capture_one_batch_size(self, bs: int) -> None:
        fb = self._dummy_batch(bs)
        self.backend.init_forward_metadata(fb)
        torch.cuda.synchronize()  # ok: FC101
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, pool=self.pool):
            logits = self.model.decode(self.static_input_ids[:bs], self.static_positions[:bs], self.static_out_loc[:bs])
            self.outputs[bs] = gumbel_sample(logits, self.static_temperature[:bs])
        self.graphs[bs] = g

    def replay(self, fb: RolloutBatch) -> Tuple[torch.Tensor, torch.Tensor]:
        bs, n = fb.graph_bs, fb.batch_size
        self.static_input_ids[:n].copy_(fb.input_ids)
        self.static_positions[:n].copy_(fb.positions)
        self.static_out_loc[:n].copy_(fb.out_cache_loc)
        # the trainer anneals the temperature between iterations
        self.static_temperature = torch.full((self.max_bs,), self.cfg.temperature, device=self.device)  # expect: FC107
        self.graphs[bs].replay()
        next_ids, token_lp = self.outputs[bs]
        next_ids, token_lp = next_ids[:n], token_lp[:n]
        finished_rows = self.static_row_ids[:n][next_ids == self.cfg.eos_id]  # expect: FC101
        self.collector.collect(token_lp, next_ids, fb.group_sizes, fb.num_groups, debug=False)
        return next_ids, finished_rows

    def sample_eager(self, fb: RolloutBatch) -> torch.Tensor:
        logits = self.model.decode(fb.input_ids, fb.positions, fb.out_cache_loc)
        temperature = self.static_temperature[:1].expand(fb.batch_size)
        next_ids, token_lp = gumbel_sample(logits, temperature)
        self.collector.collect(token_lp, next_ids, fb.group_sizes, fb.num_groups, debug=False)
        return next_ids
