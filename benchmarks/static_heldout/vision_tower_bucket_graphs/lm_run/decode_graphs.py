"""Decode CUDA graphs of the language model, one per batch bucket."""

from dataclasses import dataclass
from typing import Dict

import torch

from lm_attn.backend import VLMAttentionBackend
from lm_attn.metadata import DecodeMeta
from lm_run.model import VLMLanguageModel
from vlm import VLMConfig


@dataclass
class GraphEntry:
    graph: torch.cuda.CUDAGraph
    input_ids: torch.Tensor
    positions: torch.Tensor
    slots: torch.Tensor
    logits: torch.Tensor


class DecodeGraphRunner:
    def __init__(self, model: VLMLanguageModel, backend: VLMAttentionBackend, kv_cache: torch.Tensor, cfg: VLMConfig, pool=None):
        self.model = model
        self.backend = backend
        self.kv_cache = kv_cache
        self.cfg = cfg
        self.pool = pool
        self.device = cfg.device
        max_bs = cfg.decode_buckets[-1]
        self.static_input_ids = torch.zeros(max_bs, dtype=torch.int64, device=self.device)
        self.static_positions = torch.zeros(max_bs, dtype=torch.int64, device=self.device)
        self.static_slots = torch.zeros(max_bs, dtype=torch.int64, device=self.device)
        self.static_seq_lens = torch.ones(max_bs, dtype=torch.int32, device=self.device)
        self.graphs: Dict[int, GraphEntry] = {}

    def _dummy_meta(self, bs: int) -> DecodeMeta:
        return DecodeMeta(
            batch_size=bs,
            padded_bs=bs,
            kv_indptr_host=torch.arange(bs + 1, dtype=torch.int32),
            kv_indices=torch.zeros(bs, dtype=torch.int32, device=self.device),
            last_page_len_host=torch.ones(bs, dtype=torch.int32),
            positions=self.static_positions[:bs],
        )

    def capture_one_batch_size(self, bs: int) -> GraphEntry:
        w = self.backend.graph_wrappers[bs]
        if w._fixed_batch_size != bs:  # expect: FC103
            raise RuntimeError(f"graph wrapper for bucket {bs} was built for another batch size")
        self.backend.init_forward_metadata(self._dummy_meta(bs))
        warm_len = self.static_seq_lens[:bs].max().item()  # expect: FC101
        self.static_positions[:bs].fill_(warm_len - 1)
        args = (self.static_input_ids[:bs], self.static_positions[:bs], self.kv_cache, self.static_slots[:bs])
        self.model.forward_decode(*args)  # warm-up
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, pool=self.pool):
            logits = self.model.forward_decode(*args)
        entry = GraphEntry(
            graph=g,
            input_ids=self.static_input_ids[:bs],
            positions=self.static_positions[:bs],
            slots=self.static_slots[:bs],
            logits=logits,
        )
        self.graphs[bs] = entry
        return entry

    def capture_all(self) -> None:
        for bs in reversed(self.cfg.decode_buckets):
            self.capture_one_batch_size(bs)

    def replay(self, meta: DecodeMeta, input_ids: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
        n = meta.batch_size
        entry = self.graphs[meta.padded_bs]
        self.backend.init_forward_metadata(meta)
        entry.input_ids[:n].copy_(input_ids, non_blocking=True)
        entry.slots[:n].copy_(slots, non_blocking=True)
        entry.positions = meta.positions.clone()  # expect: FC107
        entry.graph.replay()
        return entry.logits[:n]
