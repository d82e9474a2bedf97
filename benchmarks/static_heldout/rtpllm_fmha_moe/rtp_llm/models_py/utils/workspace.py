from functools import lru_cache

import torch

FI_WORKSPACE_SIZE = 512 * 1024 * 1024
g_zero_workspace_buffer = None
_XQA_WS = {}


def get_zero_workspace(device):
    global g_zero_workspace_buffer
    if g_zero_workspace_buffer is None:
        g_zero_workspace_buffer = torch.zeros(FI_WORKSPACE_SIZE, dtype=torch.uint8, device=device)  # expect: FC106  # ok: FC105
    return g_zero_workspace_buffer


@lru_cache(maxsize=None)
def get_gen_workspace(device: str):
    return torch.empty(256 << 20, dtype=torch.uint8, device=device)  # expect: FC105, FC106


def get_xqa_workspace(device, max_tokens, num_heads, head_dim, zeroed):
    key = (str(device), max_tokens, zeroed)
    if key not in _XQA_WS:
        ws = torch.empty(max_tokens * num_heads * head_dim * 4, dtype=torch.uint8, device=device)  # expect: FC105
        if zeroed:
            ws.zero_()
        _XQA_WS[key] = ws
    return _XQA_WS[key]


def get_zeroed_xqa_workspace(device, max_tokens, num_heads, head_dim):
    ws = torch.empty(max_tokens * num_heads * head_dim * 4, dtype=torch.uint8, device=device)  # ok: FC105
    ws.zero_()
    return ws
