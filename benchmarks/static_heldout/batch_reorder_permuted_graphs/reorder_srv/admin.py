"""Operator tools; nothing here runs on the serving path."""


def replay_debug_dump(backend, bs):
    """Summarise the sorted page table the last replay read."""
    total = backend.kv_indptr[bs].item()  # ok: FC101
    indptr = backend.kv_indptr_cpu[: bs + 1].tolist()
    pages_per_row = [indptr[i + 1] - indptr[i] for i in range(bs)]
    return {"rows": bs, "pages": total, "pages_per_row": pages_per_row}
