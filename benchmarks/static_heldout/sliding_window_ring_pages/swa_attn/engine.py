"""Step loop of the sliding-window engine."""

import logging
from typing import Dict, List

import torch

from swaring import RingPageTable, RingState, SWAConfig
from swa_attn.backend import SlidingWindowBackend
from swa_attn.graph_runner import WindowGraphRunner
from swa_attn.metadata import WindowMetadataBuilder, WindowStepMeta
from swa_attn.model import SWAModel

logger = logging.getLogger(__name__)


class SlidingEngine:
    def __init__(self, cfg: SWAConfig, device: torch.device):
        self.cfg = cfg
        self.device = device
        self.ring = RingPageTable(cfg, device)
        self.backend = SlidingWindowBackend(cfg, device)
        self.builder = WindowMetadataBuilder(cfg, self.ring, device)
        self.model = SWAModel(cfg, self.backend).to(device)
        self.runner = WindowGraphRunner(self.model, self.backend, cfg, device)
        self.kv_caches = [
            torch.zeros(cfg.num_pages, 2, cfg.page_size, cfg.num_kv_heads, cfg.head_dim,
                        dtype=torch.bfloat16, device=device)
            for _ in range(cfg.num_layers)
        ]
        self.global_pages: Dict[int, List[int]] = {}
        self.states: List[RingState] = []

    def warmup(self) -> None:
        def dummy(bs: int) -> WindowStepMeta:
            states = [RingState(row=i, seq_len=1, head=0, window_offset=0) for i in range(bs)]
            for st in states:
                self.ring.ring_len_np[st.row] = 1
                self.global_pages.setdefault(st.row, [0])
            return self.builder.build(states, self.global_pages)
        self.runner.capture_decode_graphs(self.kv_caches, dummy)

    def step(self, ids: torch.Tensor, prefill_ids: torch.Tensor, prefill_lens: List[int]) -> torch.Tensor:
        if prefill_lens:
            pmeta = self.builder.build(self.states[-len(prefill_lens):], self.global_pages)
            self.backend.plan_prefill(prefill_lens, pmeta)
            self.model.prefill(prefill_ids, self.kv_caches)

        meta = self.builder.build(self.states, self.global_pages)
        n = meta.batch_size
        rows = torch.arange(n, device=self.device)
        recycled = self.ring.advance(rows, meta.positions + 1)
        logger.debug("recycled %d ring pages so far", recycled)
        bs = self.runner.padded(n)
        if bs is None:
            self.backend.init_forward_metadata(meta)
            return self.model.decode(ids, self.kv_caches, meta, n)
        self.backend.init_forward_metadata_replay_cuda_graph(bs, meta)
        logits = self.runner.replay(bs, ids, meta)
        # next step's last-page lengths, advanced on the device without a new plan
        lp = self.backend.kv_last_page_len[:n]
        lp.copy_(lp % self.cfg.page_size + 1)  # expect: FC104
        return logits
