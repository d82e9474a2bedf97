"""Stop detection: single-token stops on the device inside the decode graph,
multi-token stop sequences per row on the host's side of the step."""
from __future__ import annotations

from typing import Dict, List

import torch


class StopMatcher:
    def __init__(self, max_stops: int, device: torch.device) -> None:
        self.device = device
        self.stop_ids = torch.full((max_stops,), -1, dtype=torch.int64, device=device)
        self.stop_ids_cpu = torch.full((max_stops,), -1, dtype=torch.int64)
        self.multi_stops: Dict[int, List[int]] = {}  # row -> token sequence

    def update_stops(self, ids: List[int]) -> None:
        """New requests bring new stop tokens (EOS, `</tool_call>`, user stops)."""
        if ids == self.stop_ids_cpu.tolist()[: len(ids)]:
            return
        self.stop_ids_cpu = torch.tensor(ids, dtype=torch.int64)  # ok: FC107
        self.stop_ids = torch.tensor(ids, dtype=torch.int64, device=self.device)  # expect: FC107

    def device_check(self, next_ids: torch.Tensor) -> torch.Tensor:
        return torch.isin(next_ids, self.stop_ids)

    def multi_token_rows(self, next_ids: torch.Tensor) -> List[int]:
        """Rows whose new token completes the last token of a multi-token stop sequence."""
        return [row for row, seq in self.multi_stops.items() if next_ids[row] == seq[-1]]  # expect: FC101
