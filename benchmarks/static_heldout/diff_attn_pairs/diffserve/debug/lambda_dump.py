"""Offline inspection of the learned lambdas; run from a notebook, never from the server."""

from __future__ import annotations

from typing import Dict

from diffserve.model.diff_model import DiffLM


def dump_lambda_table(model: DiffLM) -> Dict[int, float]:
    table = {}
    for i, layer in enumerate(model.layers):
        attn = layer.attn
        if attn.anchor:
            continue
        table[i] = attn.lam().item()  # ok: FC101
    return table


def format_lambda_table(table: Dict[int, float]) -> str:
    return "\n".join(f"layer {i:3d}: lambda={v:+.4f}" for i, v in sorted(table.items()))
