"""Start-up report of what the attention backend holds on the device."""

from __future__ import annotations

import operator
from typing import TYPE_CHECKING, Dict, Iterable

import torch

if TYPE_CHECKING:
    from opserve.model_runner import ModelRunner


def workspace_bytes(wrappers: Iterable[object]) -> int:
    buffers = map(operator.attrgetter("_float_workspace_buffer"), wrappers)  # expect: FC103
    return sum(buf.numel() * buf.element_size() for buf in buffers)


def report(runner: "ModelRunner") -> Dict[str, object]:
    backend = runner.attn_backend
    return {
        "kv_layout": operator.attrgetter("_kv_layout")(backend),  # ok: FC103
        "workspace_mib": workspace_bytes(backend.all_wrappers()) >> 20,
        "graph_buckets": sorted(backend.graph_decode_wrappers),
        "kv_pages": runner.kv_pool.num_pages,
        "allocated_mib": torch.cuda.memory_allocated(runner.device) >> 20,
    }
