"""CPU-offloaded long-context decode: old KV pages live in pinned host memory and are attended on the CPU, recent
pages stay on the GPU; the two partial attentions are merged by their log-sum-exp."""

from offattn.config import OffloadConfig

__all__ = ["OffloadConfig"]
