"""Operator tools run from a shell, never from the serving loop."""
import torch

from cdserve.engine import ContrastiveEngine


def page_usage(engine: ContrastiveEngine) -> dict:
    used = (engine.backend.kv_indices != 0).sum().item()  # ok: FC101
    return {"used_pages": used, "free_pages": engine._free_count}


def dump_indptr(engine: ContrastiveEngine, path: str):
    torch.save(engine.backend.kv_indptr_cpu.clone(), path)
