from dataclasses import dataclass
from typing import List

import torch


@dataclass
class EvalLimits:
    max_reqs: int = 256
    max_tokens: int = 65536
    max_len: int = 8192
    num_heads: int = 32
    num_kv_heads: int = 8
    head_dim: int = 128
    page_size: int = 16
    max_pages: int = 262144
    score_workspace_bytes: int = 256 << 20
    buckets: tuple = (1, 8, 16, 32, 64)


@dataclass
class ScoreBatch:
    input_ids: torch.Tensor
    target_ids: torch.Tensor
    cu_seqlens: torch.Tensor
    cont_spans_cpu: torch.Tensor
    cont_lens: torch.Tensor
    num_cont_tokens: int
    page_ids: torch.Tensor
    num_reqs: int


def build_score_batch(contexts: List[List[int]], conts: List[List[int]], device) -> ScoreBatch:
    ids, tgts, cu, spans, lens = [], [], [0], [], []
    for ctx, cont in zip(contexts, conts):
        seq = ctx + cont
        ids.extend(seq[:-1])
        tgts.extend([-1] * (len(ctx) - 1) + cont)
        spans.append((cu[-1] + len(ctx) - 1, cu[-1] + len(seq) - 1))
        lens.append(len(cont))
        cu.append(cu[-1] + len(seq) - 1)
    return ScoreBatch(
        input_ids=torch.tensor(ids, dtype=torch.long, device=device),
        target_ids=torch.tensor(tgts, dtype=torch.long, device=device),
        cu_seqlens=torch.tensor(cu, dtype=torch.int32, device=device),
        cont_spans_cpu=torch.tensor(spans, dtype=torch.int64),
        cont_lens=torch.tensor(lens, dtype=torch.long, device=device),
        num_cont_tokens=sum(lens),
        page_ids=torch.zeros(len(ids), dtype=torch.int32, device=device),
        num_reqs=len(contexts),
    )
