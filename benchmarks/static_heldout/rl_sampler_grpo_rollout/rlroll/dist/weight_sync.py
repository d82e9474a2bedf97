"""Receives the trainer's new policy weights between rollout iterations.

The trainer broadcasts flat buckets over a dedicated NCCL group; each bucket is
unpacked into the rollout model's parameters in place, so captured graphs keep
reading the same storage.  (``rlroll/dist`` holds the torch.distributed glue.)
"""
from __future__ import annotations

import logging
import math
from typing import Dict, Iterable, List, Sequence, Tuple

import torch
import torch.distributed as dist
import torch.nn as nn

logger = logging.getLogger(__name__)

BucketSpec = Tuple[List[str], List[Tuple[int, ...]], torch.dtype]


class WeightSyncer:
    def __init__(self, model: nn.Module, group: dist.ProcessGroup, src_rank: int = 0):
        self.group = group
        self.src_rank = src_rank
        self._backend = dist.get_backend(group)
        self.params: Dict[str, torch.Tensor] = dict(model.named_parameters())
        self.version = 0

    def receive_bucket(self, names: Sequence[str], shapes: Sequence[Tuple[int, ...]], flat: torch.Tensor) -> None:
        assert flat.numel() == sum(math.prod(s) for s in shapes), "bucket does not match its manifest"  # expect: FC109
        dist.broadcast(flat, src=self.src_rank, group=self.group)
        offset = 0
        for name, shape in zip(names, shapes):
            n = math.prod(shape)
            self.params[name].data.copy_(flat[offset : offset + n].view(shape))
            offset += n

    def sync_from_trainer(self, manifest: Iterable[BucketSpec], device: torch.device) -> int:
        for names, shapes, dtype in manifest:
            missing = [n for n in names if n not in self.params]
            if missing:
                raise KeyError(f"trainer sent unknown parameters: {missing[:4]}")
            total = sum(math.prod(s) for s in shapes)
            flat = torch.empty(total, dtype=dtype, device=device)
            self.receive_bucket(names, shapes, flat)
        torch.cuda.synchronize()
        self.version += 1
        logger.info("policy weights updated to version %d", self.version)
        return self.version
