from __future__ import annotations

import argparse
from dataclasses import dataclass


@dataclass(frozen=True)
class StageConfig:
    num_stages: int = 4
    num_microbatches: int = 2
    max_bs_per_mb: int = 64
    num_qo_heads: int = 32
    num_kv_heads: int = 8
    head_dim: int = 128
    page_size: int = 16
    max_pages: int = 1 << 15
    hidden: int = 4096
    workspace_bytes: int = 256 << 20

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> "StageConfig":
        return cls(
            num_stages=args.pp,
            num_microbatches=args.microbatches,
            max_bs_per_mb=args.max_num_seqs // args.microbatches,
            workspace_bytes=args.workspace_mb << 20,
        )
