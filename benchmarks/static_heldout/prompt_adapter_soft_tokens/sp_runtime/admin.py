"""Operator endpoints: adapter residency and slot usage."""

from typing import Dict, List

from sp_runtime.server import SoftPromptServer


def dump_slot_usage(server: SoftPromptServer) -> Dict[str, List[int]]:
    table = server.table
    return {
        "row_slots": table.row_slots.cpu().tolist(),  # ok: FC101
        "row_virtual_lens": table.row_virtual_lens_cpu.tolist(),
    }


def adapter_stats(server: SoftPromptServer) -> Dict[str, int]:
    stats = dict(server.adapters.stats)
    stats["resident"] = len(server.adapters.host_store)
    return stats
