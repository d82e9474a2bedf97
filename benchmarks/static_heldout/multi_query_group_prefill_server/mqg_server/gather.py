from typing import List, Optional, Tuple

import torch


class OutputGatherer:
    """Samples the next token of every finished row and hands (request id, token) pairs to the streamer."""

    def __init__(self, max_rows: int, device: torch.device):
        self.max_rows = max_rows
        self.device = device
        self.tokens_host = torch.empty(max_rows, dtype=torch.int64, pin_memory=True)
        self.copy_done = torch.cuda.Event()
        self._dev_tokens: Optional[torch.Tensor] = None

    def gather(self, logits: torch.Tensor, request_ids: List[int]) -> List[Tuple[int, int]]:
        n = len(request_ids)
        if self._dev_tokens is None:
            self._dev_tokens = torch.empty(self.max_rows, dtype=torch.int64, device=self.device)  # ok: FC107
        torch.argmax(logits, dim=-1, out=self._dev_tokens[:n])
        self.tokens_host[:n].copy_(self._dev_tokens[:n], non_blocking=True)
        self.copy_done.record()
        tokens = self.tokens_host[:n].tolist()  # expect: FC101
        return list(zip(request_ids, tokens))
