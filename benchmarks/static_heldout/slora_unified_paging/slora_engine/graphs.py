"""Decode graphs per bucket; the LoRA segment tensors are static inputs of every graph (BGMV layout)."""

from typing import Dict

import torch

from slora.config import SLoRAConfig
from slora_engine.attention import UnifiedPagedAttention
from slora_engine.metadata import LoRAStepMeta
from slora_engine.model import SLoRADecoder


class AdapterGraphBank:
    def __init__(self, cfg: SLoRAConfig, model: SLoRADecoder, attn: UnifiedPagedAttention, device: torch.device):
        self.cfg = cfg
        self.model = model
        self.attn = attn
        self.device = device
        n = cfg.max_batch
        self.static_ids = torch.zeros(n, dtype=torch.int64, device=self.device)
        self.static_lora = {
            "seg_indptr": torch.arange(n + 1, dtype=torch.int32, device=self.device),
            "weight_indices": torch.zeros(n, dtype=torch.int64, device=self.device),
        }
        self.graphs: Dict[int, torch.cuda.CUDAGraph] = {}
        self.outputs: Dict[int, torch.Tensor] = {}
        self.mempool = torch.cuda.graph_pool_handle()

    def _static_meta(self, bs: int) -> LoRAStepMeta:
        return LoRAStepMeta(
            seg_indptr=self.static_lora["seg_indptr"][: bs + 1],
            weight_indices=self.static_lora["weight_indices"][:bs],
            num_segments=bs,
            row_slot=self.static_lora["weight_indices"][:bs],
        )

    def record_bucket(self, bs: int) -> None:
        torch.cuda.synchronize()  # ok: FC101
        self.attn.ready_bucket(bs)
        meta = self._static_meta(bs)
        self.model.forward_decode(self.static_ids[:bs], meta, bs)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, pool=self.mempool):
            out = self.model.forward_decode(self.static_ids[:bs], meta, bs)
        self.graphs[bs] = g
        self.outputs[bs] = out

    def record_all(self) -> None:
        for bs in sorted(self.cfg.buckets, reverse=True):
            self.record_bucket(bs)

    def replay(self, bs: int, input_ids: torch.Tensor, meta: LoRAStepMeta) -> torch.Tensor:
        n = input_ids.shape[0]
        self.static_ids[:n].copy_(input_ids)
        self.static_lora["weight_indices"] = meta.row_slot.clone()  # expect: FC107
        self.graphs[bs].replay()
        return self.outputs[bs][:n]
