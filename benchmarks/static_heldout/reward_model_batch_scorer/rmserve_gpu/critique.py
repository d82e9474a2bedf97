"""Critique generation: a few greedy tokens after the scored sequence ("Critique:" template + reasons).

The template is prefilled over the cached prompt+response pages with an eager paged prefill. Decode steps
run one CUDA graph per batch bucket over graph-mode decode wrappers; scored sequences that share a prompt
(best-of-n) read the prompt's pages through a separate prefix wrapper and the two states are merged.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Dict, List, Optional

import numpy as np
import torch
from flashinfer import (
    BatchDecodeWithPagedKVCacheWrapper,
    BatchPrefillWithPagedKVCacheWrapper,
    merge_state,
    trtllm_batch_decode_with_kv_cache,
)

from rmserve.kernels.workspace import get_critique_trtllm_workspace, zeroed_workspace
from rmserve.settings import RewardSettings
from rmserve_gpu.graphs import CritiqueGraphPool
from rmserve_gpu.model import RewardModel
from rmserve_gpu.pages import CritiquePagePool

logger = logging.getLogger(__name__)

CRITIQUE_TEMPLATE = [198, 34, 14067, 2428, 25]  # "\nCritique:"


@dataclass
class CritiqueBatch:
    request_ids: List[str]
    prefix_ids: List[str]  # the shared prompt entry of each row (best-of-n groups)


def _bump_lengths(lens: torch.Tensor) -> None:
    """One more token in each row's last page (pages were extended on the host beforehand)."""
    lens.add_(1)


class CritiqueDecoder:
    def __init__(self, settings: RewardSettings, model: RewardModel, kv_pool: CritiquePagePool, device: torch.device):
        self.settings = settings
        self.model = model
        self.kv_pool = kv_pool
        self.device = device
        s = settings
        max_bs = s.max_critique_bs
        self.float_workspace = torch.zeros(s.critique_graph_ws_bytes(), dtype=torch.uint8, device=device)  # ok: FC106
        self.trtllm_workspace = get_critique_trtllm_workspace(s.critique_ws_bytes, device.index or 0)
        self.prefix_workspace = zeroed_workspace(s.critique_ws_bytes, device)

        self.kv_indptr = torch.zeros(max_bs + 1, dtype=torch.int32, device=device)
        self.kv_indices = torch.zeros(max_bs * s.critique_max_pages_per_req, dtype=torch.int32, device=device)
        self.kv_last_page_len = torch.ones(max_bs, dtype=torch.int32, device=device)
        self.kv_indptr_cpu = torch.zeros(max_bs + 1, dtype=torch.int32, pin_memory=True)
        self.last_page_len_cpu = torch.ones(max_bs, dtype=torch.int32, pin_memory=True)
        self.static_tokens = torch.zeros(max_bs, dtype=torch.int64, device=device)
        self.static_positions = torch.zeros(max_bs, dtype=torch.int64, device=device)
        self.static_out_loc = torch.zeros(max_bs, dtype=torch.int64, device=device)
        self.static_kv_lens = torch.ones(max_bs, dtype=torch.int32, device=device)
        self.large_out_loc: Optional[torch.Tensor] = None
        # critiques never emit the reward model's special tokens
        self.logit_bias_gpu = torch.zeros(s.vocab_size, dtype=torch.float32, device=device)
        self.logit_bias_gpu[s.vocab_size - 256 :] = float("-inf")
        self._use_cuda_graph = True  # ok: FC103

        self.graph_wrappers: Dict[int, BatchDecodeWithPagedKVCacheWrapper] = {}
        for bs in s.critique_batch_sizes:
            self.graph_wrappers[bs] = self._build_graph_wrapper(bs)
        self.prefix_decode = BatchDecodeWithPagedKVCacheWrapper(self.prefix_workspace, "HND", backend="trtllm-gen")
        self.template_prefill = BatchPrefillWithPagedKVCacheWrapper(self.float_workspace, "HND")
        self.graph_pool = CritiqueGraphPool(self)

    def _build_graph_wrapper(self, bs: int) -> BatchDecodeWithPagedKVCacheWrapper:
        w = BatchDecodeWithPagedKVCacheWrapper(
            self.float_workspace,
            "HND",
            use_cuda_graph=True,
            paged_kv_indptr_buffer=self.kv_indptr[: bs + 1],
            paged_kv_indices_buffer=self.kv_indices,
            paged_kv_last_page_len_buffer=self.kv_last_page_len[:bs],
        )
        self.kv_last_page_len[:bs].fill_(1)  # ok: FC104
        return w

    def _plan_kwargs(self) -> dict:
        s = self.settings
        return dict(num_qo_heads=s.num_q_heads, num_kv_heads=s.num_kv_heads, head_dim=s.head_dim, page_size=s.page_size)

    # ------------------------------------------------------------------ per step metadata

    def plan_decode(self, bs: int, rids: List[str], prefix_rids: List[str]) -> None:
        p_counts, p_flat, p_last = self.kv_pool.table(prefix_rids)
        p_indptr_cpu = torch.tensor(np.r_[0, np.cumsum(p_counts)], dtype=torch.int32)
        p_indices = torch.from_numpy(p_flat).to(self.device, non_blocking=True)
        p_last_cpu = torch.tensor(p_last, dtype=torch.int32)
        self.prefix_decode.plan(p_indptr_cpu, p_indices, p_last_cpu, **self._plan_kwargs())
        counts, flat, last = self.kv_pool.table(rids)
        rows = len(rids)
        n = int(flat.shape[0])
        indptr_np = self.kv_indptr_cpu.numpy()
        indptr_np[0] = 0
        np.cumsum(counts, out=indptr_np[1 : rows + 1])
        indptr_np[rows + 1 : bs + 1] = n
        self.last_page_len_cpu.numpy()[:rows] = last
        self.kv_indptr[: bs + 1].copy_(self.kv_indptr_cpu[: bs + 1], non_blocking=True)  # ok: FC104
        self.kv_indices[:n].copy_(torch.from_numpy(flat).pin_memory(), non_blocking=True)
        self.kv_last_page_len[:bs].copy_(self.last_page_len_cpu[:bs], non_blocking=True)
        w = self.graph_wrappers[bs]
        w.plan(  # ok: FC102
            **dict(
                indptr=self.kv_indptr_cpu[: bs + 1],
                indices=self.kv_indices[:n],
                last_page_len=self.last_page_len_cpu[:bs],
                **self._plan_kwargs(),
            )
        )
        # stale page ids past this step's tables must not be read by padded rows
        self.kv_indices[n:].zero_()  # expect: FC104

    # ------------------------------------------------------------------ forward pieces

    def attend(self, layer_id: int, q: torch.Tensor, bs: int) -> torch.Tensor:
        kv = self.kv_pool.layer(layer_id)
        o_own, lse_own = self.graph_wrappers[bs].run(q, kv, return_lse=True)  # ok: FC108
        o_pre, lse_pre = self.prefix_decode.run(q, kv, return_lse=True)  # expect: FC108
        return merge_state(o_own, lse_own, o_pre, lse_pre)[0]

    def decode_body(self, bs: int) -> torch.Tensor:
        m = self.model
        h = m.embed(self.static_tokens[:bs])
        for layer in m.layers:
            q, k, v = layer.qkv_rope(h, self.static_positions[:bs])
            self.kv_pool.store(layer.layer_id, k, v, self.static_out_loc[:bs])
            h = layer.finish(h, self.attend(layer.layer_id, q, bs))
        return m.lm_head(m.final_norm(h))

    def _decode_large(self, rids: List[str], tokens: torch.Tensor, positions: torch.Tensor, out_loc_np: np.ndarray) -> torch.Tensor:
        n = len(rids)
        if self.large_out_loc is None or self.large_out_loc.numel() < n:
            self.large_out_loc = torch.empty(2 * n, dtype=torch.int64, device=self.device)  # expect: FC107
        self.large_out_loc[:n].copy_(torch.from_numpy(out_loc_np), non_blocking=True)
        counts, flat, _ = self.kv_pool.table(rids)
        width = int(counts.max())
        table_np = np.zeros((n, width), dtype=np.int32)
        for i, rid in enumerate(rids):
            table_np[i, : counts[i]] = self.kv_pool.pages[rid]
        block_tables = torch.from_numpy(table_np).to(self.device, non_blocking=True)
        seq_lens = torch.tensor([self.kv_pool.lens[r] for r in rids], dtype=torch.int32).to(self.device, non_blocking=True)
        max_len = max(self.kv_pool.lens[r] for r in rids)
        m = self.model
        h = m.embed(tokens)
        for layer in m.layers:
            q, k, v = layer.qkv_rope(h, positions)
            self.kv_pool.store(layer.layer_id, k, v, self.large_out_loc[:n])
            o = trtllm_batch_decode_with_kv_cache(
                q, self.kv_pool.layer(layer.layer_id), self.trtllm_workspace, block_tables, seq_lens, max_len,
                bmm1_scale=self.settings.head_dim ** -0.5, bmm2_scale=1.0,
            )
            h = layer.finish(h, o)
        return m.lm_head(m.final_norm(h))

    # ------------------------------------------------------------------ entry points

    @torch.inference_mode()
    def prefill_template(self, rids: List[str]) -> torch.Tensor:
        """Run the critique template over each row's cached pages; returns the first critique token."""
        s = self.settings
        t = len(CRITIQUE_TEMPLATE)
        for rid in rids:
            self.kv_pool.extend(rid, t)
        counts, flat, last = self.kv_pool.table(rids)
        qo_indptr_cpu = torch.arange(0, (len(rids) + 1) * t, t, dtype=torch.int32)
        kv_indptr_cpu = torch.tensor(np.r_[0, np.cumsum(counts)], dtype=torch.int32)
        kv_indices = torch.from_numpy(flat).to(self.device, non_blocking=True)
        self.template_prefill.plan(  # ok: FC102
            qo_indptr_cpu, kv_indptr_cpu, kv_indices, torch.tensor(last, dtype=torch.int32), s.num_q_heads, s.num_kv_heads,
            s.head_dim, s.page_size, causal=True,
        )
        ids = torch.tensor(CRITIQUE_TEMPLATE * len(rids), dtype=torch.int64).to(self.device, non_blocking=True)
        pos_np = np.concatenate([np.arange(self.kv_pool.lens[r] - t, self.kv_pool.lens[r]) for r in rids])
        out_loc_np = np.concatenate([self.kv_pool.out_locs(r, self.kv_pool.lens[r] - t, t) for r in rids])
        positions = torch.from_numpy(pos_np).to(self.device, non_blocking=True)
        out_loc = torch.from_numpy(out_loc_np).to(self.device, non_blocking=True)
        m = self.model
        h = m.embed(ids)
        for layer in m.layers:
            q, k, v = layer.qkv_rope(h, positions)
            self.kv_pool.store(layer.layer_id, k, v, out_loc)
            h = layer.finish(h, self.template_prefill.run(q, self.kv_pool.layer(layer.layer_id)))
        last_rows = torch.arange(t - 1, len(rids) * t, t, device=self.device)
        return torch.argmax(m.lm_head(m.final_norm(h.index_select(0, last_rows))), dim=-1)

    def bucket_for(self, n: int) -> int:
        for bs in self.settings.critique_batch_sizes:
            if bs >= n:
                return bs
        return -1

    @torch.inference_mode()
    def decode_tokens(self, batch: CritiqueBatch, first_tokens: torch.Tensor) -> List[List[int]]:
        rids = batch.request_ids
        n = len(rids)
        bs = self.bucket_for(n)
        out: List[List[int]] = [[] for _ in range(n)]
        tokens = first_tokens
        for _ in range(self.settings.critique_max_tokens):
            pos_np = np.array([self.kv_pool.lens[r] for r in rids], dtype=np.int64)
            for rid in rids:
                self.kv_pool.extend(rid)
            out_loc_np = np.concatenate([self.kv_pool.out_locs(r, self.kv_pool.lens[r] - 1, 1) for r in rids])
            if bs > 0 and bs in self.graph_pool.graphs:
                self.static_tokens[:n].copy_(tokens)
                self.static_positions[:n].copy_(torch.from_numpy(pos_np), non_blocking=True)
                self.static_out_loc[:n].copy_(torch.from_numpy(out_loc_np), non_blocking=True)
                self.plan_decode(bs, rids, batch.prefix_ids)
                logits = self.graph_pool.replay_bucket(bs)[:n]
                # keep the bound lengths current for the trtllm fallback without another host round trip
                _bump_lengths(self.kv_last_page_len[:n])  # expect: FC104
            else:
                positions = torch.from_numpy(pos_np).to(self.device, non_blocking=True)
                logits = self._decode_large(rids, tokens, positions, out_loc_np)
            tokens = torch.argmax(logits.float() + self.logit_bias_gpu, dim=-1)
            toks = tokens.tolist()  # expect: FC101
            for i, t in enumerate(toks):
                out[i].append(t)
            if all(o[-1] == self.settings.eos_token_id for o in out):
                break
        return out
