"""FP8 latent KV cache with per-token scales for DeepSeek-style MLA."""
from .config import MLAConfig
from .quant import FP8_MAX, LatentCache, ScaleBuffer, quantize_latent
from .weights import AbsorbedWeights, absorb_kv_b

__all__ = ["AbsorbedWeights", "FP8_MAX", "LatentCache", "MLAConfig", "ScaleBuffer", "absorb_kv_b", "quantize_latent"]
