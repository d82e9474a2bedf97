"""Token-granular KV pool: one slot per token, like LightLLM's mem_manager (page size 1)."""
import numpy as np
import torch


class TokenKVPool:
    def __init__(self, size: int, num_layers: int, num_kv_heads: int, head_dim: int, dtype, device):
        self.size = size
        self.device = device
        # slot 0 .. size-1 hold tokens; one spare slot for padded rows of the decode graphs
        self.kv_buffer = [torch.empty((size + 1, 2, num_kv_heads, head_dim), dtype=dtype, device=device) for _ in range(num_layers)]
        self.mem_state = torch.ones(size, dtype=torch.bool, device=device)
        self.free_slots_host = np.arange(size, dtype=np.int32)
        self.num_free = size

    def alloc(self, need_size: int):
        assert need_size <= self.num_free, "out of KV slots"  # expect: FC109
        select_host = self.free_slots_host[:need_size].copy()
        self.free_slots_host = self.free_slots_host[need_size:]
        self.num_free -= need_size
        select_gpu = torch.from_numpy(select_host).to(self.device, non_blocking=True)
        self.mem_state[select_gpu] = False
        return select_host, select_gpu

    def free(self, slots_host: np.ndarray):
        self.free_slots_host = np.concatenate([self.free_slots_host, slots_host])
        self.num_free += len(slots_host)
        self.mem_state[torch.from_numpy(slots_host).to(self.device, non_blocking=True)] = True

    def available(self) -> int:
        # cross-check of the host counter against the device bitmap, every step
        return int(self.mem_state.sum())  # expect: FC101

    def host_free_count(self) -> int:
        assert self.num_free <= self.size  # ok: FC109
        return self.num_free

    def debug_dump(self):
        return self.mem_state.cpu()  # ok: FC101
