"""The oracle's answer as findings (FC306, each with a reproducer a GPU replays) and as text or JSON."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from flashcheck.findings import Finding
from flashcheck.properties.workspace_size import shortfall_finding
from flashcheck.workspace.config import EngineConfig
from flashcheck.workspace.oracle import KINDS, KindBound, OracleResult

__all__ = ["findings", "render_json", "render_text", "witness_repro"]

# the built-in target that replays a wrapper use's witness (BatchAttention owns its workspaces: no replay)
_TARGETS = {
    ("decode", "tc"): "decode-tc",
    ("decode", "cuda"): "decode-cuda",
    ("prefill", "fa2"): "prefill-fa2",
    ("prefill", "fa3"): "prefill-fa3",
    ("ragged", "fa2"): "ragged-fa2",
    ("ragged", "fa3"): "ragged-fa3",
    ("mla", "fa2"): "mla-fa2",
    ("mla", "fa3"): "mla-fa3",
}


_TARGET_DTYPES = ("float16", "bfloat16", "float8_e4m3fn")  # what a target's template holds (sizes do not differ)


def _mib(n: int) -> str:
    return f"{n / (1 << 20):.1f} MiB" if n >= 1 << 20 else f"{n / 1024:.1f} KiB"


def witness_repro(cfg: EngineConfig, b: KindBound) -> dict[str, Any] | None:
    """A reproducer `flashcheck replay` runs: the built-in target with the engine's heads and configured float
    workspace, planning the witness batch (eager, or captured in its graph bucket). None where no built-in
    target can carry the configuration (int/pinned sizes are FlashInfer's own, BatchAttention, decode with
    speculative rows)."""
    wrapper, backend = b.use.split(" ")[0].split("-", 1)
    target = _TARGETS.get((wrapper, backend))
    if b.kind != "float" or target is None or b.witness is None or cfg.float_bytes is None:
        return None
    if wrapper == "decode" and cfg.spec_len > 1:
        return None
    qo, kv = b.witness.lens()
    bucket = int(b.use.rsplit("=", 1)[1]) if "graph bs=" in b.use else None
    pages = sum(-(-k // cfg.page_size) for k in kv) + 16
    template = {
        "qo_lens": [1],
        "kv_lens": [1],
        "page_size": cfg.page_size,
        "num_qo_heads": cfg.num_qo_heads,
        "num_kv_heads": cfg.num_kv_heads,
        "head_dim_qk": cfg.head_dim_qk,
        "head_dim_vo": cfg.head_dim_vo,
        "q_dtype": cfg.q_dtype,
        "kv_dtype": cfg.kv_dtype if cfg.kv_dtype in _TARGET_DTYPES else cfg.q_dtype,
        "causal": cfg.causal,
    }
    tcfg: dict[str, Any] = {
        "template": template,
        "workspace_bytes": cfg.float_bytes,
        "max_pages": pages,
        "max_kv_len": max(kv),
    }
    if wrapper != "decode":
        tcfg["max_qo_len"] = max(*qo, cfg.spec_len if bucket else 1)
        if wrapper != "mla":
            tcfg["max_total_qo"] = max(sum(qo), bucket * cfg.spec_len if bucket else 0)
    if wrapper not in ("ragged",):
        tcfg["buckets"] = [bucket] if bucket else ([len(qo)] if len(qo) > 32 else [])
    op = "capture" if bucket else "eager"
    step = {"op": op, "qo_lens": list(qo), "kv_lens": list(kv), "bucket": bucket, "seed": 0, "allocator": "shuffled"}
    expect = {
        "id": "FC302",
        "name": "workspace-within-bounds",
        "kind": "property",
        "message": f"FlashInfer's planner overflows the {_mib(cfg.float_bytes)} float workspace "
        f"({b.searched:,} bytes needed by {b.use})",
        "evidence": {"check": "exception"},
    }
    return {
        "schema": 1,
        "scenario": {"target": target, "target_config": tcfg, "seed": 0, "steps": [step]},
        "step": 0,
        "layers": "all",
        "finding": expect,
        "environment": {"flashinfer_rules": b.rules},
        "command": f"flashcheck workspace --config {cfg.source}"
        if cfg.source.endswith(".toml")
        else f"flashcheck workspace --preset {cfg.name}",
    }


def findings(result: OracleResult, repro_dir: Path | None = None) -> list[Finding]:
    """One FC306 finding per configured workspace kind below its bound (the largest use's bound per kind and
    FlashInfer rule set); reproducers are written under `repro_dir` when given."""
    from flashcheck.repro import save_repro

    cfg = result.config
    out: list[Finding] = []
    for kind in KINDS:
        have = cfg.configured(kind)
        if have is None:
            continue
        for rules in cfg.rules:
            cands = [b for b in result.bounds if b.kind == kind and b.rules == rules]
            if not cands:
                continue
            worst = max(cands, key=lambda b: (b.searched > have, b.bound, b.searched))
            if have >= worst.bound:
                continue
            path: str | None = None
            doc = witness_repro(cfg, worst) if have < worst.searched else None
            if doc is not None and repro_dir is not None:
                path = str(save_repro(repro_dir / f"witness-{cfg.name}-{kind}-{rules}.json", doc))
            out.append(
                shortfall_finding(kind=kind, configured=have, need=worst.to_dict(), config_name=cfg.name, repro=path)
            )
    return out


def render_json(result: OracleResult, found: list[Finding], confirmation: list[dict[str, Any]] | None = None) -> str:
    cfg = result.config
    doc = {
        "config": cfg.to_dict(),
        "required": {k: result.required(k) for k in KINDS},
        "recommended": {k: result.recommended(k) for k in KINDS},
        "configured": {k: cfg.configured(k) for k in KINDS},
        "bounds": [b.to_dict() for b in result.bounds],
        "findings": [f.to_dict() for f in found],
        "confirmation": confirmation,
        "verdict": "shortfall" if found else ("covered" if _any_configured(cfg) else "sized"),
    }
    return json.dumps(doc, indent=2, sort_keys=True)


def _any_configured(cfg: EngineConfig) -> bool:
    return any(cfg.configured(k) is not None for k in KINDS)


def render_text(result: OracleResult, found: list[Finding], *, verbose: bool = False) -> str:
    cfg = result.config
    lines = [
        f"flashcheck workspace: {cfg.name} ({cfg.num_qo_heads} query / {cfg.num_kv_heads} KV heads, d "
        f"{cfg.head_dim_qk}/{cfg.head_dim_vo}, page {cfg.page_size}, <= {cfg.max_batch} requests and "
        f"{cfg.max_tokens} tokens per step, {cfg.num_sms} SMs, FlashInfer rules {'/'.join(cfg.rules)})",
        "",
        f"{'use':<34}{'rules':<6}{'kind':<8}{'bound':>12}  {'basis':<7}{'searched':>12}  witness",
    ]
    shown = result.bounds if verbose else _largest_per_use(result.bounds)
    for b in shown:
        wit = b.witness.describe() if b.witness is not None else "-"
        lines.append(f"{b.use:<34}{b.rules:<6}{b.kind:<8}{b.bound:>12,}  {b.basis:<7}{b.searched:>12,}  {wit[:60]}")
    lines.append("")
    for kind in KINDS:
        worst = result.worst(kind)
        have = cfg.configured(kind)
        given = f"configured {_mib(have)}" if have is not None else "not configured"
        src = f" ({worst.use}, {worst.rules})" if worst is not None else ""
        lines.append(
            f"{kind:<7} needs {_mib(result.required(kind))}{src}; recommended {_mib(result.recommended(kind))} "
            f"(+{cfg.margin:.0%}); {given}"
        )
    if found:
        lines.append("")
        for f in found:
            lines.append(f"{f.id} {f.name} [{f.severity.value}]: {f.message}")
            lines.append(f"  hint: {f.hint}")
    lines.append("")
    verdict = f"{len(found)} shortfall(s)" if found else "covered" if _any_configured(cfg) else "no sizes configured"
    lines.append(f"verdict: {verdict}")
    return "\n".join(lines) + "\n"


def _largest_per_use(bounds: list[KindBound]) -> list[KindBound]:
    """Without --verbose: the eager use and the largest graph bucket of each wrapper, per rule set and kind."""
    keep: dict[tuple[str, str, str, bool], KindBound] = {}
    for b in bounds:
        key = (b.use.split(" ")[0], b.rules, b.kind, "graph" in b.use)
        if key not in keep or b.bound > keep[key].bound:
            keep[key] = b
    return list(keep.values())
