"""Offline inspection tools (python -m fimserve.cli_tools); not part of the serving loop."""
from fimserve.server import CompletionServer


def pages_in_use(server: CompletionServer) -> int:
    return int((server.attn.kv_indices > 0).sum().item())  # ok: FC101
