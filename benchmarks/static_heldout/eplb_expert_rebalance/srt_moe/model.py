"""A DeepSeek-shaped model: MLA attention, an EP MoE in every layer, one MTP (next-n) draft layer."""

from __future__ import annotations

from typing import List

import torch
from torch import nn

from eplb.placement import ExpertPlacement
from eplb.recorder import ExpertLoadRecorder
from srt_moe.config import MoEModelConfig
from srt_moe.forward_batch import ForwardBatch
from srt_moe.mla_backend import FlashInferMLABackend
from srt_moe.moe_layer import EPMoE


class MLAAttention(nn.Module):
    def __init__(self, cfg: MoEModelConfig, layer_id: int, backend: FlashInferMLABackend) -> None:
        super().__init__()
        self.layer_id = layer_id
        self.backend = backend
        self.h = cfg.num_heads
        self.nope, self.rope, self.lora, self.v = (
            cfg.qk_nope_head_dim, cfg.qk_rope_head_dim, cfg.kv_lora_rank, cfg.v_head_dim
        )
        self._sm_scale = cfg.qk_head_dim**-0.5
        self.q_proj = nn.Linear(cfg.hidden_size, self.h * (self.nope + self.rope), bias=False)
        self.kv_a = nn.Linear(cfg.hidden_size, self.lora + self.rope, bias=False)
        self.kv_b = nn.Linear(self.lora, self.h * (self.nope + self.v), bias=False)
        self.w_kc = nn.Parameter(torch.randn(self.h, self.nope, self.lora) * 0.02)
        self.w_vc = nn.Parameter(torch.randn(self.h, self.lora, self.v) * 0.02)
        self.o_proj = nn.Linear(self.h * self.v, cfg.hidden_size, bias=False)

    def _latent(self, x: torch.Tensor, fb: ForwardBatch):
        ckv, kpe = self.kv_a(x).split([self.lora, self.rope], dim=-1)
        self.backend.store_latent(self.layer_id, ckv, kpe, fb.out_cache_loc)
        return ckv, kpe

    def _attend(self, q_nope: torch.Tensor, q_pe: torch.Tensor, fb: ForwardBatch) -> torch.Tensor:
        return self.backend.attn_decode(q_nope, q_pe, self.layer_id, fb)

    def decode(self, x: torch.Tensor, fb: ForwardBatch) -> torch.Tensor:
        q_nope, q_pe = self.q_proj(x).view(-1, self.h, self.nope + self.rope).split([self.nope, self.rope], -1)
        self._latent(x, fb)
        q_abs = torch.einsum("thd,hdc->thc", q_nope, self.w_kc)
        o = self._attend(q_abs, q_pe, fb)
        return self.o_proj(torch.einsum("thc,hcv->thv", o, self.w_vc).flatten(1))

    def extend(self, x: torch.Tensor, fb: ForwardBatch) -> torch.Tensor:
        q = self.q_proj(x).view(-1, self.h, self.nope + self.rope)
        ckv, kpe = self._latent(x, fb)
        k_nope, v = self.kv_b(ckv).view(-1, self.h, self.nope + self.v).split([self.nope, self.v], -1)
        k = torch.cat([k_nope, kpe.unsqueeze(1).expand(-1, self.h, -1)], dim=-1)
        return self.o_proj(self.backend.attn_extend(q, k, v).flatten(1))


class DraftMLAAttention(MLAAttention):
    """The MTP layer's attention: its own wrapper, planned beside the main decode."""

    def _attend(self, q_nope: torch.Tensor, q_pe: torch.Tensor, fb: ForwardBatch) -> torch.Tensor:
        return self.backend.attn_draft_decode(q_nope, q_pe, self.layer_id, fb)


class DecoderLayer(nn.Module):
    def __init__(self, cfg, layer_id, backend, placement, recorder, device) -> None:
        super().__init__()
        self.ln1 = nn.RMSNorm(cfg.hidden_size)
        self.ln2 = nn.RMSNorm(cfg.hidden_size)
        self.self_attn = MLAAttention(cfg, layer_id, backend)
        self.mlp = EPMoE(cfg, layer_id, placement, recorder, device)

    def decode(self, h: torch.Tensor, fb: ForwardBatch) -> torch.Tensor:
        h = h + self.self_attn.decode(self.ln1(h), fb)
        return h + self.mlp(self.ln2(h))

    def extend(self, h: torch.Tensor, fb: ForwardBatch) -> torch.Tensor:
        h = h + self.self_attn.extend(self.ln1(h), fb)
        return h + self.mlp(self.ln2(h))


class NextNLayer(nn.Module):
    def __init__(self, cfg, layer_id, backend, placement, recorder, device) -> None:
        super().__init__()
        self.eh_proj = nn.Linear(2 * cfg.hidden_size, cfg.hidden_size, bias=False)
        self.ln1 = nn.RMSNorm(cfg.hidden_size)
        self.ln2 = nn.RMSNorm(cfg.hidden_size)
        self.norm = nn.RMSNorm(cfg.hidden_size)
        self.self_attn = DraftMLAAttention(cfg, layer_id, backend)
        self.mlp = EPMoE(cfg, layer_id, placement, recorder, device)

    def decode(self, hidden: torch.Tensor, tok_embed: torch.Tensor, fb: ForwardBatch) -> torch.Tensor:
        h = self.eh_proj(torch.cat([hidden, tok_embed], dim=-1))
        h = h + self.self_attn.decode(self.ln1(h), fb)
        return self.norm(h + self.mlp(self.ln2(h)))


class DeepseekLite(nn.Module):
    def __init__(
        self,
        cfg: MoEModelConfig,
        backend: FlashInferMLABackend,
        placement: ExpertPlacement,
        recorder: ExpertLoadRecorder,
        device: torch.device,
    ) -> None:
        super().__init__()
        self.embed = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(
            [DecoderLayer(cfg, i, backend, placement, recorder, device) for i in range(cfg.num_layers)]
        )
        self.mtp = NextNLayer(cfg, cfg.num_layers, backend, placement, recorder, device)
        self.norm = nn.RMSNorm(cfg.hidden_size)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)

    def moe_layers(self) -> List[EPMoE]:
        return [layer.mlp for layer in self.layers] + [self.mtp.mlp]

    def forward_decode(self, input_ids: torch.Tensor, fb: ForwardBatch) -> torch.Tensor:
        """Returns ``[2, bs, vocab]``: the target logits and the MTP draft logits."""
        h = self.embed(input_ids)
        for layer in self.layers:
            h = layer.decode(h, fb)
        h = self.norm(h)
        logits = self.lm_head(h)
        draft = self.mtp.decode(h, self.embed(logits.argmax(dim=-1)), fb)
        return torch.stack([logits, self.lm_head(draft)])

    def forward_extend(self, input_ids: torch.Tensor, fb: ForwardBatch) -> torch.Tensor:
        h = self.embed(input_ids)
        for layer in self.layers:
            h = layer.extend(h, fb)
        return self.lm_head(self.norm(h))
