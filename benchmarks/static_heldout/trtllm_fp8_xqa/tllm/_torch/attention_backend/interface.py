from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, TypeVar

ATTENTION_BACKENDS: dict[str, type] = {}
M = TypeVar("M", bound=type)


def register_backend(name: str) -> Callable[[M], M]:
    assert name not in ATTENTION_BACKENDS, f"attention backend {name!r} registered twice"  # expect: FC109

    def deco(cls: M) -> M:
        ATTENTION_BACKENDS[name] = cls
        cls.backend_name = name
        return cls

    return deco


@dataclass(kw_only=True)
class AttentionMetadata:
    max_num_requests: int
    max_num_tokens: int
    kv_cache_manager: object = None
    is_cuda_graph: bool = False
    # per step, filled by the engine on the host
    num_contexts: int = 0
    request_kv_lens: list[int] = field(default_factory=list)
    request_q_lens: list[int] = field(default_factory=list)

    @property
    def num_seqs(self) -> int:
        return len(self.request_kv_lens)

    @property
    def num_generations(self) -> int:
        return self.num_seqs - self.num_contexts
