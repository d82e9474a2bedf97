"""The built-in fuzz suite: ``pytest -m fuzz --pyargs flashcheck.fuzzing.suite``.

Every built-in target gets a replay-sequence fuzz test: the FlashInfer targets run on a GPU node (skipped with the
reason elsewhere), the CPU reference target runs everywhere. ``--flashcheck-target NAME|module:Class`` narrows the
suite to one target (e.g. a seed-bug target), ``--flashcheck-budget`` / ``--flashcheck-profile`` size it.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from flashcheck.fuzzing.api import FuzzSpec, FuzzTest
from flashcheck.fuzzing.metadata import flashcheck_builder, metadata_builder_test
from flashcheck.fuzzing.options import active_options
from flashcheck.targets.registry import BUILTIN_TARGETS, GPU_TARGETS

pytestmark = pytest.mark.fuzz


def _params() -> list[object]:
    chosen = active_options().target
    names = [chosen] if chosen else list(BUILTIN_TARGETS)
    return [pytest.param(n, id=n, marks=[pytest.mark.gpu] if n in GPU_TARGETS else []) for n in names]


@pytest.fixture
def _cpu_threads(target: str) -> Iterator[None]:
    """The CPU reference runs tiny ops: one torch thread avoids thread-pool contention (100x on a busy host)."""
    if target in GPU_TARGETS:
        yield
        return
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


@pytest.mark.parametrize("target", _params())
@pytest.mark.usefixtures("_cpu_threads")
def test_replay_sequences(target: str) -> None:
    """Capture, replay below the bucket, recapture, grow, eager and prefill steps: every property after every step."""

    def replay_sequences() -> None:
        """placeholder body: the fuzz run is the test"""

    replay_sequences.__qualname__ = f"replay_sequences[{target}]"
    FuzzTest(replay_sequences, FuzzSpec(target=target)).run()


test_layout_builder_csr = metadata_builder_test(flashcheck_builder)
