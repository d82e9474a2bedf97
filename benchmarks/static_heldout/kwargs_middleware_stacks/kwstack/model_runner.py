"""Model runner: the per-step entry point, a toy decoder and the step middleware stack."""

from __future__ import annotations

import logging
from typing import Any, Optional

import torch
from torch import nn

from kwstack.config import ServerArgs, set_ragged_workspace_bytes
from kwstack.flashinfer_backend import FlashInferAttnBackend
from kwstack.forward_batch import ForwardBatch
from kwstack.middleware import build_step_stack
from kwstack.sampler import Sampler

logger = logging.getLogger(__name__)


class RadixAttention(nn.Module):
    def __init__(self, layer_id: int, attn_backend: FlashInferAttnBackend, logit_cap: float = 0.0, window: int = -1):
        super().__init__()
        self.layer_id = layer_id
        self.attn_backend = attn_backend
        self.logit_cap = logit_cap
        self.sliding_window_size = window

    def forward(self, q, k, v, fb: ForwardBatch, **kwargs):
        return self.attn_backend.forward(q, k, v, self, fb, **kwargs)


class DecoderLayer(nn.Module):
    def __init__(self, sa: ServerArgs, layer_id: int, attn_backend: FlashInferAttnBackend):
        super().__init__()
        hidden = sa.num_qo_heads * sa.head_dim
        kv_hidden = sa.num_kv_heads * sa.head_dim
        self.qkv = nn.Linear(hidden, hidden + 2 * kv_hidden, bias=False)
        self.o = nn.Linear(hidden, hidden, bias=False)
        self.split = (hidden, kv_hidden, kv_hidden)
        window = sa.sliding_window_size if layer_id % 2 == 1 else -1
        self.attn = RadixAttention(layer_id, attn_backend, logit_cap=sa.logit_cap, window=window)

    def forward(self, h, fb: ForwardBatch):
        q, k, v = self.qkv(h).split(self.split, dim=-1)
        return h + self.o(self.attn(q, k, v, fb))


class DecoderModel(nn.Module):
    def __init__(self, sa: ServerArgs, attn_backend: FlashInferAttnBackend):
        super().__init__()
        hidden = sa.num_qo_heads * sa.head_dim
        self.embed = nn.Embedding(sa.vocab_size, hidden)
        self.layers = nn.ModuleList([DecoderLayer(sa, i, attn_backend) for i in range(sa.num_layers)])
        self.lm_head = nn.Linear(hidden, sa.vocab_size, bias=False)

    def forward(self, input_ids, positions, fb: ForwardBatch):
        h = self.embed(input_ids)
        for layer in self.layers:
            h = layer(h, fb)
        return self.lm_head(h)


class ModelRunner:
    def __init__(self, server_args: ServerArgs, eos_id: int):
        sa = server_args
        self.server_args = sa
        self.device = torch.device(sa.device)
        max_ctx = sa.max_total_tokens // max(1, sa.max_running_requests)
        self.req_to_token = torch.zeros(sa.max_running_requests, max_ctx, dtype=torch.int32, device=self.device)
        kv_shape = (sa.num_layers, sa.max_total_tokens, 2, sa.num_kv_heads, sa.head_dim)
        self.kv_cache = torch.zeros(kv_shape, dtype=torch.bfloat16, device=self.device)
        set_ragged_workspace_bytes(sa.chunked_prefill_size * sa.num_qo_heads * sa.head_dim * 8)
        self.attn_backend = FlashInferAttnBackend(sa, self.req_to_token, self.kv_cache)
        self.model = DecoderModel(sa, self.attn_backend).to(self.device)
        self.sampler = Sampler(eos_id, sa.max_running_requests, device=sa.device)
        self.step_stack = build_step_stack(self._forward_core, every=sa.log_step_every, tag="decode")
        self.graph_runner: Optional[Any] = None
        if not sa.disable_cuda_graph:
            from kwstack.graph_runner import CudaGraphRunner

            self.graph_runner = CudaGraphRunner(self)

    def forward_batch(self, fb: ForwardBatch, **kwargs) -> torch.Tensor:
        if self.graph_runner is not None and self.graph_runner.can_run(fb):
            logits = self.graph_runner.replay(fb, **kwargs)
        else:
            logits = self.step_stack(fb, **kwargs)
        return self.sampler.sample(logits, fb, temperatures=kwargs.get("temperatures"))

    def _forward_core(self, fb: ForwardBatch, **kwargs) -> torch.Tensor:
        if not kwargs.get("capturing", False):
            if fb.forward_mode.is_extend() and fb.extend_seq_lens is None:
                fb.extend_seq_lens = torch.tensor(fb.extend_seq_lens_cpu, dtype=torch.int32, device=self.device)  # ok: FC107
            self.attn_backend.init_forward_metadata(fb)
        self._write_req_to_token(fb)
        return self.model(fb.input_ids, fb.positions, fb)

    def _write_req_to_token(self, fb: ForwardBatch) -> None:
        if fb.forward_mode.is_decode():
            self.req_to_token[fb.req_pool_indices, fb.positions] = fb.out_cache_loc.to(torch.int32)  # ok: FC104


def dump_batch(fb: ForwardBatch) -> None:
    """Offline debugging aid (``python -m kwstack.model_runner batch.pt``); never called while serving."""
    print("seq_lens", fb.seq_lens.cpu())  # ok: FC101
    print("positions", fb.positions.tolist())


if __name__ == "__main__":
    import sys

    dump_batch(torch.load(sys.argv[1]))
