"""The JSON-mode engine: stage masks, replay the bucket's graph, advance the automata."""
from __future__ import annotations

from typing import List, Sequence

import flashcheck
import numpy as np
import torch

from jm_attn.backend import JsonBackend
from jm_attn.meta import JsonMetaBuilder
from jsonmode import BitmaskBuilder, JsonAutomaton, JsonModeConfig, TokenClassTable

from .graphs import JsonGraphRunner, StepInputs
from .model import QwenJson
from .sampler import MaskedSampler


class JsonModeEngine:
    def __init__(self, cfg: JsonModeConfig, vocab: Sequence[str], eos_id: int, colon_token: int,
                 device_index: int = 0) -> None:
        self.cfg = cfg
        self.device = torch.device("cuda", device_index)
        self.automaton = JsonAutomaton(TokenClassTable(vocab, eos_id, cfg.vocab_size), colon_token)
        self.bitmask = BitmaskBuilder(cfg.vocab_size, cfg.max_batch, self.device)
        self.backend = JsonBackend(cfg, self.device)
        self.builder = JsonMetaBuilder(cfg, self.device)
        self.model = QwenJson(cfg, self.backend).to(self.device)
        self.sampler = MaskedSampler(cfg, self.device)
        self.kv_cache = torch.zeros(cfg.num_layers, cfg.num_pages, 2, cfg.page_size, cfg.num_kv_heads, cfg.head_dim,
                                    dtype=torch.bfloat16, device=self.device)
        self.runner = JsonGraphRunner(self.model, self.sampler, self.backend, self.bitmask, cfg, self.device)
        self.backend.init_graph_buffers()

    def capture_all(self) -> None:
        for bs in reversed(self.runner.buckets):
            self.runner.capture_one_batch_size(bs, self.kv_cache)

    @flashcheck.hot_path
    def step(self, rids: Sequence[int], page_lists: Sequence[List[int]], seq_lens_np: np.ndarray,
             input_ids_cpu: torch.Tensor) -> torch.Tensor:
        bs = len(rids)
        self.bitmask.stage(self.automaton, rids)
        forced = self.automaton.forced_tokens(rids)
        meta = self.builder.build(page_lists, seq_lens_np)
        gbs = self.runner.bucket_for(bs)
        self.sampler.temperature[:bs].fill_(1.0)  # ok: FC104
        self.backend.prepare_replay(gbs, meta)
        inputs = StepInputs(
            input_ids=input_ids_cpu.to(self.device, non_blocking=True),
            positions=torch.from_numpy(seq_lens_np - 1).to(self.device, non_blocking=True),
        )
        tokens = self.runner.replay(gbs, inputs)
        self.automaton.advance_batch(rids, tokens)
        rows = [i for i, f in enumerate(forced) if f]
        if rows:
            counts = torch.tensor([len(forced[i]) for i in rows], dtype=torch.int32, device=self.device)
            self.backend.kv_last_page_len[rows] += counts  # expect: FC104
        return tokens
