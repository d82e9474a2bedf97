"""Offline diagnostics for the span layout (run from a notebook against a live runner)."""

from __future__ import annotations

from typing import Dict, List

from span_srt.backend import MixedSpanAttnBackend
from span_srt.forward_batch import ForwardBatch
from span_srt.model_runner import ModelRunner

_GRAPH_BUF_FIELDS = ("_paged_kv_indptr_buf", "_paged_kv_last_page_len_buf")


def graph_buffer_report(backend: MixedSpanAttnBackend) -> List[Dict[str, object]]:
    rows: List[Dict[str, object]] = []
    for bs, wrappers in backend.graph_local.items():
        for g, w in wrappers.items():
            for name in _GRAPH_BUF_FIELDS:
                buf = getattr(w, name)  # expect: FC103
                rows.append({"bucket": bs, "group": g, "field": name, "numel": buf.numel()})
    return rows


def summarize_spans(runner: ModelRunner, fb: ForwardBatch) -> Dict[str, object]:
    seq = fb.seq_lens.tolist()  # ok: FC101
    out: Dict[str, object] = {"rows": len(seq), "max_len": max(seq) if seq else 0}
    for grp, pool in zip(runner.cfg.groups, runner.pools):
        span = [n if grp.is_global else min(n, grp.window) for n in seq]
        out[grp.name] = {"tokens_attended": sum(span), "free_pages": pool.free_count()}
    return out
