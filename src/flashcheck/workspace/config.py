"""The engine configuration the workspace oracle sizes for: heads, dtypes, page size, batch and token limits, graph
buckets, the FlashInfer wrappers in use and the workspace sizes the engine allocates; read from TOML, flags or a
preset (Llama-3-8B decode and prefill on TP1, DeepSeek-V3 MLA on TP8, every built-in target).
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from flashcheck.errors import InvalidArgument
from flashcheck.workspace.planner import Rules, Shape

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on Python 3.10 only
    import tomli as tomllib  # type: ignore[import-not-found, unused-ignore]

__all__ = ["PRESETS", "EngineConfig", "WrapperUse", "load_toml", "preset", "preset_names"]

MiB = 1 << 20
WRAPPERS: dict[str, tuple[str, ...]] = {
    "decode": ("tc", "cuda"),
    "prefill": ("fa2", "fa3"),
    "ragged": ("fa2", "fa3"),
    "mla": ("fa2", "fa3"),
    "batch_attention": ("persistent",),
}
VERSIONS: dict[str, tuple[Rules, ...]] = {"0.6.13": ("0.6",), "0.7.2": ("0.7",), "any": ("0.6", "0.7")}
DTYPE_BYTES = {"float16": 2, "bfloat16": 2, "float8_e4m3fn": 1, "float8_e5m2": 1}


@dataclass(frozen=True)
class WrapperUse:
    """One FlashInfer wrapper the engine plans: which, on which backend, and whether it is CUDA-graph captured
    (one wrapper per graph bucket, planned with the bucket's fixed batch size) besides its eager use."""

    wrapper: str
    backend: str
    graph: bool = False

    def __post_init__(self) -> None:
        if self.wrapper not in WRAPPERS:
            raise InvalidArgument(f"wrapper {self.wrapper!r} is not one of {', '.join(WRAPPERS)}")
        if self.backend not in WRAPPERS[self.wrapper]:
            known = ", ".join(WRAPPERS[self.wrapper])
            raise InvalidArgument(f"wrapper {self.wrapper!r} has no backend {self.backend!r}; use one of {known}")
        if self.graph and self.wrapper in ("ragged", "batch_attention"):
            raise InvalidArgument(f"wrapper {self.wrapper!r} is not CUDA-graph captured; set graph = false")

    @property
    def label(self) -> str:
        return f"{self.wrapper}-{self.backend}"


@dataclass(frozen=True)
class EngineConfig:
    """Everything the planners' sizing depends on, and the sizes the engine allocates (None: not given).

    ``max_tokens`` is the most query tokens one step plans (the chunked-prefill size), ``max_qo_len`` the most of
    one request (default ``max_tokens``), ``spec_len`` the query rows per request of a decode or verify graph
    (1 + speculative tokens). ``flashinfer`` picks the planner rules: ``0.6.13``, ``0.7.2`` or ``any`` (both).
    """

    name: str
    # the model, per GPU (heads divided by the tensor-parallel size, gathered heads under context parallelism)
    num_qo_heads: int
    num_kv_heads: int
    head_dim_qk: int = 128
    head_dim_vo: int = 128
    q_dtype: str = "bfloat16"
    kv_dtype: str = "bfloat16"
    causal: bool = True
    # the scheduler's limits per step
    page_size: int = 16
    max_batch: int = 256
    max_tokens: int = 8192
    graph_buckets: tuple[int, ...] = ()
    # and per request
    max_qo_len: int = 0
    max_seq_len: int = 8192
    spec_len: int = 1
    # what plans, where, under which FlashInfer rules
    wrappers: tuple[WrapperUse, ...] = ()
    num_sms: int = 132
    flashinfer: str = "any"
    decode_blocks_per_sm: int = 0
    # what the engine allocates
    float_bytes: int | None = None
    int_bytes: int | None = None
    pinned_bytes: int | None = None
    margin: float = 0.10
    source: str = field(default="", compare=False)

    def __post_init__(self) -> None:
        for key in ("num_qo_heads", "num_kv_heads", "head_dim_qk", "head_dim_vo", "page_size", "max_batch"):
            _positive(key, getattr(self, key))
        for key in ("max_tokens", "max_seq_len", "spec_len", "num_sms"):
            _positive(key, getattr(self, key))
        if self.num_qo_heads % self.num_kv_heads:
            raise InvalidArgument(
                f"num_qo_heads={self.num_qo_heads} is not a multiple of num_kv_heads={self.num_kv_heads}"
            )
        if self.max_qo_len < 0 or self.decode_blocks_per_sm < 0:
            raise InvalidArgument("max_qo_len and decode_blocks_per_sm must be >= 0 (0: the default)")
        if list(self.graph_buckets) != sorted(set(self.graph_buckets)) or any(b < 1 for b in self.graph_buckets):
            raise InvalidArgument(f"graph_buckets must be ascending, distinct and >= 1, got {list(self.graph_buckets)}")
        if self.flashinfer not in VERSIONS:
            raise InvalidArgument(f"flashinfer must be one of {', '.join(VERSIONS)}, got {self.flashinfer!r}")
        for key in ("q_dtype", "kv_dtype"):
            if getattr(self, key) not in DTYPE_BYTES:
                raise InvalidArgument(f"{key} {getattr(self, key)!r} is not one of {', '.join(DTYPE_BYTES)}")
        for key in ("float_bytes", "int_bytes", "pinned_bytes"):
            v = getattr(self, key)
            if v is not None and (not isinstance(v, int) or v < 0):
                raise InvalidArgument(f"{key} must be a byte count >= 0, got {v!r}")
        if not 0 <= self.margin <= 10:
            raise InvalidArgument(f"margin must be a fraction between 0 and 10, got {self.margin}")
        if not self.wrappers:
            raise InvalidArgument(f"configuration {self.name!r} uses no wrappers; add [[wrappers]] entries")
        if any(w.graph for w in self.wrappers) and not self.graph_buckets:
            raise InvalidArgument("a wrapper has graph = true but graph_buckets is empty")

    @property
    def shape(self) -> Shape:
        return Shape(
            self.num_qo_heads,
            self.num_kv_heads,
            self.head_dim_qk,
            self.head_dim_vo,
            self.page_size,
            DTYPE_BYTES[self.kv_dtype],
            self.causal,
        )

    @property
    def rules(self) -> tuple[Rules, ...]:
        return VERSIONS[self.flashinfer]

    @property
    def qo_cap(self) -> int:
        """The most query tokens one request has in one eager prefill step."""
        return min(self.max_qo_len or self.max_tokens, self.max_tokens, self.max_seq_len)

    def configured(self, kind: str) -> int | None:
        return {"float": self.float_bytes, "int": self.int_bytes, "pinned": self.pinned_bytes}[kind]

    def replace(self, **changes: Any) -> EngineConfig:
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d.pop("source")
        d["graph_buckets"] = list(self.graph_buckets)
        d["wrappers"] = [dataclasses.asdict(w) for w in self.wrappers]
        return d


def _positive(key: str, value: Any) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise InvalidArgument(f"{key} must be an integer >= 1, got {value!r}")


# ------------------------------------------------------------------------------------------------------- TOML
_SECTIONS = {
    "model": ("num_qo_heads", "num_kv_heads", "head_dim_qk", "head_dim_vo", "q_dtype", "kv_dtype", "causal"),
    "scheduler": ("page_size", "max_batch", "max_tokens", "max_qo_len", "max_seq_len", "graph_buckets", "spec_len"),
    "device": ("num_sms", "decode_blocks_per_sm"),
    "workspace": ("float_bytes", "int_bytes", "pinned_bytes", "margin"),
}
_TOP = ("name", "flashinfer", "preset")


def load_toml(path: str | Path) -> EngineConfig:
    """An `EngineConfig` from a TOML file (see docs/workspace.md); `InvalidArgument` naming the bad key."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
        return from_mapping(tomllib.loads(text), source=str(p), default_name=p.stem)
    except tomllib.TOMLDecodeError as exc:
        raise InvalidArgument(f"configuration file {path} is not TOML: {exc}") from None
    except (OSError, UnicodeDecodeError) as exc:
        why = "does not exist" if isinstance(exc, FileNotFoundError) else f"cannot be read ({exc})"
        raise InvalidArgument(f"configuration file {path} {why}") from None


def from_mapping(doc: Mapping[str, Any], *, source: str = "", default_name: str = "engine") -> EngineConfig:
    """An `EngineConfig` from the TOML document's structure (a ``preset`` key starts from that preset)."""
    kw: dict[str, Any] = {}
    for key, value in doc.items():
        if key in _SECTIONS:
            if not isinstance(value, Mapping):
                raise InvalidArgument(f"[{key}] must be a table")
            for k, v in value.items():
                if k not in _SECTIONS[key]:
                    raise InvalidArgument(f"unknown key {k!r} in [{key}]; known: {', '.join(_SECTIONS[key])}")
                kw[k] = v
        elif key == "wrappers":
            kw["wrappers"] = tuple(_wrapper(w) for w in _table_list(value))
        elif key in _TOP:
            kw[key] = value
        else:
            known = ", ".join((*_TOP, *_SECTIONS, "wrappers"))
            raise InvalidArgument(f"unknown top-level key {key!r} in the configuration; known: {known}")
    if "graph_buckets" in kw:
        kw["graph_buckets"] = tuple(_int_list("graph_buckets", kw["graph_buckets"]))
    base_name = kw.pop("preset", None)
    kw.setdefault("name", base_name or default_name)
    try:
        if base_name is not None:
            return preset(str(base_name)).replace(source=source, **kw)
        return EngineConfig(source=source, **kw)
    except TypeError as exc:
        raise InvalidArgument(f"incomplete configuration: {exc}; see docs/workspace.md for the keys") from exc


def _table_list(value: Any) -> list[Mapping[str, Any]]:
    if not isinstance(value, list) or not all(isinstance(w, Mapping) for w in value):
        raise InvalidArgument("wrappers must be an array of tables ([[wrappers]] with wrapper, backend, graph)")
    return value


def _wrapper(w: Mapping[str, Any]) -> WrapperUse:
    extra = set(w) - {"wrapper", "backend", "graph"}
    if extra or "wrapper" not in w or "backend" not in w:
        raise InvalidArgument(f"[[wrappers]] entry {dict(w)} needs wrapper and backend (and optionally graph) only")
    return WrapperUse(str(w["wrapper"]), str(w["backend"]), bool(w.get("graph", False)))


def _int_list(key: str, value: Any) -> list[int]:
    if not isinstance(value, list) or not all(isinstance(x, int) and not isinstance(x, bool) for x in value):
        raise InvalidArgument(f"{key} must be a list of integers, got {value!r}")
    return value


# ---------------------------------------------------------------------------------------------------- presets
_POW2 = (1, 2, 4, 8, 16, 32, 64, 128, 256)
# fp16 like the built-in targets (the planners' sizes are the same for any 2-byte dtype), so that a GPU run of the
# witnesses loads the kernels the targets already use
F16 = "float16"
PRESETS: dict[str, EngineConfig] = {
    "llama3-8b-decode": EngineConfig(
        "llama3-8b-decode", 32, 8, q_dtype=F16, kv_dtype=F16, max_batch=256, max_tokens=8192, max_seq_len=131072,
        graph_buckets=_POW2,
        wrappers=(WrapperUse("decode", "tc", graph=True),), float_bytes=256 * MiB, int_bytes=8 * MiB,
        pinned_bytes=8 * MiB,
    ),
    "llama3-8b-prefill": EngineConfig(
        "llama3-8b-prefill", 32, 8, q_dtype=F16, kv_dtype=F16, max_batch=256, max_tokens=8192, max_seq_len=131072,
        wrappers=(WrapperUse("prefill", "fa2"),), float_bytes=256 * MiB, int_bytes=8 * MiB, pinned_bytes=8 * MiB,
    ),
    "deepseek-v3-mla-tp8": EngineConfig(
        "deepseek-v3-mla-tp8", 16, 1, head_dim_qk=576, head_dim_vo=512, page_size=1, max_batch=128,
        max_tokens=8192, max_seq_len=163840, graph_buckets=(1, 2, 4, 8, 16, 32, 64, 128),
        wrappers=(WrapperUse("mla", "fa2", graph=True),), float_bytes=512 * MiB, int_bytes=8 * MiB,
        pinned_bytes=8 * MiB,
    ),
    # 64 query heads (a 70B-class model on one GPU) with 8192-token prefill chunks under a fixed 16 MiB float
    # workspace: too small on both FlashInfer versions (the oracle's shortfall example)
    "prefill-64h-16mib": EngineConfig(
        "prefill-64h-16mib", 64, 8, q_dtype=F16, kv_dtype=F16, max_batch=256, max_tokens=8192, max_seq_len=131072,
        wrappers=(WrapperUse("prefill", "fa2"),), float_bytes=16 * MiB, int_bytes=8 * MiB, pinned_bytes=8 * MiB,
    ),
}  # fmt: skip


def preset_names() -> list[str]:
    from flashcheck.targets.registry import GPU_TARGETS

    return [*PRESETS, *GPU_TARGETS]


def preset(name: str) -> EngineConfig:
    """A named preset, or the configuration of a built-in target (``decode-tc``, ``mla-fa2``...)."""
    if name in PRESETS:
        return PRESETS[name]
    from flashcheck.targets.registry import GPU_TARGETS

    if name in GPU_TARGETS:
        return target_config(name)
    raise InvalidArgument(f"unknown preset {name!r}; presets: {', '.join(preset_names())}")


_TARGET_WRAPPERS: dict[str, WrapperUse] = {
    "decode-tc": WrapperUse("decode", "tc", True),
    "decode-cuda": WrapperUse("decode", "cuda", True),
    "prefill-fa2": WrapperUse("prefill", "fa2", True),
    "prefill-fa3": WrapperUse("prefill", "fa3", True),
    "ragged-fa2": WrapperUse("ragged", "fa2"),
    "ragged-fa3": WrapperUse("ragged", "fa3"),
    "mla-fa2": WrapperUse("mla", "fa2", True),
    "mla-fa3": WrapperUse("mla", "fa3", True),
    "batch-attention": WrapperUse("batch_attention", "persistent"),
}


def target_config(name: str, **overrides: Any) -> EngineConfig:
    """The configuration of built-in target `name` (built with `overrides`): its template, capacity and
    workspace size (FlashInfer's own 8 MiB int and pinned workspaces)."""
    from flashcheck.targets.registry import make_target

    t: Any = make_target(name, **overrides)
    c = t.capacity
    tpl = c.template
    use = _TARGET_WRAPPERS[name]
    use = dataclasses.replace(use, graph=use.graph and bool(c.buckets))
    model = {k: getattr(tpl, k) for k in ("num_qo_heads", "num_kv_heads", "head_dim_qk", "head_dim_vo", "causal")}
    model.update(q_dtype=tpl.q_dtype, kv_dtype=tpl.kv_dtype, page_size=tpl.page_size)
    limits = {"max_batch": c.max_batch_size, "max_tokens": c.max_total_qo, "max_qo_len": c.max_qo_len}
    return EngineConfig(
        name=name,
        **model,
        **limits,
        max_seq_len=c.max_kv_len,
        graph_buckets=tuple(c.buckets),
        spec_len=c.max_qo_len if use.graph else 1,
        wrappers=(use,),
        # BatchAttention allocates its own 384 MiB float workspace; the others take the target's
        float_bytes=384 * MiB if name == "batch-attention" else int(t.workspace_bytes),
        int_bytes=8 * MiB,
        pinned_bytes=8 * MiB,
        source=f"target {name}",
    )
