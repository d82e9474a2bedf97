"""The EAGLE-3 drafter: one decoder layer over [token embedding; fused target features], run level by level."""
from __future__ import annotations

from typing import List, Optional, Tuple

import torch
from torch import nn
from flashinfer.rope import apply_rope_pos_ids_inplace

from eagle3spec.attention.tree_attn import (
    CommonAttentionMetadata,
    FlashInferTreeMetadataBuilder,
    TreeAttentionMetadata,
)
from eagle3spec.tree import SpecConfig, SpecTree


class Eagle3DraftModel(nn.Module):
    def __init__(self, cfg) -> None:
        super().__init__()
        H = cfg.hidden_size
        self.nh, self.nkv, self.hd = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        # low, middle and high target layers are concatenated and projected back to H
        self.fc = nn.Linear(3 * H, H, bias=False)
        self.embed = nn.Embedding(cfg.vocab_size, H)
        self.qkv = nn.Linear(2 * H, (self.nh + 2 * self.nkv) * self.hd, bias=False)
        self.o_proj = nn.Linear(self.nh * self.hd, H, bias=False)
        self.mlp = nn.Sequential(nn.Linear(H, cfg.intermediate_size), nn.SiLU(), nn.Linear(cfg.intermediate_size, H))
        self.lm_head = nn.Linear(H, cfg.draft_vocab_size, bias=False)
        # draft vocabulary id -> target vocabulary id
        self.register_buffer("d2t", torch.zeros(cfg.draft_vocab_size, dtype=torch.int64))

    def fuse(self, aux: torch.Tensor) -> torch.Tensor:
        return self.fc(aux)

    def pre_attn(self, tokens: torch.Tensor, positions: torch.Tensor, hidden: torch.Tensor):
        x = torch.cat([self.embed(tokens), hidden], dim=-1)
        q, k, v = self.qkv(x).split([self.nh * self.hd, self.nkv * self.hd, self.nkv * self.hd], dim=-1)
        q = q.view(-1, self.nh, self.hd)
        k = k.view(-1, self.nkv, self.hd)
        v = v.view(-1, self.nkv, self.hd)
        apply_rope_pos_ids_inplace(q, k, positions)
        return q, k, v

    def post_attn(self, o: torch.Tensor, hidden: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        h = hidden + self.o_proj(o.flatten(1))
        h = h + self.mlp(h)
        return self.lm_head(h), h


class Eagle3Proposer:
    def __init__(
        self, spec_cfg: SpecConfig, model_cfg, tree: SpecTree, builder: FlashInferTreeMetadataBuilder,
        kv_cache: Tuple[torch.Tensor, torch.Tensor], device: str = "cuda",
    ) -> None:
        assert len(spec_cfg.aux_hidden_layer_ids) == 3, "EAGLE-3 fuses exactly three target layers"  # expect: FC109
        self.cfg = spec_cfg
        self.tree = tree
        self.builder = builder
        # (k, v), each [num_pages, page_size, num_kv_heads, head_dim]
        self.kv_cache = kv_cache
        self.device = device
        self.model = Eagle3DraftModel(model_cfg).to(device)
        self.layout = self.builder._kv_layout  # ok: FC103
        self.graph_runner = None

        n, T, D = builder.max_num_reqs, tree.num_nodes, tree.max_depth
        H = model_cfg.hidden_size
        # inputs the draft graphs read: the accepted tokens of the last verification (D + 1 slots per request)
        self.hidden_states = torch.zeros(n * (D + 1), 3 * H, dtype=torch.bfloat16, device=device)
        self.input_tokens = torch.zeros(n * (D + 1), dtype=torch.int64, device=device)
        self.positions = torch.zeros(n * T, dtype=torch.int32, device=device)
        self.last_accepted = torch.zeros(n, dtype=torch.int64, device=device)
        self.draft_tokens = torch.zeros(n, T, dtype=torch.int64, device=device)
        # KV slots of the accepted tokens, then of every tree node, request-major within each level
        self.slot_mapping = torch.zeros(n * (D + 1 + T), dtype=torch.int64, device=device)
        self.draft_probs_buf: Optional[torch.Tensor] = None

        # per level: the parent of every node (as a row of the previous level) and its rank among the siblings
        self.level_parent_rows: List[torch.Tensor] = [torch.zeros(0, dtype=torch.int64, device=device)]
        self.level_ranks: List[torch.Tensor] = [torch.zeros(0, dtype=torch.int64, device=device)]
        self.level_nodes: List[torch.Tensor] = []
        for d in range(D + 1):
            nodes = tree.level_nodes[d]
            self.level_nodes.append(torch.as_tensor(nodes, dtype=torch.int64, device=device))
            if d == 0:
                continue
            prev = {int(p): r for r, p in enumerate(tree.level_nodes[d - 1])}
            rows = [prev[int(tree.parents[i])] for i in nodes]
            self.level_parent_rows.append(torch.tensor(rows, dtype=torch.int64, device=device))
            self.level_ranks.append(torch.as_tensor(tree.ranks[nodes], dtype=torch.int64, device=device))

    def init_graph_inputs(self) -> None:
        """Called by the draft graph runner before capturing: every buffer the graphs touch must exist."""
        if self.draft_probs_buf is None:
            self.draft_probs_buf = torch.zeros(self.builder.max_num_reqs, self.tree.num_nodes, device=self.device)

    # ------------------------------------------------------------------ per step

    def propose(
        self, aux_hidden_states: List[torch.Tensor], accepted_tokens: torch.Tensor,
        accepted_positions: torch.Tensor, last_accepted: torch.Tensor, slot_mapping: torch.Tensor,
        common: CommonAttentionMetadata,
    ) -> torch.Tensor:
        n = common.num_reqs
        m = accepted_tokens.shape[0]
        # EAGLE-3: low, middle and high features of the accepted tokens, concatenated
        self.hidden_states = torch.cat(aux_hidden_states, dim=-1)  # expect: FC107
        self.input_tokens[:m].copy_(accepted_tokens)
        self.positions[:m].copy_(accepted_positions)
        self.last_accepted[:n].copy_(last_accepted)
        self.slot_mapping[: slot_mapping.shape[0]].copy_(slot_mapping)
        if self.draft_probs_buf is None:
            self.draft_probs_buf = torch.zeros(self.builder.max_num_reqs, self.tree.num_nodes, device=self.device)  # ok: FC107

        bs = self.graph_runner.bucket_for(n) if self.graph_runner is not None else None
        if bs is not None:
            self.builder.prepare_draft_replay(bs, n, common.seq_lens_cpu, common.block_table_cpu)
            self.graph_runner.replay(bs)
            return self.draft_tokens[:n]
        meta = self.builder.build_draft(n, common)
        return self.run_levels(n, meta, early_exit=True)

    def run_levels(self, n: int, meta: TreeAttentionMetadata, early_exit: bool = False) -> torch.Tensor:
        D = self.tree.max_depth
        m = n * (D + 1)
        hidden = self.model.fuse(self.hidden_states[:m])
        tokens = self.input_tokens[:m]
        positions = self.positions[:m]
        # level 0: rerun the accepted tokens; the root's distribution is read at the last accepted slot
        logits, hidden = self._draft_step(tokens, positions, hidden, meta, 0, self.slot_mapping[:m])
        rows = torch.arange(n, device=self.device) * (D + 1) + self.last_accepted[:n]
        probs = torch.softmax(logits[rows].float(), dim=-1)
        hidden = hidden[rows]
        base = positions.view(n, D + 1).gather(1, self.last_accepted[:n, None]).squeeze(1)
        for depth in range(1, D + 1):
            width = self.tree.level_width(depth)
            top_p, top_i = probs.view(n, -1, probs.shape[-1]).topk(self.tree.max_rank, dim=-1)
            parent_rows = self.level_parent_rows[depth]
            ranks = self.level_ranks[depth]
            tokens = self.model.d2t[top_i[:, parent_rows, ranks]].reshape(-1)
            self.draft_tokens[:n, self.level_nodes[depth]] = tokens.view(n, width)
            self.draft_probs_buf[:n, self.level_nodes[depth]] = top_p[:, parent_rows, ranks]
            if early_exit and (top_p[:, :, 0] < self.cfg.min_draft_prob).all():  # expect: FC101
                break
            positions = (base[:, None] + depth).expand(n, width).reshape(-1).int()
            hidden = hidden.view(n, -1, hidden.shape[-1])[:, parent_rows].reshape(n * width, -1)
            start = m + n * self.tree.nodes_before(depth)
            slots = self.slot_mapping[start : start + n * width]
            logits, hidden = self._draft_step(tokens, positions, hidden, meta, depth, slots)
            probs = torch.softmax(logits.float(), dim=-1)
        return self.draft_tokens[:n]

    def _draft_step(
        self, tokens: torch.Tensor, positions: torch.Tensor, hidden: torch.Tensor, meta: TreeAttentionMetadata,
        depth: int, slots: torch.Tensor,
    ) -> Tuple[torch.Tensor, torch.Tensor]:
        q, k, v = self.model.pre_attn(tokens, positions, hidden)
        self._append_kv(k, v, slots)
        if depth == 0:
            o = self.builder.first_step_wrapper.run(q, self.kv_cache)  # expect: FC108
        else:
            o = meta.level_wrappers[depth - 1].run(q, self.kv_cache)  # ok: FC108
        return self.model.post_attn(o, hidden)

    def _append_kv(self, k: torch.Tensor, v: torch.Tensor, slots: torch.Tensor) -> None:
        k_cache, v_cache = self.kv_cache
        k_cache.view(-1, k.shape[1], k.shape[2]).index_copy_(0, slots, k.to(k_cache.dtype))
        v_cache.view(-1, v.shape[1], v.shape[2]).index_copy_(0, slots, v.to(v_cache.dtype))
