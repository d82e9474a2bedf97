"""On-disk layout of a snapshot: ``manifest.json`` beside one ``.npy`` per layer and tensor."""
from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from typing import Dict, List

FORMAT_VERSION = 3


@dataclass
class SnapshotManifest:
    version: int
    num_layers: int
    page_size: int
    num_kv_heads: int
    head_dim: int
    dtype: str
    used_pages: int
    restore_generation: int
    graph_batch_sizes: List[int] = field(default_factory=list)
    # request id -> (row in the request-to-page table, sequence length, last page fill)
    requests: Dict[str, List[int]] = field(default_factory=dict)
    scheduler_state: Dict[str, object] = field(default_factory=dict)

    def save(self, directory: str) -> None:
        tmp = os.path.join(directory, "manifest.json.tmp")
        with open(tmp, "w") as f:
            json.dump(asdict(self), f)
        os.replace(tmp, os.path.join(directory, "manifest.json"))

    @classmethod
    def load(cls, directory: str) -> "SnapshotManifest":
        with open(os.path.join(directory, "manifest.json")) as f:
            raw = json.load(f)
        if raw.get("version") != FORMAT_VERSION:
            raise RuntimeError(f"snapshot format {raw.get('version')} != {FORMAT_VERSION}; re-prefill instead")
        return cls(**raw)
