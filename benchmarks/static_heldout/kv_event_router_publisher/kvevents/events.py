import json
from dataclasses import asdict, dataclass, field
from typing import List, Optional, Union


@dataclass
class BlockStored:
    block_hashes: List[int]
    parent_block_hash: Optional[int]
    token_ids: List[int]
    block_size: int
    medium: str = "GPU"
    kind: str = field(default="stored", init=False)


@dataclass
class BlockRemoved:
    block_hashes: List[int]
    medium: str = "GPU"
    kind: str = field(default="removed", init=False)


@dataclass
class AllBlocksCleared:
    kind: str = field(default="cleared", init=False)


KVEvent = Union[BlockStored, BlockRemoved, AllBlocksCleared]


@dataclass
class KVEventBatch:
    ts: float
    events: List[KVEvent]
    data_parallel_rank: Optional[int] = None

    def to_json(self) -> str:
        return json.dumps(
            {"ts": self.ts, "dp_rank": self.data_parallel_rank, "events": [asdict(e) for e in self.events]}
        )
