"""Routed experts on the host (AMX kernels behind pybind), hot experts on the GPU; a decode step enqueues the
CPU work as a stream host function, so the step, host experts included, fits one CUDA graph."""
from __future__ import annotations

import enum
import logging
from typing import Dict, Optional

import torch
from torch import nn

import cpuinfer_ext

logger = logging.getLogger(__name__)


class ExpertPlacement(enum.Flag):
    CPU = enum.auto()
    GPU = enum.auto()
    HYBRID = CPU | GPU


class CPUInfer:  # a handle over the C++ worker pool; other attributes go to the extension object
    def __init__(self, threads: int):
        self._backend = cpuinfer_ext.CPUInfer(threads)

    def __getattr__(self, name: str):
        return getattr(self._backend, name)


class KExpertsCPU(nn.Module):
    def __init__(self, cfg, layer_idx: int, cpu_infer: CPUInfer, device: torch.device):
        super().__init__()
        self.cpu_infer, self.max_tokens, self.max_decode_tokens = cpu_infer, cfg.chunked_prefill_size, cfg.max_decode_batch
        h, k, n = cfg.hidden_size, cfg.num_experts_per_tok, cfg.max_decode_batch
        self.input_cpu = torch.zeros(n, h, dtype=torch.bfloat16, pin_memory=True)
        self.ids_cpu = torch.zeros(n, k, dtype=torch.long, pin_memory=True)
        self.weights_cpu = torch.zeros(n, k, dtype=torch.float32, pin_memory=True)
        self.output_cpu = torch.zeros(n, h, dtype=torch.bfloat16, pin_memory=True)
        # sized for the largest captured batch; the graph reads it after the host function
        self.output_gpu = torch.zeros(cfg.graph_batch_sizes[-1], h, dtype=torch.bfloat16, device=device)
        self.prefill_cpu: Optional[torch.Tensor] = None
        self.moe = cpuinfer_ext.MOE(layer_idx, cfg.moe_intermediate_size, cfg.num_experts, h)
        # the decode task holds raw pointers into the pinned staging buffers
        self.decode_task = self.moe.bind(self.input_cpu, self.ids_cpu, self.weights_cpu, self.output_cpu)

    def forward(self, hidden: torch.Tensor, topk_ids: torch.Tensor, topk_weights: torch.Tensor) -> torch.Tensor:
        n = hidden.shape[0]
        assert n <= self.max_tokens, "chunk larger than chunked_prefill_size"  # expect: FC109
        if n <= self.max_decode_tokens:
            return self._decode(hidden, topk_ids, topk_weights, n)
        if self.prefill_cpu is None or self.prefill_cpu.shape[0] < n:
            self.prefill_cpu = torch.empty((n, hidden.shape[1]), dtype=hidden.dtype, pin_memory=True)  # ok: FC107
        staging = self.prefill_cpu[:n]
        staging.copy_(hidden)  # expect: FC101
        routing = torch.cat([topk_ids.to(torch.float32), topk_weights.float()], dim=1).cpu()  # expect: FC101
        out_cpu = self.moe.forward(staging, routing[:, : topk_ids.shape[1]].long(), routing[:, topk_ids.shape[1] :].numpy())
        return out_cpu.to(hidden.device, non_blocking=True)

    def _decode(self, hidden, topk_ids, topk_weights, n: int) -> torch.Tensor:
        stream = torch.cuda.current_stream().cuda_stream
        self.input_cpu[:n].copy_(hidden, non_blocking=True)  # ok: FC101
        self.ids_cpu[:n].copy_(topk_ids, non_blocking=True)
        self.weights_cpu[:n].copy_(topk_weights, non_blocking=True)
        # the host function runs after the copies above and before the copy below, in stream order
        self.cpu_infer.submit_with_cuda_stream(stream, self.decode_task, n)
        self.cpu_infer.sync_with_cuda_stream(stream)
        if n > self.output_gpu.shape[0]:
            self.output_gpu = torch.empty(n, hidden.shape[1], dtype=hidden.dtype, device=hidden.device)  # expect: FC107
        self.output_gpu[:n].copy_(self.output_cpu[:n], non_blocking=True)
        return self.output_gpu[:n]


class KDeepseekMoE(nn.Module):
    def __init__(self, cfg, layer_idx: int, cpu_infer: CPUInfer, device: torch.device):
        super().__init__()
        self.top_k = cfg.num_experts_per_tok
        gpu_ids = cfg.gpu_experts.get(layer_idx, ())
        self.placement = ExpertPlacement.HYBRID if gpu_ids else ExpertPlacement.CPU
        self.gate = nn.Linear(cfg.hidden_size, cfg.num_experts, bias=False)
        self.experts = KExpertsCPU(cfg, layer_idx, cpu_infer, device)
        self.gpu_experts: Dict[int, nn.Module] = {e: nn.Linear(cfg.hidden_size, cfg.hidden_size) for e in gpu_ids}
        self.shared_experts = nn.Linear(cfg.hidden_size, cfg.hidden_size)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        topk_weights, topk_ids = torch.topk(self.gate(hidden).softmax(dim=-1), self.top_k, dim=-1)
        logger.debug("layer routing: %s", topk_ids)  # ok: FC101
        out = self.shared_experts(hidden)
        if self.placement & ExpertPlacement.GPU:
            for e in topk_ids.unique().tolist():  # expect: FC101
                if e in self.gpu_experts:
                    hit = (topk_ids == e).to(hidden.dtype)
                    out = out + (topk_weights * hit).sum(-1, keepdim=True) * self.gpu_experts[e](hidden)
                    topk_weights = topk_weights * (1 - hit)
        return out + self.experts(hidden, topk_ids, topk_weights)
