"""Every FlashInfer version difference flashcheck cares about, in one place (0.6.13 and 0.7.2.post1).

- optional plan arguments are always passed by keyword (0.6 inserted ``o_data_type`` positionally; 0.7 warns on
  positional optional arguments);
- ``plan_info`` is a tvm-ffi Array (>= 0.4) or a CPU tensor (<= 0.3): normalized to ``list[int]``;
- ``fast_decode_plan`` gained ``q_len_per_req`` in 0.7; ``wrapper.workspace_size()`` exists from 0.7;
- MLA ``plan``/``run`` became keyword-first in 0.7 (the flat CSR form still works by keyword).
"""

from __future__ import annotations

import inspect
import warnings
from typing import Any

from flashcheck.errors import EnvironmentUnavailable

__all__ = ["FI", "load_flashinfer", "normalize_plan_info"]


class FI:
    """The imported flashinfer module plus the facts of its version."""

    def __init__(self, module: Any) -> None:
        self.mod = module
        self.version: str = str(getattr(module, "__version__", "0"))
        parts = [int(p) for p in self.version.split("+")[0].split(".")[:2] if p.isdigit()]
        self.major_minor: tuple[int, ...] = tuple(parts)  # which planner sizing rules apply (flashcheck workspace)
        fdp = getattr(module, "fast_decode_plan", None)
        self.fast_decode_params: frozenset[str] = (
            frozenset(inspect.signature(fdp).parameters) if fdp is not None else frozenset()
        )

    def fast_decode_plan(self, wrapper: Any, *args: Any, **kwargs: Any) -> None:
        """`flashinfer.fast_decode_plan` with keywords this version does not know dropped (e.g. q_len_per_req)."""
        fdp = getattr(self.mod, "fast_decode_plan", None)
        if fdp is None:
            raise EnvironmentUnavailable(f"flashinfer {self.version} has no fast_decode_plan")
        kw = {k: v for k, v in kwargs.items() if k in self.fast_decode_params}
        fdp(wrapper, *args, **kw)


def load_flashinfer() -> FI:
    """Import FlashInfer and check a CUDA device is present; `EnvironmentUnavailable` otherwise."""
    try:
        import torch
    except ImportError as exc:  # pragma: no cover - torch is a dependency
        raise EnvironmentUnavailable("torch is not installed") from exc
    if not torch.cuda.is_available():
        raise EnvironmentUnavailable(
            "no CUDA device: FlashInfer targets need a GPU (the CPU reference target runs anywhere)"
        )
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            import flashinfer
    except ImportError as exc:
        raise EnvironmentUnavailable(f"FlashInfer is not installed ({exc}); pip install 'flashcheck[gpu]'") from exc
    return FI(flashinfer)


def normalize_plan_info(wrapper: Any) -> list[int] | None:
    """``[int(x) for x in wrapper._plan_info]`` (read for checking only), None when the backend has none."""
    info = getattr(wrapper, "_plan_info", None)
    if info is None:
        return None
    if hasattr(info, "tolist"):
        return [int(x) for x in info.tolist()]
    return [int(x) for x in info]
