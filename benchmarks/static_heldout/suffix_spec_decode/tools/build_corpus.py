"""Offline: seed the global suffix trie from logged responses and report coverage.

    python -m tools.build_corpus --logs responses.jsonl --out global_trie.pkl
"""
from __future__ import annotations

import argparse
import json
import pickle
from typing import Iterable, List

import torch

from sfxserve.config import SpecConfig
from sfxserve.drafter.suffix_tree import SuffixTree


def iter_responses(path: str) -> Iterable[List[int]]:
    with open(path) as f:
        for line in f:
            rec = json.loads(line)
            yield rec["output_ids"]


def coverage(tree: SuffixTree, samples: List[List[int]], k: int, device: torch.device) -> float:
    hits = torch.zeros(len(samples), dtype=torch.float32, device=device)
    for i, toks in enumerate(samples):
        half = len(toks) // 2
        draft, _ = tree.speculate(toks[:half], k, 0.0)
        hits[i] = sum(int(a == b) for a, b in zip(draft, toks[half : half + k])) / max(1, k)
    return hits.mean().item()  # ok: FC101


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--logs", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--holdout", type=int, default=512)
    args = ap.parse_args()
    cfg = SpecConfig()
    tree = SuffixTree(cfg.max_suffix_depth)
    held: List[List[int]] = []
    for i, toks in enumerate(iter_responses(args.logs)):
        if i < args.holdout:
            held.append(toks)
            continue
        tree.extend(toks)
    cov = coverage(tree, held, cfg.max_draft_len, torch.device("cuda"))
    print(f"nodes={tree.num_nodes} draft coverage={cov:.3f}")
    with open(args.out, "wb") as f:
        pickle.dump(tree, f)


if __name__ == "__main__":
    main()
