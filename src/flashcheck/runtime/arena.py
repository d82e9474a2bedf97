"""PLACEHOLDER until the runtime branch lands: plain workspaces, no guard zones, no measurement."""

from __future__ import annotations

from typing import Any

from flashcheck.findings import Finding

__all__ = ["Arena"]


class Arena:
    def workspace(self, name: str, nbytes: int, *, device: Any, kind: str = "float", zero: bool = True) -> Any:
        import torch

        return torch.zeros(nbytes, dtype=torch.uint8, device=device)

    def arm(self) -> None:
        pass

    def scan(self, step: int | None = None) -> tuple[list[Finding], dict[str, tuple[int, int]]]:
        return [], {}
