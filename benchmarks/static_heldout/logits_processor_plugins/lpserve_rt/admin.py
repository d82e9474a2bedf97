"""Admin endpoints: plugin statistics for the dashboard."""
from __future__ import annotations

from typing import Dict, List

import torch


def dump_penalty_stats(server, top: int = 20) -> Dict[str, List[int]]:
    """Most repeated recent tokens per graph processor that keeps a window."""
    out: Dict[str, List[int]] = {}
    for proc in server.graph_procs:
        recent = getattr(proc, "recent_tokens", None)
        if recent is None:
            continue
        counts = torch.bincount(recent.flatten(), minlength=server.cfg.vocab_size)
        out[proc.plugin_name] = counts.topk(top).indices.cpu().tolist()  # ok: FC101
    return out


def list_plugins(server) -> List[Dict[str, object]]:
    return [{"name": p.plugin_name, "in_graph": p.runs_in_graph} for p in server.procs]
