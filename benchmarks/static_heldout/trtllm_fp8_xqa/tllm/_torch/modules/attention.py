"""Attention over an FP8 paged KV cache: quantize the new K/V with per-layer scales, then decode."""
from __future__ import annotations

import functools
import logging

import torch
from flashinfer.decode import trtllm_batch_decode_with_kv_cache, xqa_batch_decode_with_kv_cache
from flashinfer.prefill import trtllm_batch_context_with_kv_cache
from torch import nn

from ..attention_backend import Fp8FlashInferMetadata

logger = logging.getLogger(__name__)
FP8_MAX = 448.0


@functools.singledispatch
def as_host_scale(scale) -> float:
    return float(scale)


@as_host_scale.register
def _(scale: torch.Tensor) -> float:
    return float(scale.item())  # ok: FC101


def quantize_kv_fp8(k: torch.Tensor, v: torch.Tensor, k_scale: torch.Tensor, v_scale: torch.Tensor):
    assert k.dtype == v.dtype, "k and v must share a dtype"  # expect: FC109
    k = torch.where(k.isfinite(), k, torch.zeros_like(k))  # ok: FC101
    quant = lambda x, s: (x / s).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)  # noqa: E731
    return quant(k, k_scale), quant(v, v_scale)


class Attention(nn.Module):
    def __init__(self, layer_idx: int, cfg, device: torch.device, is_draft_layer: bool = False) -> None:
        super().__init__()
        self.layer_idx, self.is_draft_layer = layer_idx, is_draft_layer
        self.h, self.kvh, self.d = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
        self.qkv = nn.Linear(cfg.hidden_size, (self.h + 2 * self.kvh) * self.d, bias=False, device=device)
        # calibrated per-layer scales, loaded with the checkpoint
        self.k_scale = nn.Parameter(torch.ones((), device=device), requires_grad=False)
        self.v_scale = nn.Parameter(torch.ones((), device=device), requires_grad=False)
        self.k_scale_float = self.v_scale_float = 1.0
        self._sm_scale = self.d**-0.5
        self.check_overflow = cfg.check_fp8_overflow

    def process_weights_after_loading(self) -> None:
        self.k_scale_float, self.v_scale_float = as_host_scale(self.k_scale), as_host_scale(self.v_scale)

    def forward(self, hidden: torch.Tensor, kv_cache: torch.Tensor, slots: torch.Tensor, md: Fp8FlashInferMetadata) -> torch.Tensor:
        q, k, v = self.qkv(hidden).unflatten(-1, (-1, self.d)).split([self.h, self.kvh, self.kvh], dim=1)
        if self.check_overflow and k.abs().amax() > FP8_MAX * self.k_scale:  # expect: FC101
            logger.warning("layer %d: K exceeds the FP8 range at the calibrated scale", self.layer_idx)
        kq, vq = quantize_kv_fp8(k, v, self.k_scale, self.v_scale)
        kv_cache[:, 0].flatten(0, -3).index_copy_(0, slots, kq)
        kv_cache[:, 1].flatten(0, -3).index_copy_(0, slots, vq)
        out = torch.empty_like(q)
        nct, n, nc = sum(md.request_q_lens[: md.num_contexts]), md.num_seqs, md.num_contexts  # ok: FC101
        if nc and md.decode_kernel == "trtllm-gen":
            trtllm_batch_context_with_kv_cache(
                query=q[:nct], kv_cache=kv_cache, workspace_buffer=md.ctx_workspace, block_tables=md.block_tables_cuda[:nc],
                seq_lens=md.kv_lens_cuda[:nc], max_kv_len=md.max_seq_len, bmm1_scale=self.k_scale_float * self._sm_scale,
                bmm2_scale=self.v_scale_float, batch_size=nc, out=out[:nct],
            )
        elif nc:
            md.prefill.run(q[:nct], kv_cache, out=out[:nct], k_scale=self.k_scale_float, v_scale=self.v_scale_float)
        if n == nc:
            return out.flatten(1)
        qg, og = q[nct:], out[nct:]
        sm_scale = self._sm_scale  # ok: FC103
        bmm1_scale = float(self.k_scale) * sm_scale  # expect: FC101
        if self.is_draft_layer:
            md.draft_decode.run(qg, kv_cache, out=og, k_scale=self.k_scale_float, v_scale=self.v_scale_float)  # expect: FC108
        elif md.decode_kernel == "xqa":
            xqa_batch_decode_with_kv_cache(qg, kv_cache, workspace_buffer=md.xqa_workspace, block_tables=md.block_tables_cuda[nc:n],
                                           seq_lens=md.kv_lens_cuda[nc:n], max_seq_len=md.max_seq_len, bmm1_scale=bmm1_scale,
                                           bmm2_scale=self.v_scale_float, out=og)
        elif md.decode_kernel == "trtllm-gen":
            trtllm_batch_decode_with_kv_cache(qg, kv_cache, workspace_buffer=md.gen_workspace, block_tables=md.block_tables_cuda[nc:n],
                                              seq_lens=md.kv_lens_cuda[nc:n], max_seq_len=md.max_seq_len, bmm1_scale=bmm1_scale,
                                              bmm2_scale=self.v_scale_float, out=og)
        else:
            w = md.graph_decode[n] if md.is_cuda_graph else md.eager_decode
            if vars(w).get("_use_tensor_cores"):  # expect: FC103
                qg = qg.to(torch.float8_e4m3fn)  # the tensor-core kernel takes an FP8 query
            w.run(qg, kv_cache, out=og, k_scale=self.k_scale_float, v_scale=self.v_scale_float)  # ok: FC108
        return out.flatten(1)


class Fp8DecoderModel(nn.Module):
    def __init__(self, cfg, device: torch.device) -> None:
        super().__init__()
        self.embed = nn.Embedding(cfg.vocab_size, cfg.hidden_size, device=device)
        n = cfg.num_hidden_layers
        self.layers = nn.ModuleList(Attention(i, cfg, device, is_draft_layer=i == n) for i in range(n + cfg.num_mtp_layers))
        self.kv_caches: list[torch.Tensor] = []

    def forward(self, input_ids: torch.Tensor, slots: torch.Tensor, md: Fp8FlashInferMetadata) -> torch.Tensor:
        hidden = self.embed(input_ids)
        for layer, kv_cache in zip(self.layers, self.kv_caches):
            hidden = hidden + layer(hidden, kv_cache, slots, md)
        return hidden
