"""The talker: a speech LM over codec tokens, conditioned on the thinker's hidden states."""

from typing import List, Optional

import torch
from flashinfer import BatchDecodeWithPagedKVCacheWrapper
from torch import nn

from omni import ComponentConfig, OmniConfig
from om_attn.component import ComponentAttention, ComponentBatch


class TalkerAttention(ComponentAttention):
    WORKSPACE_BYTES = 96 * 1024 * 1024

    def __init__(self, cc: ComponentConfig, device: torch.device):
        workspace = torch.zeros(self.WORKSPACE_BYTES, dtype=torch.uint8, device=device)  # expect: FC106
        super().__init__("talker", cc, device, workspace, eager_backend="fa2")
        self._plan = self.eager.plan

    def plan_eager(self, batch: ComponentBatch) -> None:
        n = batch.batch_size
        self.fill_host(batch, n)
        # the talker scheduler keeps the page table on the device already
        self._plan(  # expect: FC102
            batch.kv_indptr, batch.kv_indices, self.host["kv_last_page_len"][:n],
            *self._plan_args(), q_data_type=self.cc.dtype,
        )


class TalkerLayer(nn.Module):
    def __init__(self, cc: ComponentConfig, attn: TalkerAttention):
        super().__init__()
        self.cc = cc
        self.attn = attn
        self.q_proj = nn.Linear(cc.hidden_size, cc.hidden_size)
        self.o_proj = nn.Linear(cc.hidden_size, cc.hidden_size)

    def forward(self, h: torch.Tensor, kv: torch.Tensor, bs: Optional[int]) -> torch.Tensor:
        q = self.q_proj(h).view(h.shape[0], self.cc.num_qo_heads, self.cc.head_dim)
        return h + self.o_proj(self.attn.run(q, kv, bs).reshape(h.shape[0], -1))


class TalkerLM(nn.Module):
    def __init__(self, cfg: OmniConfig, device: torch.device):
        super().__init__()
        cc = cfg.talker
        self.cc = cc
        self.attn = TalkerAttention(cc, device)
        self.in_proj = nn.Linear(cfg.thinker.hidden_size, cc.hidden_size)
        self.code_embed = nn.Embedding(cc.vocab_size, cc.hidden_size)
        self.layers = nn.ModuleList([TalkerLayer(cc, self.attn) for _ in range(cc.num_layers)])
        self.codec_head = nn.Linear(cc.hidden_size, cc.vocab_size)
        # code predictor: the remaining codebooks of the frame attend over the frame's own codes
        self.cp_proj = nn.Linear(cc.hidden_size, cc.hidden_size)
        self.code_predictor_decode = BatchDecodeWithPagedKVCacheWrapper(self.attn.workspace, "NHD")
        self.cp_heads = nn.ModuleList([nn.Linear(cc.hidden_size, cc.vocab_size) for _ in range(cfg.num_codebooks - 1)])
        self.kv_caches: List[torch.Tensor] = []
        self.cp_cache: Optional[torch.Tensor] = None

    def forward(self, thinker_hidden: torch.Tensor, prev_codes: torch.Tensor, bs: Optional[int]) -> torch.Tensor:
        h = self.in_proj(thinker_hidden) + self.code_embed(prev_codes)
        for layer, kv in zip(self.layers, self.kv_caches):
            h = layer(h, kv, bs)
        code0 = self.codec_head(h).argmax(-1)
        cp_q = self.cp_proj(h).view(h.shape[0], self.cc.num_qo_heads, self.cc.head_dim)
        cp = self.code_predictor_decode.run(cp_q, self.cp_cache)  # expect: FC108
        ctx = h + cp.reshape(h.shape)
        rest = [head(ctx).argmax(-1) for head in self.cp_heads]
        return torch.stack([code0] + rest, dim=-1)
