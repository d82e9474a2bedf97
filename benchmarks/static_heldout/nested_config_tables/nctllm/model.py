"""A Llama-shaped decoder whose attention goes to the FlashInfer op or the trtllm-gen path."""

from __future__ import annotations

from typing import Any, Mapping, Optional

import torch
from torch import nn

from nctllm.attn_op import FlashInferAttnOp
from nctllm.metadata import FlashInferAttentionMetadata
from nctllm.trtllm_gen import TrtllmGenDecodeOp


class DecoderLayer(nn.Module):
    def __init__(self, layer_id: int, cfg: Mapping[str, Any], attn_op: FlashInferAttnOp,
                 trt_op: Optional[TrtllmGenDecodeOp]):
        super().__init__()
        dims = cfg["model_dims"]
        self.layer_id = layer_id
        self.nh = dims["num_qo_heads"]
        self.nkv = dims["num_kv_heads"]
        self.hd = dims["head_dim"]
        hidden = dims["hidden_size"]
        self.qkv_proj = nn.Linear(hidden, (self.nh + 2 * self.nkv) * self.hd, bias=False)
        self.o_proj = nn.Linear(self.nh * self.hd, hidden, bias=False)
        self.norm = nn.RMSNorm(hidden)
        self.attn_op = attn_op
        self.trt_op = trt_op
        # options handed down to the trtllm-gen path as keyword arguments
        self.decode_cfg = dict(cfg.get("decode", {}))
        self.trt_context = cfg["attention"].get("prefill_backend", "fa2") == "trtllm-gen"

    def forward(self, h: torch.Tensor, kv_cache: torch.Tensor, meta: FlashInferAttentionMetadata) -> torch.Tensor:
        x = self.norm(h)
        q, k, v = self.qkv_proj(x).split([self.nh * self.hd, self.nkv * self.hd, self.nkv * self.hd], dim=-1)
        q = q.view(-1, self.nh, self.hd)
        k = k.view(-1, self.nkv, self.hd)
        v = v.view(-1, self.nkv, self.hd)
        flat = kv_cache.view(2, -1, self.nkv, self.hd)
        flat[0].index_copy_(0, meta.slot_mapping, k)
        flat[1].index_copy_(0, meta.slot_mapping, v)
        if self.trt_op is not None and meta.num_prefills == 0:
            o = self.trt_op.forward(q, kv_cache, meta, **self.decode_cfg)
        elif self.trt_op is not None and self.trt_context:
            o = self.trt_op.forward_context(q, kv_cache, meta)
        else:
            o = self.attn_op.forward(q, k, v, kv_cache, meta, self.layer_id)
        return h + self.o_proj(o.reshape(-1, self.nh * self.hd))


class DecoderModel(nn.Module):
    def __init__(self, cfg: Mapping[str, Any], attn_op: FlashInferAttnOp, trt_op: Optional[TrtllmGenDecodeOp],
                 device: torch.device):
        super().__init__()
        dims = cfg["model_dims"]
        kv = {"num_pages": 32768, **cfg.get("kv_cache", {})}
        page_size = cfg["attention"].get("page_size", 16)
        self.embed = nn.Embedding(dims["vocab_size"], dims["hidden_size"])
        self.layers = nn.ModuleList(
            [DecoderLayer(i, cfg, attn_op, trt_op) for i in range(dims["num_layers"])]
        )
        self.lm_head = nn.Linear(dims["hidden_size"], dims["vocab_size"], bias=False)
        self.attn_op = attn_op
        self.num_mtp_layers = cfg.get("speculative", {}).get("num_mtp_layers", 0)
        self.mtp_proj = nn.Linear(dims["hidden_size"], dims["num_qo_heads"] * dims["head_dim"], bias=False)
        self.mtp_out = nn.Linear(dims["num_qo_heads"] * dims["head_dim"], dims["hidden_size"], bias=False)
        self.nh = dims["num_qo_heads"]
        self.hd = dims["head_dim"]
        self.kv_caches = [
            torch.zeros(kv["num_pages"], 2, page_size, dims["num_kv_heads"], dims["head_dim"],
                        dtype=torch.bfloat16, device=device)
            for _ in range(dims["num_layers"])
        ]

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, meta: FlashInferAttentionMetadata):
        h = self.embed(input_ids)
        for layer, kv_cache in zip(self.layers, self.kv_caches):
            h = layer(h, kv_cache, meta)
        if self.num_mtp_layers > 0:
            q = self.mtp_proj(h).view(-1, self.nh, self.hd)
            h = h + self.mtp_out(self.attn_op.forward_mtp(q, self.kv_caches[-1], meta).flatten(1))
        return self.lm_head(h)
