"""Requests of both kinds and the mixed batch: [embedding tokens | prefill tokens | decode tokens]."""
from dataclasses import dataclass, field
from typing import List

import numpy as np
import torch


@dataclass
class EmbedRequest:
    rid: int
    token_ids: List[int]


@dataclass
class GenRequest:
    rid: int
    token_ids: List[int]
    pages: List[int]
    max_new_tokens: int
    prefilled: bool = False
    output_ids: List[int] = field(default_factory=list)

    @property
    def seq_len(self) -> int:
        return len(self.token_ids) + len(self.output_ids)


@dataclass
class MixedBatch:
    num_embed: int
    num_prefill: int
    num_decode: int
    input_ids: torch.Tensor
    positions: torch.Tensor
    is_embed: torch.Tensor              # device, one flag per request
    embed_cu_seqlens: torch.Tensor      # device
    embed_cu_seqlens_cpu: torch.Tensor
    embed_seq_lens: torch.Tensor        # device
    gen_qo_indptr_cpu: torch.Tensor
    gen_kv_indptr_cpu: torch.Tensor
    gen_kv_indices: torch.Tensor        # device
    gen_last_page_len_cpu: torch.Tensor
    gen_seq_lens_cpu: torch.Tensor
    gen_positions: torch.Tensor         # device
    out_cache_loc: torch.Tensor         # device
    num_gen_tokens: torch.Tensor        # device scalar

    @classmethod
    def build(cls, embeds: List[EmbedRequest], gens: List[GenRequest], page_size: int, device: torch.device) -> "MixedBatch":
        prefill = [g for g in gens if not g.prefilled]
        decode = [g for g in gens if g.prefilled]
        ordered = prefill + decode
        e_lens = np.array([len(e.token_ids) for e in embeds], dtype=np.int32)
        e_cu = np.zeros(len(embeds) + 1, dtype=np.int32)
        np.cumsum(e_lens, out=e_cu[1:])
        q_lens = np.array([len(g.token_ids) for g in prefill] + [1] * len(decode), dtype=np.int32)
        qo = np.zeros(len(ordered) + 1, dtype=np.int32)
        np.cumsum(q_lens, out=qo[1:])
        kv = np.zeros(len(ordered) + 1, dtype=np.int32)
        np.cumsum([len(g.pages) for g in ordered], out=kv[1:])
        seq = np.array([g.seq_len for g in ordered], dtype=np.int32)
        last = (seq - 1) % page_size + 1
        ids = [t for e in embeds for t in e.token_ids]
        ids += [t for g in prefill for t in g.token_ids] + [g.output_ids[-1] for g in decode]
        pos = [p for e in embeds for p in range(len(e.token_ids))]
        gen_pos = [p for g in prefill for p in range(len(g.token_ids))] + [g.seq_len - 1 for g in decode]
        loc = [g.pages[p // page_size] * page_size + p % page_size for g in ordered for p in
               (range(len(g.token_ids)) if not g.prefilled else [g.seq_len - 1])]
        is_embed = torch.tensor([True] * len(embeds) + [False] * len(ordered), dtype=torch.bool, device=device)
        return cls(
            num_embed=len(embeds),
            num_prefill=len(prefill),
            num_decode=len(decode),
            input_ids=torch.tensor(ids, dtype=torch.int64).to(device, non_blocking=True),
            positions=torch.tensor(pos + gen_pos, dtype=torch.int64).to(device, non_blocking=True),
            is_embed=is_embed,
            embed_cu_seqlens=torch.tensor(e_cu, dtype=torch.int32, device=device),
            embed_cu_seqlens_cpu=torch.from_numpy(e_cu),
            embed_seq_lens=torch.tensor(e_lens, dtype=torch.int32, device=device),
            gen_qo_indptr_cpu=torch.from_numpy(qo),
            gen_kv_indptr_cpu=torch.from_numpy(kv),
            gen_kv_indices=torch.tensor([p for g in ordered for p in g.pages], dtype=torch.int32, device=device),
            gen_last_page_len_cpu=torch.from_numpy(last),
            gen_seq_lens_cpu=torch.from_numpy(seq),
            gen_positions=torch.tensor(gen_pos, dtype=torch.int64, device=device),
            out_cache_loc=torch.tensor(loc, dtype=torch.int64, device=device),
            num_gen_tokens=(~is_embed).sum(),
        )
