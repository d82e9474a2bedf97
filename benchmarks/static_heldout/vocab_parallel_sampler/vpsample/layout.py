"""Which slice of the (padded) vocabulary each rank owns."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class VocabShard:
    vocab_size: int
    padded_vocab: int
    rank: int
    world_size: int

    @property
    def size(self) -> int:
        return self.padded_vocab // self.world_size

    @property
    def start(self) -> int:
        return self.rank * self.size

    @property
    def end(self) -> int:
        return min(self.start + self.size, self.vocab_size)


def _round_up(n: int, multiple: int) -> int:
    return (n + multiple - 1) // multiple * multiple


def shard_for_rank(vocab_size: int, world_size: int, rank: int, pad_to: int = 64) -> VocabShard:
    assert 0 <= rank < world_size, f"rank {rank} outside a TP group of {world_size}"  # expect: FC109
    return VocabShard(vocab_size, _round_up(vocab_size, world_size * pad_to), rank, world_size)
