"""Last resort of the chain: a Triton split-k decode and a torch loop for prefill."""
from __future__ import annotations

from typing import Optional

import torch
import triton
import triton.language as tl

from fb_backends.base import AttentionBackendBase, StepInputs
from fbchain.capability import DeviceCaps
from fbchain.config import ChainConfig
from fbchain.registry import register_backend


@triton.jit
def paged_decode_partial_kernel(
    q_ptr, kv_ptr, indptr_ptr, indices_ptr, seq_lens_ptr, out_ptr, lse_ptr,
    sm_scale, stride_page, stride_tok, kv_off_v,
    HEAD_DIM: tl.constexpr, PAGE: tl.constexpr, NUM_SPLITS: tl.constexpr,
):
    assert HEAD_DIM % 16 == 0  # ok: FC109
    req = tl.program_id(0)
    head = tl.program_id(1)
    split = tl.program_id(2)
    start = tl.load(indptr_ptr + req)
    end = tl.load(indptr_ptr + req + 1)
    seq_len = tl.load(seq_lens_ptr + req)
    per_split = tl.cdiv(end - start, NUM_SPLITS)
    p0 = start + split * per_split
    p1 = tl.minimum(p0 + per_split, end)
    d = tl.arange(0, HEAD_DIM)
    t = tl.arange(0, PAGE)
    q = tl.load(q_ptr + (req * tl.num_programs(1) + head) * HEAD_DIM + d).to(tl.float32)
    m = -float("inf")
    s = 0.0
    acc = tl.zeros([HEAD_DIM], dtype=tl.float32)
    for p in range(p0, p1):
        page = tl.load(indices_ptr + p)
        base = kv_ptr + page * stride_page
        valid = (p - start) * PAGE + t < seq_len
        k = tl.load(base + t[:, None] * stride_tok + d[None, :], mask=valid[:, None], other=0.0).to(tl.float32)
        v = tl.load(base + kv_off_v + t[:, None] * stride_tok + d[None, :], mask=valid[:, None], other=0.0).to(tl.float32)
        x = tl.where(valid, tl.sum(k * q[None, :], axis=1) * sm_scale, -float("inf"))
        m_new = tl.maximum(m, tl.max(x, axis=0))
        w = tl.exp(x - m_new)
        s = s * tl.exp(m - m_new) + tl.sum(w, axis=0)
        acc = acc * tl.exp(m - m_new) + tl.sum(w[:, None] * v, axis=0)
        m = m_new
    row = (req * tl.num_programs(1) + head) * NUM_SPLITS + split
    tl.store(out_ptr + row * HEAD_DIM + d, acc / s)
    tl.store(lse_ptr + row, m + tl.log(s))


@register_backend("torch", priority=2)
class TorchFallbackBackend(AttentionBackendBase):
    name = "torch"

    def __init__(
        self,
        cfg: ChainConfig,
        caps: DeviceCaps,
        device: torch.device,
        scratch_indices: Optional[torch.Tensor] = None,
    ):
        self.cfg = cfg
        self.device = device
        self.scale = cfg.head_dim ** -0.5
        rows = cfg.max_num_seqs * cfg.num_qo_heads * cfg.max_splits
        self.workspace = torch.empty(rows * (cfg.head_dim + 1), dtype=torch.float32, device=device)  # ok: FC106
        # large enough for every page of the pool; the engine may lend us one it already has
        if scratch_indices is None:
            scratch_indices = torch.zeros(cfg.num_pages, dtype=torch.int32, device=device)
        self.scratch_indices = scratch_indices

    @classmethod
    def supports(cls, caps: DeviceCaps, dtype: torch.dtype, head_dim: int) -> bool:
        return True

    def forward_decode(self, q, kv, inputs: StepInputs, layer_idx: int, graph_wrapper=None) -> torch.Tensor:
        cfg = self.cfg
        n, h = inputs.num_reqs, cfg.num_qo_heads
        nnz = int(inputs.kv_indptr_cpu[n])
        # indices compacted per request so that one Triton grid covers the batch
        self.scratch_indices[:nnz].copy_(inputs.kv_indices[:nnz])  # expect: FC104
        rows = n * h * cfg.max_splits
        part = self.workspace[: rows * cfg.head_dim].view(n, h, cfg.max_splits, cfg.head_dim)
        lse = self.workspace[rows * cfg.head_dim : rows * (cfg.head_dim + 1)].view(n, h, cfg.max_splits)
        kv_l = kv.view(kv.shape[0], 2, cfg.page_size, -1)
        paged_decode_partial_kernel[(n, h, cfg.max_splits)](
            q, kv_l, inputs.kv_indptr, self.scratch_indices, inputs.seq_lens, part, lse,
            self.scale, kv_l.stride(0), kv_l.stride(2), kv_l.stride(1),
            HEAD_DIM=cfg.head_dim, PAGE=cfg.page_size, NUM_SPLITS=cfg.max_splits,
        )
        w = torch.softmax(lse, dim=-1)
        out = (part * w[..., None]).sum(dim=2)
        for i, seq_len in enumerate(inputs.seq_lens.tolist()):  # expect: FC101
            if seq_len == 0:
                out[i].zero_()
        return out.to(q.dtype)

    def forward_prefill(self, q, k, v, kv, inputs: StepInputs, layer_idx: int) -> torch.Tensor:
        cfg = self.cfg
        out = torch.empty_like(q)
        q_lens = (inputs.qo_indptr_cpu[1:] - inputs.qo_indptr_cpu[:-1]).tolist()  # ok: FC101
        kv_lens = inputs.seq_lens_cpu.tolist()
        group = cfg.num_qo_heads // cfg.num_kv_heads
        starts = inputs.qo_indptr_cpu.tolist()
        pstarts = inputs.kv_indptr_cpu.tolist()
        for i, (ql, kl) in enumerate(zip(q_lens, kv_lens)):
            pages = inputs.kv_indices[pstarts[i] : pstarts[i + 1]]
            kk = kv[pages, 0].reshape(-1, cfg.num_kv_heads, cfg.head_dim)[:kl]
            vv = kv[pages, 1].reshape(-1, cfg.num_kv_heads, cfg.head_dim)[:kl]
            qi = q[starts[i] : starts[i] + ql]
            kk = kk.repeat_interleave(group, dim=1)
            vv = vv.repeat_interleave(group, dim=1)
            s = torch.einsum("qhd,khd->hqk", qi.float(), kk.float()) * self.scale
            causal = torch.ones(ql, kl, dtype=torch.bool, device=q.device).tril(kl - ql)
            s = s.masked_fill(~causal, float("-inf"))
            out[starts[i] : starts[i] + ql] = torch.einsum("hqk,khd->qhd", s.softmax(-1), vv.float()).to(q.dtype)
        return out
