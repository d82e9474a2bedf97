"""Layered engine configuration.

The configuration is never a class: it is a ``collections.ChainMap`` of plain dicts (call-site
overrides in front of the environment, the checkpoint's config and the built-in defaults), turned
into a ``types.SimpleNamespace`` once at start-up so the rest of the engine can write ``cfg.page_size``.
"""

from __future__ import annotations

import os
from collections import ChainMap
from types import SimpleNamespace
from typing import Any, Callable, Mapping

import torch

# Built-in defaults: the last layer of every chain.
DEFAULTS: dict[str, Any] = {
    "page_size": 16,
    "kv_layout": "NHD",
    "max_batch_size": 256,
    "max_num_tokens": 8192,
    "chunked_prefill_size": 4096,
    "max_context_len": 32768,
    "num_layers": 32,
    "hidden_size": 4096,
    "vocab_size": 32000,
    "num_qo_heads": 32,
    "num_kv_heads": 8,
    "head_dim": 128,
    "sliding_window": -1,
    "decode_backend": "fa2",
    "graph_batch_sizes": (1, 2, 4, 8, 16, 32, 64, 128, 256),
    "enable_cuda_graph": True,
    "enable_mtp_draft": False,
    "num_draft_tokens": 3,
    "eos_token_id": 2,
    "max_top_k": 64,
    "dtype": "bfloat16",
    "device": "cuda",
}

assert DEFAULTS["page_size"] in (1, 16, 32, 64)  # ok: FC109

# Environment variable -> (key, parser).  Only variables that are set make it into the env layer.
_ENV_KEYS: dict[str, tuple[str, Callable[[str], Any]]] = {
    "NSSERVE_PAGE_SIZE": ("page_size", int),
    "NSSERVE_MAX_BATCH": ("max_batch_size", int),
    "NSSERVE_MAX_TOKENS": ("max_num_tokens", int),
    "NSSERVE_DECODE_BACKEND": ("decode_backend", str),
    "NSSERVE_SLIDING_WINDOW": ("sliding_window", int),
    "NSSERVE_CUDA_GRAPH": ("enable_cuda_graph", lambda s: s.lower() not in ("0", "false", "off")),
    "NSSERVE_MTP": ("enable_mtp_draft", lambda s: s.lower() in ("1", "true", "on")),
}

# Checkpoint key -> engine key.
_HF_KEYS = {
    "num_hidden_layers": "num_layers",
    "hidden_size": "hidden_size",
    "vocab_size": "vocab_size",
    "num_attention_heads": "num_qo_heads",
    "num_key_value_heads": "num_kv_heads",
    "head_dim": "head_dim",
    "sliding_window": "sliding_window",
    "max_position_embeddings": "max_context_len",
    "eos_token_id": "eos_token_id",
}

# Fixed workspace tiers (MiB) of the auxiliary wrappers.
WORKSPACE_MIB = {"window": 96, "verify": 64}

# Global FlashInfer knobs, one object for the whole process.
flashinfer_defaults = SimpleNamespace(workspace_bytes=384 * 1024 * 1024, use_tensor_cores=True)

# Workspace of the MTP draft wrapper, in MiB from the environment.
DRAFT_WS_BYTES = int(os.environ.get("NSSERVE_DRAFT_WS_MB", "64")) << 20


def env_layer(environ: Mapping[str, str] | None = None) -> dict[str, Any]:
    environ = os.environ if environ is None else environ
    layer: dict[str, Any] = {}
    for var, (key, parse) in _ENV_KEYS.items():
        if var in environ:
            layer[key] = parse(environ[var])
    return layer


def model_layer(hf_config: Mapping[str, Any]) -> dict[str, Any]:
    layer = {ours: hf_config[theirs] for theirs, ours in _HF_KEYS.items() if hf_config.get(theirs) is not None}
    if "head_dim" not in layer and "hidden_size" in layer:
        layer["head_dim"] = layer["hidden_size"] // layer["num_qo_heads"]
    if isinstance(layer.get("eos_token_id"), (list, tuple)):
        layer["eos_token_id"] = layer["eos_token_id"][0]
    return layer


def load_config(
    hf_config: Mapping[str, Any],
    overrides: Mapping[str, Any] | None = None,
    environ: Mapping[str, str] | None = None,
) -> ChainMap:
    """overrides > environment > checkpoint > defaults."""
    assert "num_attention_heads" in hf_config, "not a decoder checkpoint config"  # expect: FC109
    return ChainMap(dict(overrides or {}), env_layer(environ), model_layer(hf_config), DEFAULTS)


def to_namespace(chain: Mapping[str, Any], **extra: Any) -> SimpleNamespace:
    cfg = SimpleNamespace(**dict(chain))
    cfg.__dict__.update(extra)
    cfg.device = torch.device(cfg.device)
    cfg.torch_dtype = getattr(torch, cfg.dtype)
    cfg.max_pages_per_req = (cfg.max_context_len + cfg.page_size - 1) // cfg.page_size
    cfg.graph_batch_sizes = tuple(b for b in sorted(cfg.graph_batch_sizes) if b <= cfg.max_batch_size)
    return cfg


def describe(chain: ChainMap) -> dict[str, str]:
    """Which layer each key came from (for the start-up banner)."""
    names = ("override", "env", "model", "default")
    out = {}
    for key in chain:
        for name, layer in zip(names, chain.maps):
            if key in layer:
                out[key] = name
                break
    return out


def split_kv_workspace_bytes(cfg: SimpleNamespace) -> int:
    """Float workspace a FlashInfer planner needs at the engine's limits.

    Split-KV partial outputs: one (head_dim + lse) fp32 row per token, head and chunk; we allow
    up to 8 chunks per decode request and one per prefill token.
    """
    rows = max(cfg.max_num_tokens, cfg.chunked_prefill_size, cfg.max_batch_size * 8)
    per_row = cfg.num_qo_heads * (cfg.head_dim + 1) * 4
    return rows * per_row + (16 << 20)
