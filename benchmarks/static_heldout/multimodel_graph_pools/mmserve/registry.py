from __future__ import annotations

import logging
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Dict, List, Optional

logger = logging.getLogger(__name__)


@dataclass
class ModelSpec:
    model_id: str
    num_layers: int
    num_qo_heads: int
    num_kv_heads: int
    head_dim: int
    page_size: int = 16
    max_pages_per_req: int = 512
    max_context: int = 8192
    dtype: str = "bfloat16"
    use_trtllm_decode: bool = False
    shared_prefix_tokens: int = 0
    graph_batch_sizes: List[int] = field(default_factory=lambda: [1, 2, 4, 8, 16, 32])

    @property
    def gqa_ratio(self) -> int:
        return self.num_qo_heads // self.num_kv_heads

    @property
    def has_shared_prefix(self) -> bool:
        return self.shared_prefix_tokens > 0

    def workspace_bytes_for(self, max_tokens: int) -> int:
        # split-k partial outputs (fp32) + lse per qo head, plus the planner's int section
        partial = max_tokens * self.num_qo_heads * (self.head_dim + 1) * 4
        return 2 * partial + (16 << 20)


class ModelRegistry:
    """Specs of every model the server may host; the switcher loads from here."""

    def __init__(self, max_resident: int):
        self.max_resident = max_resident
        self._specs: Dict[str, ModelSpec] = OrderedDict()
        self._weights_path: Dict[str, str] = {}
        self._loaded = False

    def register(self, spec: ModelSpec, weights_path: str) -> None:
        assert spec.model_id not in self._specs, "duplicate model id"  # expect: FC109
        self._specs[spec.model_id] = spec
        self._weights_path[spec.model_id] = weights_path

    def spec(self, model_id: str) -> ModelSpec:
        try:
            return self._specs[model_id]
        except KeyError:
            raise KeyError(f"unknown model {model_id!r}; registered: {list(self._specs)}") from None

    def weights_path(self, model_id: str) -> str:
        return self._weights_path[model_id]

    def freeze(self) -> List[ModelSpec]:
        assert not self._loaded  # ok: FC109
        self._loaded = True
        order = self._sorted_by_size()
        logger.info("hosting %d models: %s", len(order), [s.model_id for s in order])
        return order

    def _sorted_by_size(self) -> List[ModelSpec]:
        specs = list(self._specs.values())
        ranked = sorted(specs, key=lambda s: s.num_layers * s.num_qo_heads * s.head_dim, reverse=True)
        assert len(ranked) == len(specs)  # ok: FC109
        return ranked

    def find(self, prefix: str) -> Optional[ModelSpec]:
        for mid, spec in self._specs.items():
            if mid.startswith(prefix):
                return spec
        return None
