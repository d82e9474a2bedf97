"""Start-up probes and debugging helpers that walk the model's modules and buffers."""

from __future__ import annotations

import itertools
from typing import Dict, List, Tuple

import torch
from flashinfer.decode import trtllm_batch_decode_with_kv_cache
from flashinfer.prefill import trtllm_batch_context_with_kv_cache
from torch import nn

from modserve.config import EngineConfig


def dump_buffers(model: nn.Module, prefix: str = "") -> Dict[str, List]:
    """Snapshot every registered buffer for a bug report; never called while serving."""
    out: Dict[str, List] = {}
    for name, buf in model.named_buffers(prefix=prefix):
        out[name] = buf.detach().cpu().tolist()  # ok: FC101
    return out


def workspace_report(backend) -> Dict[str, int]:
    """Bytes of the int workspace each FlashInfer wrapper of the backend holds."""
    report: Dict[str, int] = {}
    wrappers = itertools.chain(
        backend.decode_wrappers.items(),
        ((f"graph.{bs}", w) for bs, w in backend.decode_graph_wrappers.items()),
    )
    for key, w in wrappers:
        report[key] = w._int_workspace_buffer.numel()  # expect: FC103
    return report


def probe_trtllm_decode(cfg: EngineConfig, kv_cache: Tuple[torch.Tensor, torch.Tensor], device: torch.device) -> None:
    """Run the trtllm-gen decode kernel once on a one-page dummy batch so a broken
    install fails at start-up rather than on the first request."""
    q = torch.zeros(1, cfg.num_qo_heads, cfg.head_dim, dtype=cfg.kv_dtype, device=device)
    block_tables = torch.zeros(1, 1, dtype=torch.int32, device=device)
    seq_lens = torch.ones(1, dtype=torch.int32, device=device)
    scratch = torch.empty(cfg.trtllm_workspace_bytes, dtype=torch.uint8, device=device)  # expect: FC105
    trtllm_batch_decode_with_kv_cache(
        q,
        torch.stack(kv_cache, dim=1),
        scratch,
        block_tables,
        seq_lens,
        1,
        bmm1_scale=cfg.head_dim**-0.5,
        bmm2_scale=1.0,
    )


def probe_trtllm_context(cfg: EngineConfig, kv_cache: Tuple[torch.Tensor, torch.Tensor], device: torch.device) -> None:
    q = torch.zeros(1, cfg.num_qo_heads, cfg.head_dim, dtype=cfg.kv_dtype, device=device)
    block_tables = torch.zeros(1, 1, dtype=torch.int32, device=device)
    seq_lens = torch.ones(1, dtype=torch.int32, device=device)
    cu = torch.tensor([0, 1], dtype=torch.int32, device=device)
    ws = torch.empty(cfg.trtllm_workspace_bytes, dtype=torch.uint8, device=device)  # ok: FC105
    ws.zero_()
    trtllm_batch_context_with_kv_cache(
        q,
        torch.stack(kv_cache, dim=1),
        ws,
        block_tables,
        seq_lens,
        1,
        1,
        cfg.head_dim**-0.5,
        1.0,
        1,
        cu,
        cu,
    )
