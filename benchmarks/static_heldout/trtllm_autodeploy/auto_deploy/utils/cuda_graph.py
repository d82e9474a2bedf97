"""Global CUDA-graph state: custom ops ask whether they run inside warm-up/capture."""

from __future__ import annotations

import threading


class _CudaGraphState(threading.local):
    def __init__(self):
        self._in_warm_up = False

    def in_warm_up(self) -> bool:
        return self._in_warm_up

    def begin_warm_up(self) -> None:
        self._in_warm_up = True

    def end_warm_up(self) -> None:
        self._in_warm_up = False


cuda_graph_state = _CudaGraphState()


class CudaGraphWarmUpPhase:
    def __enter__(self):
        cuda_graph_state.begin_warm_up()
        return self

    def __exit__(self, *exc):
        cuda_graph_state.end_warm_up()
        return False
