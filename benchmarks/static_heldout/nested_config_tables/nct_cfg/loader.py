"""Load the engine configuration.

Order of precedence (last wins): ``DEFAULT_CONFIG`` < JSON file < ``MODEL_OVERRIDES[model]``
< ``NCT_*`` environment variables.  Sections are merged key by key, so a JSON file that
only says ``{"attention": {"workspace_mb": 384}}`` keeps every other attention default.
"""

from __future__ import annotations

import copy
import json
import logging
import os
from typing import Any, Mapping, Optional

from nct_cfg.defaults import DEFAULT_CONFIG, ENV_PREFIX, MODEL_OVERRIDES, WORKSPACE_MB

logger = logging.getLogger(__name__)

_MAX_DEPTH = 6


def _int_list(raw: str) -> list:
    return [int(x) for x in raw.split(",") if x.strip()]


def _flag(raw: str) -> bool:
    return raw.strip().lower() in ("1", "true", "yes", "on")


# env var -> (section or None for the top level, key, converter)
ENV_TABLE = {
    "NCT_BACKEND": (None, "backend", str),
    "NCT_WORKSPACE_MB": ("attention", "workspace_mb", int),
    "NCT_DECODE_BACKEND": ("attention", "decode_backend", str),
    "NCT_KV_DTYPE": ("attention", "kv_dtype", str),
    "NCT_TRTLLM_WORKSPACE_MB": ("trtllm", "workspace_mb", int),
    "NCT_GRAPH_BATCH_SIZES": ("cuda_graph", "batch_sizes", _int_list),
    "NCT_CUDA_GRAPH": ("cuda_graph", "enabled", _flag),
    "NCT_MAX_NUM_TOKENS": ("scheduler", "max_num_tokens", int),
    "NCT_LOG_LENGTHS": ("hot_path", "log_lengths", _flag),
}


def _deep_merge(base: Mapping[str, Any], over: Mapping[str, Any], depth: int = 0) -> dict:
    assert depth < _MAX_DEPTH, "configuration nested too deeply"  # ok: FC109
    out = dict(base)
    for key, value in over.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
            out[key] = _deep_merge(out[key], value, depth + 1)
        else:
            out[key] = copy.deepcopy(value)
    return out


def merge_config(base: Mapping[str, Any], overrides: Optional[Mapping[str, Any]]) -> dict:
    """``{**base, **overrides}``, applied recursively to nested sections."""
    if not overrides:
        return copy.deepcopy(dict(base))
    return _deep_merge(base, overrides)


def apply_env_overrides(cfg: dict, environ: Optional[Mapping[str, str]] = None) -> dict:
    env = os.environ if environ is None else environ
    for name, (section, key, conv) in ENV_TABLE.items():
        raw = env.get(name)
        if raw is None:
            continue
        target = cfg if section is None else cfg.setdefault(section, {})
        target[key] = conv(raw)
        logger.info("config override %s: %s.%s = %r", name, section or "", key, target[key])
    # NCT_WS_DECODE_MB=192 and friends resize the per-kind workspace table.
    for kind in list(WORKSPACE_MB):
        raw = env.get(f"{ENV_PREFIX}WS_{kind.upper()}_MB")
        if raw:
            WORKSPACE_MB.update({kind: int(raw)})
    return cfg


def load_config(path: Optional[str] = None, model: Optional[str] = None,
                environ: Optional[Mapping[str, str]] = None) -> dict:
    assert model is None or model in MODEL_OVERRIDES or model == DEFAULT_CONFIG["model"], model  # expect: FC109
    cfg = copy.deepcopy(DEFAULT_CONFIG)
    if path:
        with open(path, encoding="utf-8") as f:
            cfg = merge_config(cfg, json.load(f))
    name = model or cfg.get("model", "llama-3-8b")
    cfg = merge_config(cfg, MODEL_OVERRIDES.get(name, {}))
    cfg = apply_env_overrides(cfg, environ)
    cfg["model"] = name
    logger.info("config for %s: backend=%s decode=%s", name, cfg.get("backend", "fa2"),
                cfg.get("attention", {}).get("decode_backend", "fa2"))
    return cfg


def get_path(cfg: Mapping[str, Any], dotted: str, default: Any = None) -> Any:
    """``get_path(cfg, "attention.workspace_mb", 128)``: a ``.get`` chain with one default."""
    node: Any = cfg
    for part in dotted.split("."):
        if not isinstance(node, Mapping) or part not in node:
            return default
        node = node[part]
    return node
