"""Device memory owned by the engine: the paged KV pool and the FlashInfer workspaces."""
from typing import Callable, List
import torch
from .config import PAGE_SIZES, WORKSPACE_BYTES, EngineConfig
from .interfaces import KVPool, WorkspaceProvider


class PagedKVPool(KVPool):
    def __init__(self, config: EngineConfig):
        if config.page_size not in PAGE_SIZES:
            raise ValueError(f"page_size={config.page_size} not in {PAGE_SIZES}")
        self._kv_layout = "NHD"
        self._free: List[int] = list(range(config.num_pages))
        self._hooks: List[Callable[[torch.Tensor], None]] = []
        shape = (config.num_pages, 2, config.page_size, config.num_kv_heads, config.head_dim)
        self.caches = [torch.zeros(shape, dtype=torch.bfloat16, device=config.device) for _ in range(32)]

    def alloc(self, n: int) -> torch.Tensor:
        assert n <= len(self._free), "out of KV pages"  # expect: FC109
        return torch.tensor(self._take(n), dtype=torch.int32)

    def _take(self, n: int) -> List[int]:
        assert self._free  # ok: FC109
        out, self._free = self._free[:n], self._free[n:]
        return out

    def free(self, pages: torch.Tensor) -> None:
        for hook in self._hooks:
            hook(pages)
        self._free.extend(pages.tolist())

    def kv_cache(self, layer_id: int) -> torch.Tensor:
        return self.caches[layer_id]

    def add_free_hook(self, hook) -> None:
        self._hooks.append(hook)

class SharedWorkspaces(WorkspaceProvider):
    def __init__(self, config: EngineConfig):
        device = torch.device(config.device)
        self._float_workspace = torch.empty(config.workspace_bytes, dtype=torch.uint8, device=device)  # ok: FC106
        self._prefill_workspace = torch.empty(WORKSPACE_BYTES, dtype=torch.uint8, device=device)  # expect: FC106
        counter_bytes = config.max_bs * config.num_qo_heads * 256
        self._zeroed_workspace = torch.zeros(counter_bytes, dtype=torch.uint8, device=device)  # ok: FC105

    def float_workspace(self) -> torch.Tensor:
        return self._float_workspace

    def prefill_workspace(self) -> torch.Tensor:
        return self._prefill_workspace

    def zeroed_workspace(self) -> torch.Tensor:
        return self._zeroed_workspace
