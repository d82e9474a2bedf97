"""Stand-in Whisper: a conv + transformer encoder and a decoder whose layers call the attention backend."""

from __future__ import annotations

import torch
from torch import nn


class WhisperDecoderLayer(nn.Module):
    def __init__(self, cfg, layer_id: int) -> None:
        super().__init__()
        d, self.h = cfg.d_model, cfg.decoder_attention_heads
        self.layer_id = layer_id
        self.qkv, self.o = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.cross_q, self.cross_o = nn.Linear(d, d), nn.Linear(d, d)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

    def forward(self, h: torch.Tensor, fb) -> torch.Tensor:
        q, k, v = self.qkv(h).view(h.shape[0], 3, self.h, -1).unbind(1)
        h = h + self.o(fb.attn_backend.forward_decode(q, k, v, self, fb).flatten(1))
        cq = self.cross_q(h).view(h.shape[0], self.h, -1)
        h = h + self.cross_o(fb.attn_backend.forward_cross(cq, self, fb).flatten(1))
        return h + self.mlp(h)


class WhisperForConditionalGeneration(nn.Module):
    def __init__(self, cfg) -> None:
        super().__init__()
        d = cfg.d_model
        self.embed_tokens = nn.Embedding(cfg.vocab_size, d)
        self.embed_positions = nn.Embedding(cfg.max_target_positions, d)
        self.layers = nn.ModuleList(WhisperDecoderLayer(cfg, i) for i in range(cfg.decoder_layers))
        self.conv = nn.Conv1d(cfg.num_mel_bins, d, kernel_size=3, stride=2, padding=1)
        self.enc_qkv = nn.Linear(d, 3 * d)
        self.cross_kv = nn.ModuleList(nn.Linear(d, 2 * d) for _ in range(cfg.decoder_layers))
        self.no_speech_head = nn.Linear(d, 1)
        self.heads = cfg.decoder_attention_heads

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, fb) -> torch.Tensor:
        h = self.embed_tokens(input_ids) + self.embed_positions(positions)
        for layer in self.layers:
            h = layer(h, fb)
        return h @ self.embed_tokens.weight.t()

    def encode(self, mel: torch.Tensor, encoder_wrapper) -> torch.Tensor:
        x = self.conv(mel).transpose(0, 1)  # [T, d]
        q, k, v = self.enc_qkv(x).view(x.shape[0], 3, self.heads, -1).unbind(1)
        return x + encoder_wrapper.run(q, k, v).flatten(1)

    def project_cross_kv(self, feats: torch.Tensor):
        kv = torch.stack([proj(feats) for proj in self.cross_kv])  # [L, T, 2d]
        k, v = kv.view(kv.shape[0], kv.shape[1], 2, self.heads, -1).unbind(2)
        return k, v

    def no_speech_prob(self, feats: torch.Tensor) -> torch.Tensor:
        return torch.sigmoid(self.no_speech_head(feats[0]))
