import json
import logging
import urllib.request
from dataclasses import dataclass
from typing import Optional

import torch

logger = logging.getLogger(__name__)

# Used when the config service cannot be reached within the cold-start budget.
DEFAULT_WS_BYTES = 256 << 20


@dataclass
class WorkspacePlan:
    decode_bytes: int
    prefill_bytes: int
    trtllm_bytes: int
    warm_buckets: tuple
    max_batch: int
    max_tokens: int


class ConfigClient:
    def __init__(self, url: str):
        self.url = url
        self._backend = "http"
        self._cache: Optional[WorkspacePlan] = None

    def fetch_plan(self, model_id: str, timeout_s: float) -> Optional[WorkspacePlan]:
        assert timeout_s > 0  # expect: FC109
        if self._cache is not None:
            return self._cache
        try:
            with urllib.request.urlopen(f"{self.url}/workspace/{model_id}", timeout=timeout_s) as resp:
                body = json.loads(resp.read())
        except OSError as exc:
            logger.warning("config service unreachable (%s); using defaults", exc)
            return None
        self._cache = WorkspacePlan(
            decode_bytes=int(body["decode_bytes"]),
            prefill_bytes=int(body["prefill_bytes"]),
            trtllm_bytes=int(body["trtllm_bytes"]),
            warm_buckets=tuple(body.get("warm_buckets", (1, 8))),
            max_batch=int(body["max_batch"]),
            max_tokens=int(body["max_tokens"]),
        )
        return self._cache


def fallback_workspace(device: str) -> torch.Tensor:
    return torch.empty(DEFAULT_WS_BYTES, dtype=torch.uint8, device=device)  # expect: FC106


def fallback_workspace_for(device: str) -> torch.Tensor:
    return fallback_workspace(device)
