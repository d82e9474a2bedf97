"""One-model EAGLE3: the draft layers run inside the target model's forward (and so inside its CUDA graph),
sharing the target's KV cache manager. The worker accepts draft tokens, then runs the draft loop."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Optional

import torch
from torch import nn

from tensorrt_llm._torch.attention_backend.flashinfer import FlashInferAttention, FlashInferAttentionMetadata

MAX_DRAFT_STEPS = 8


@dataclass
class Eagle3SpecConfig:
    max_draft_len: int
    num_capture_layers: int = 3
    draft_workspace_bytes: int = 128 << 20


@dataclass(kw_only=True)
class Eagle3OneModelSpecMetadata:
    max_num_requests: int
    max_draft_len: int
    hidden_size: int
    num_capture_layers: int = 3
    is_cuda_graph: bool = False

    def __post_init__(self):
        rows = self.max_num_requests * (self.max_draft_len + 1)
        with torch.device("cuda"):
            self.hidden_states = torch.zeros(rows, self.hidden_size * self.num_capture_layers, dtype=torch.bfloat16)
            self.draft_tokens_cuda = torch.zeros((self.max_num_requests, self.max_draft_len), dtype=torch.int64)
        self.layers_to_capture: List[int] = []

    def create_cuda_graph_metadata(self, batch_size: int) -> "Eagle3OneModelSpecMetadata":
        return Eagle3OneModelSpecMetadata(
            max_num_requests=batch_size,
            max_draft_len=self.max_draft_len,
            hidden_size=self.hidden_size,
            num_capture_layers=self.num_capture_layers,
            is_cuda_graph=True,
        )

    def prepare(self, num_seqs: int, draft_tokens_host: torch.Tensor) -> None:
        self.draft_tokens_cuda[:num_seqs].copy_(draft_tokens_host, non_blocking=True)

    def maybe_capture_hidden_states(self, slot: int, hidden: torch.Tensor) -> None:
        n, h = hidden.shape
        self.hidden_states[:n, slot * h : (slot + 1) * h].copy_(hidden)


class DraftDecoderLayer(nn.Module):
    def __init__(self, layer_idx: int, hidden: int, num_heads: int, num_kv_heads: int, head_dim: int):
        super().__init__()
        self.q_size, self.kv_size = num_heads * head_dim, num_kv_heads * head_dim
        self.qkv = nn.Linear(2 * hidden, self.q_size + 2 * self.kv_size, bias=False)
        self.o_proj = nn.Linear(self.q_size, hidden, bias=False)
        self.attn = FlashInferAttention(layer_idx, num_heads, num_kv_heads, head_dim, is_draft=True, backend="fa2")

    def forward(self, embeds, hidden, metadata: FlashInferAttentionMetadata, draft_step: int) -> torch.Tensor:
        q, k, v = self.qkv(torch.cat([embeds, hidden], dim=-1)).split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        return hidden + self.o_proj(self.attn.forward(q, k, v, metadata, draft_step).reshape(hidden.shape[0], -1))


class Eagle3DraftModel(nn.Module):
    def __init__(self, hidden: int, vocab: int, num_heads: int, num_kv_heads: int, head_dim: int, num_capture_layers: int):
        super().__init__()
        self.embed = nn.Embedding(vocab, hidden)
        self.fc = nn.Linear(hidden * num_capture_layers, hidden, bias=False)
        self.midlayer = DraftDecoderLayer(0, hidden, num_heads, num_kv_heads, head_dim)
        self.lm_head = nn.Linear(hidden, vocab, bias=False)
        self.use_fa2 = self.midlayer.attn._backend == "fa2"  # ok: FC103

    def forward(self, input_ids, hidden_states, metadata: FlashInferAttentionMetadata, draft_step: int) -> torch.Tensor:
        if hidden_states.shape[-1] != self.embed.embedding_dim:
            hidden_states = self.fc(hidden_states)
        return self.midlayer.forward(self.embed(input_ids), hidden_states, metadata, draft_step)


class Eagle3OneModelWorker:
    def __init__(self, spec_config: Eagle3SpecConfig, mapping: Optional[Dict[str, int]] = None):
        assert spec_config.max_draft_len <= MAX_DRAFT_STEPS, spec_config.max_draft_len  # expect: FC109
        self.max_draft_len = spec_config.max_draft_len
        self.mapping = mapping or {}

    def sample_and_accept_draft_tokens(self, logits: torch.Tensor, spec_metadata: Eagle3OneModelSpecMetadata, batch_size: int):
        target = logits.argmax(dim=-1).view(batch_size, self.max_draft_len + 1)
        draft = spec_metadata.draft_tokens_cuda[:batch_size]
        accepted_prefix = (draft == target[:, :-1]).int().cumprod(dim=1)
        return target, accepted_prefix.sum(dim=1) + 1

    def forward(
        self,
        input_ids: torch.Tensor,
        position_ids: torch.Tensor,
        hidden_states: torch.Tensor,
        logits: torch.Tensor,
        attn_metadata: FlashInferAttentionMetadata,
        spec_metadata: Eagle3OneModelSpecMetadata,
        draft_model: Eagle3DraftModel,
    ) -> Dict[str, torch.Tensor]:
        batch_size = attn_metadata.num_seqs
        accepted_tokens, num_accepted_tokens = self.sample_and_accept_draft_tokens(logits, spec_metadata, batch_size)
        # offsets of each request's accepted tokens in the flattened target output
        torch.cumsum(num_accepted_tokens, 0, out=attn_metadata.qo_indptr[1 : batch_size + 1])  # expect: FC104
        total_accepted = num_accepted_tokens.sum()
        captured = spec_metadata.hidden_states[:total_accepted]  # expect: FC101

        # draft context pass over the target's tokens, reading the captured target hidden states
        hidden = draft_model.forward(input_ids, spec_metadata.hidden_states[: input_ids.shape[0]], attn_metadata, -1)
        last = attn_metadata.qo_indptr[1 : batch_size + 1] - 1
        next_tokens = draft_model.lm_head(hidden[last]).argmax(dim=-1)
        draft_tokens = [next_tokens]
        hidden = hidden[last]
        for i in range(self.max_draft_len - 1):
            hidden = draft_model.forward(next_tokens, hidden, attn_metadata, i)
            next_tokens = draft_model.lm_head(hidden).argmax(dim=-1)
            draft_tokens.append(next_tokens)
            if i + 1 < len(attn_metadata.draft_wrappers):
                # the next draft step sees one more token
                attn_metadata.draft_last_page_len[i + 1][:batch_size] = attn_metadata.draft_last_page_len[i][:batch_size] + 1  # expect: FC104
            attn_metadata.kv_lens_cuda[:batch_size] += 1  # ok: FC104
        return {
            "logits": logits,
            "accepted_tokens": accepted_tokens,
            "num_accepted_tokens": num_accepted_tokens,
            "next_draft_tokens": torch.stack(draft_tokens, dim=1),
            "captured_hidden": captured,
        }
