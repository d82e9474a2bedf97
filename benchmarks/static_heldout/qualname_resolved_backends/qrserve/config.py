"""Engine configuration and the tables of qualified names the runtime resolves its components from.

The tables are the only place where the engine names its implementation classes. ``GPUModelRunner`` looks the
backend class up with ``getattr(importlib.import_module(cfg.backend_module), cfg.backend_cls)`` and everything else
through ``qualnames_for(cfg.platform, cfg.mode)``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

# FlashInfer keeps the result of the last plan() under this attribute; the builder checks it to skip re-planning a
# decode batch whose shape did not change.
PLAN_INFO_ATTR = "_plan_info"

# Float workspace of the eager paged-prefill wrapper.
FLASHINFER_WORKSPACE_BYTES = 256 * 1024 * 1024

SLIDING_WINDOW_PLUGIN = "sliding_window"
DEFAULT_PLATFORM = "cuda"

# platform -> mode -> component -> qualified name (None: the component is not used there)
QUALNAMES: dict[str, dict[str, dict[str, Optional[str]]]] = {
    "cuda": {
        "graph": {
            "graph_wrapper": "qrserve.cuda_graph.CUDAGraphWrapper",
            "sampler": "qrserve.sampler.Sampler",
            "graph_workspace": "qrserve.attention.flashinfer.graph_workspace",
            "decode_kernel": None,
            "decode_backend": "fa2",
        },
        "eager": {
            "graph_wrapper": "qrserve.cuda_graph.EagerWrapper",
            "sampler": "qrserve.sampler.Sampler",
            "graph_workspace": "qrserve.attention.flashinfer.graph_workspace",
            "decode_kernel": None,
            "decode_backend": "fa2",
        },
    },
    "cuda-sm100": {
        # Blackwell: decode through the trtllm-gen kernel module, which needs no plan() and is graph-safe.
        "graph": {
            "graph_wrapper": "qrserve.cuda_graph.CUDAGraphWrapper",
            "sampler": "qrserve.sampler.Sampler",
            "graph_workspace": "qrserve.attention.flashinfer.graph_workspace",
            "decode_kernel": "qrserve_kernels.trtllm_gen",
            "decode_backend": "trtllm",
        },
        "eager": {
            "graph_wrapper": "qrserve.cuda_graph.EagerWrapper",
            "sampler": "qrserve.sampler.Sampler",
            "graph_workspace": "qrserve.attention.flashinfer.graph_workspace",
            "decode_kernel": None,
            "decode_backend": "trtllm",
        },
    },
}

MODEL_REGISTRY: dict[str, str] = {
    "LlamaForCausalLM": "qrserve.model.TinyLlamaForCausalLM",
    "TinyLlamaForCausalLM": "qrserve.model.TinyLlamaForCausalLM",
}

KV_HELPERS: dict[str, str] = {
    "block_table": "qrserve.kv_helpers.BlockTable",
    "compactor": "qrserve.kv_helpers.KVCompactor",
}

ATTENTION_PLUGINS: dict[str, str] = {
    SLIDING_WINDOW_PLUGIN: "qrserve_kernels.window_plugin:SlidingWindowPlugin",
}


@dataclass
class EngineConfig:
    platform: str = "auto"
    mode: str = "graph"
    backend_module: str = "qrserve.attention.flashinfer"
    backend_cls: str = "FlashInferBackend"
    architecture: str = "LlamaForCausalLM"
    attention_plugins: tuple[str, ...] = (SLIDING_WINDOW_PLUGIN,)

    num_layers: int = 16
    hidden_size: int = 2048
    intermediate_size: int = 5632
    num_heads: int = 32
    num_kv_heads: int = 8
    head_dim: int = 64
    vocab_size: int = 32000
    rope_theta: float = 10000.0
    original_max_position: int = 4096
    sliding_window: Optional[int] = 4096
    logits_soft_cap: Optional[float] = None
    eos_token_id: int = 2

    page_size: int = 16
    num_gpu_blocks: int = 65536
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 8192
    max_model_len: int = 32768
    cudagraph_capture_sizes: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64, 128, 256)
    sink_workspace_bytes: int = 32 << 20
    extra: dict[str, str] = field(default_factory=dict)


def qualnames_for(platform: str, mode: str) -> dict[str, Optional[str]]:
    """The component table of a platform ("auto": the current device) and mode ("graph" or "eager")."""
    assert DEFAULT_PLATFORM in QUALNAMES, "the platform table lost its default entry"  # ok: FC109
    plat = _detect_platform() if platform == "auto" else platform
    try:
        return QUALNAMES[plat][mode]
    except KeyError:
        raise ValueError(f"no components registered for platform={plat!r} mode={mode!r}") from None


def _detect_platform() -> str:
    import torch

    major, _ = torch.cuda.get_device_capability()
    plat = "cuda-sm100" if major >= 10 else DEFAULT_PLATFORM
    assert plat in QUALNAMES, f"platform {plat!r} has no component table"  # ok: FC109
    return plat
