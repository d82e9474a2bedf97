"""Admin endpoint helpers: memory and plan reports (called from the HTTP thread, never per step)."""
import logging

import torch

from gsrt import graphs as G
from gsrt import plan as P
from gsrt import state as S
from gsrt import wrappers as W

logger = logging.getLogger(__name__)

# FlashInfer keeps its buffers under these names; summed into the report
_FI_BUFFERS = ("_int_workspace_buffer", "_float_workspace_buffer", "_pin_memory_int_workspace_buffer")
# the wrappers module's own private settings, echoed as they are
_MODULE_SETTINGS = ("_kv_layout", "_WS_MIB", "_TUNED_WS")
_GLOBAL_BUFFERS = ("kv_indptr", "kv_indices", "kv_last_page_len", "input_ids", "positions", "seq_lens")


def _nbytes(t):
    return t.numel() * t.element_size() if isinstance(t, torch.Tensor) else 0


def wrapper_bytes():
    out = {}
    for tag, w in W.eager_wrappers() + [(f"graph[{b}]", e.wrapper) for b, e in sorted(G._GRAPHS.items())]:
        total = 0
        for name in _FI_BUFFERS:
            total += _nbytes(getattr(w, name, None))  # expect: FC103
        out[tag] = total
    return out


def settings():
    out = {}
    for name in _MODULE_SETTINGS:
        out[name] = getattr(W, name)  # ok: FC103
    return out


def state_bytes():
    return {name: _nbytes(getattr(S, name)) for name in _GLOBAL_BUFFERS}


def report():
    plans, n_plans = P.memo_snapshot()
    lines = [S.describe(), f"plans={n_plans} last={plans}", f"settings={settings()}"]
    for tag, n in sorted(wrapper_bytes().items()):
        lines.append(f"  wrapper {tag}: {n / 2**20:.1f} MiB")
    for name, n in sorted(state_bytes().items()):
        lines.append(f"  state {name}: {n / 2**20:.2f} MiB")
    lines.append(f"  kv_indptr tail: {S.kv_indptr[S._STATE['last_bs']].item()}")  # ok: FC101
    logger.info("\n".join(lines))
    return "\n".join(lines)
