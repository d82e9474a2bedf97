import torch


def make_workspace(nbytes: int, device: torch.device, zeroed: bool = True) -> torch.Tensor:
    """A planner / kernel workspace; zeroed unless the caller knows its kernel does not care."""
    ws = torch.empty(nbytes, dtype=torch.uint8, device=device)  # ok: FC105
    if zeroed:
        ws.zero_()
    return ws
