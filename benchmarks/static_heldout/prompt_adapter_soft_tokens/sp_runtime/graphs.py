"""Decode graphs per batch bucket and prefill graphs per token bucket."""

from typing import Dict, List, Optional, Tuple

import torch

from softprompt.attn.backend import SoftPromptAttention
from softprompt.attn.metadata import StepMetadata
from softprompt.config import SoftPromptConfig
from softprompt.slot_table import EmbeddingSlotTable
from sp_runtime.model import SoftPromptLM


class SoftPromptGraphBank:
    def __init__(
        self,
        cfg: SoftPromptConfig,
        model: SoftPromptLM,
        backend: SoftPromptAttention,
        table: EmbeddingSlotTable,
        kv_caches: List[torch.Tensor],
    ) -> None:
        self.cfg = cfg
        self.model = model
        self.backend = backend
        self.table = table
        self.kv_caches = kv_caches
        dev = cfg.device
        max_tok = max(max(cfg.prefill_token_buckets), cfg.max_batch_size)
        self.static_ids = torch.zeros(max_tok, dtype=torch.long, device=dev)
        self.static_soft_mask = torch.zeros(max_tok, dtype=torch.bool, device=dev)
        self.static_soft_slots = torch.zeros(max_tok, dtype=torch.long, device=dev)
        self.static_soft_offsets = torch.zeros(max_tok, dtype=torch.long, device=dev)
        self.decode_graphs: Dict[int, Tuple[torch.cuda.CUDAGraph, torch.Tensor]] = {}
        self.prefill_graphs: Dict[int, Tuple[torch.cuda.CUDAGraph, torch.Tensor]] = {}
        self._plan_info: Dict[int, object] = {}
        self.pool = torch.cuda.graph_pool_handle()
        self.backend.init_graph_buffers()

    # --------------------------------------------------------------- capture

    def capture_all(self) -> None:
        for n in self.cfg.prefill_token_buckets:
            self.capture_prefill_bucket(n)
        for bs in reversed(self.cfg.decode_buckets):
            self.capture_bucket(bs)

    def capture_bucket(self, bs: int) -> None:
        torch.cuda.synchronize()  # ok: FC101
        self.backend.init_forward_metadata_capture_cuda_graph(bs)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, pool=self.pool):
            out = self.model.forward_decode(self.static_ids[:bs], self.kv_caches, bs)
        self.decode_graphs[bs] = (g, out)
        w = self.backend.decode_wrappers[bs]
        self._plan_info[bs] = vars(w).get("_plan_info")  # expect: FC103

    def capture_prefill_bucket(self, n: int) -> None:
        # warm-up may have left soft tokens in the static inputs: record with none
        if self.static_soft_mask[:n].any():  # expect: FC101
            self.static_soft_mask[:n].zero_()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, pool=self.pool):
            out = self.model.forward_prefill(
                self.static_ids[:n],
                self.static_soft_mask[:n],
                self.static_soft_slots[:n],
                self.static_soft_offsets[:n],
            )
        self.prefill_graphs[n] = (g, out)

    def planned_with(self, bs: int) -> Optional[object]:
        return self._plan_info.get(bs)  # ok: FC103

    # ---------------------------------------------------------------- replay

    def replay(self, bs: int, meta: StepMetadata, input_ids: torch.Tensor) -> torch.Tensor:
        self.static_ids[: meta.bs].copy_(input_ids)
        self.backend.init_forward_metadata_replay_cuda_graph(bs, meta)
        g, out = self.decode_graphs[bs]
        g.replay()
        return out[: meta.bs]

    def replay_prefill(self, n: int, meta: StepMetadata, input_ids: torch.Tensor) -> torch.Tensor:
        k = meta.num_tokens
        self.static_ids[:k].copy_(input_ids)
        self.static_soft_mask[:k].copy_(meta.soft_mask)
        self.static_soft_mask[k:n].zero_()
        self.static_soft_slots[:k].copy_(meta.soft_slots)
        self.static_soft_offsets[:k].copy_(meta.soft_offsets)
        self.backend.init_forward_metadata(meta)
        g, out = self.prefill_graphs[n]
        g.replay()
        return out[:k]
