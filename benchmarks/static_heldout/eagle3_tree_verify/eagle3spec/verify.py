"""Tree verification by rejection sampling, structured-output masks, and the step that ties it together."""
from __future__ import annotations

from typing import Callable, List, Optional, Sequence

import torch

from eagle3spec.attention.tree_attn import CommonAttentionMetadata, FlashInferTreeMetadataBuilder
from eagle3spec.proposer import Eagle3Proposer
from eagle3spec.tree import SpecTree, path_accept_len


class TreeStepState:
    """Scratch of one verification, built every step."""

    def __init__(self, n: int, num_nodes: int, depth: int, device: str) -> None:
        self.accepted = torch.zeros(n, num_nodes, dtype=torch.bool, device=device)  # ok: FC107
        self.out_tokens = torch.zeros(n, depth + 2, dtype=torch.int64, device=device)


class TreeVerifier:
    def __init__(
        self, tree: SpecTree, builder: FlashInferTreeMetadataBuilder, max_num_reqs: int, device: str = "cuda",
    ) -> None:
        self.tree = tree
        self.builder = builder
        self.device = device
        self.paths = torch.as_tensor(tree.paths, device=device)
        self.parents = torch.as_tensor(tree.parents, device=device)
        self.bit_shifts = torch.arange(32, dtype=torch.int32, device=device)
        self.out_host = torch.zeros(max_num_reqs, tree.max_depth + 1, dtype=torch.int64, pin_memory=True)
        self.accept_len_host = torch.zeros(max_num_reqs, dtype=torch.int32, pin_memory=True)
        self.done = torch.cuda.Event()

    def _apply_bitmask(self, logits: torch.Tensor, bitmask: torch.Tensor) -> torch.Tensor:
        # bitmask: [n, T, ceil(V / 32)] int32 words from the grammar backend; bit v % 32 of word v // 32 allows v
        vocab = logits.shape[-1]
        bits = (bitmask.unsqueeze(-1) >> self.bit_shifts) & 1
        allowed = bits.flatten(-2)[..., :vocab].bool()
        return torch.where(allowed, logits, torch.full_like(logits, float("-inf")))  # ok: FC101

    def verify(
        self, target_logits: torch.Tensor, draft_tokens: torch.Tensor, draft_probs: torch.Tensor,
        temperatures: torch.Tensor, grammar_bitmask: Optional[torch.Tensor], reqs: Sequence,
    ) -> torch.Tensor:
        n, T = draft_tokens.shape
        D = self.tree.max_depth
        state = TreeStepState(n, T, D, self.device)
        logits = target_logits.view(n, T, -1)
        if grammar_bitmask is not None:
            logits = self._apply_bitmask(logits, grammar_bitmask)
        probs = torch.softmax(logits / temperatures.view(n, 1, 1), dim=-1)

        # node j >= 1 is accepted with probability min(1, p(token_j | parent) / q(token_j | parent))
        parent = self.parents[1:]
        p_target = probs[:, parent, :].gather(-1, draft_tokens[:, 1:, None]).squeeze(-1)
        q_draft = draft_probs[:, 1:].clamp_min(1e-10)
        state.accepted[:, 0] = True
        state.accepted[:, 1:] = torch.rand_like(p_target) * q_draft <= p_target
        per_path = path_accept_len(state.accepted, self.paths)
        best = per_path.argmax(dim=-1)
        accept_len = per_path.gather(1, best[:, None]).squeeze(1)
        best_path = self.paths[best]

        # drafted tokens along the best path (root excluded), then a bonus token sampled at the last accepted node
        last_node = best_path.gather(1, (accept_len - 1)[:, None]).squeeze(1)
        bonus = torch.multinomial(probs[torch.arange(n, device=self.device), last_node], 1).squeeze(1)
        state.out_tokens[:, : D + 1] = draft_tokens.gather(1, best_path.clamp_min(0))
        state.out_tokens.scatter_(1, accept_len[:, None], bonus[:, None])
        out = state.out_tokens[:, 1:]

        # the draft graphs replay with the last plan: drop the rejected nodes from their pages right here
        num_rejected = (D + 1 - accept_len).int()
        self.builder.g_last_page_len[:, :n] -= num_rejected.view(1, -1)  # expect: FC104

        self.out_host[:n].copy_(out, non_blocking=True)  # ok: FC101
        self.accept_len_host[:n].copy_(accept_len, non_blocking=True)
        self.done.record()
        for i, req in enumerate(reqs):
            if req.grammar is not None:
                req.grammar.accept_tokens(out[i, : accept_len[i]].tolist())  # expect: FC101
        return out


class SpecDecodeRunner:
    """One speculative step: verify the tree with the target model, then draft the next tree."""

    def __init__(
        self, target_forward: Callable, proposer: Eagle3Proposer, verifier: TreeVerifier,
        builder: FlashInferTreeMetadataBuilder, max_num_reqs: int, max_pages: int, device: str = "cuda",
    ) -> None:
        self.target_forward = target_forward
        self.proposer = proposer
        self.verifier = verifier
        self.builder = builder
        self.device = device
        n = max_num_reqs
        self.query_start_loc = torch.zeros(n + 1, dtype=torch.int32, device=device)
        self.query_start_loc_cpu = torch.zeros(n + 1, dtype=torch.int32, pin_memory=True)
        self.seq_lens = torch.zeros(n, dtype=torch.int32, device=device)
        self.seq_lens_cpu = torch.zeros(n, dtype=torch.int32, pin_memory=True)
        self.block_table = torch.zeros(n, max_pages, dtype=torch.int32, device=device)
        self.block_table_cpu = torch.zeros(n, max_pages, dtype=torch.int32, pin_memory=True)

    def common_metadata(self, n: int, num_tokens: int) -> CommonAttentionMetadata:
        self.query_start_loc[: n + 1].copy_(self.query_start_loc_cpu[: n + 1], non_blocking=True)
        self.seq_lens[:n].copy_(self.seq_lens_cpu[:n], non_blocking=True)
        self.block_table[:n].copy_(self.block_table_cpu[:n], non_blocking=True)
        return CommonAttentionMetadata(
            query_start_loc=self.query_start_loc[: n + 1],
            query_start_loc_cpu=self.query_start_loc_cpu[: n + 1],
            seq_lens=self.seq_lens[:n],
            seq_lens_cpu=self.seq_lens_cpu[:n],
            block_table_tensor=self.block_table[:n],
            block_table_cpu=self.block_table_cpu[:n],
            num_reqs=n,
            num_actual_tokens=num_tokens,
        )

    def step(self, batch) -> torch.Tensor:
        n = batch.num_reqs
        T = self.builder.T
        common = self.common_metadata(n, n * T)
        tree_meta = self.builder.build(0, common)
        logits, aux_hidden = self.target_forward(batch.tree_input_ids, batch.tree_positions, tree_meta)
        out = self.verifier.verify(
            logits, batch.draft_tokens, batch.draft_probs, batch.temperatures, batch.grammar_bitmask, batch.reqs
        )
        return self.proposer.propose(
            aux_hidden,
            batch.accepted_input_ids,
            batch.accepted_positions,
            batch.last_accepted,
            batch.slot_mapping,
            common,
        )
