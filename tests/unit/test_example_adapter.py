"""The adapter in examples/ (shown in docs/targets.md) satisfies the protocol and passes a generated scenario."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from flashcheck.fuzzing.scenarios import random_steps
from flashcheck.session import open_session
from flashcheck.targets.protocol import check_target

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "sdpa_backend.py"


def load() -> type:
    spec = importlib.util.spec_from_file_location("sdpa_backend", EXAMPLE)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.SdpaBackendTarget  # type: ignore[no-any-return]


def test_example_adapter_runs_clean() -> None:
    target = check_target(load()())
    assert len(EXAMPLE.read_text().splitlines()) < 90
    with open_session(target, device="cpu", layers="off", seed=2) as drv:
        for i, s in enumerate(random_steps(target.capacity, 25, seed=4)):
            r = drv.execute(s, i)
            assert r.findings == [], [str(f) for f in r.findings]


def test_example_adapter_bug_is_found() -> None:
    cls = load()

    class Forgetful(cls):  # type: ignore[misc, valid-type]
        def prepare_replay(self, bucket: int, layout: object) -> None:
            if bucket:  # BUG: graph buffers are refreshed only at capture
                self.real[bucket] = (layout.batch_size, layout.padded_batch_size)  # type: ignore[attr-defined]
                return
            super().prepare_replay(bucket, layout)

    target = Forgetful()
    with open_session(target, device="cpu", layers="off", seed=2) as drv:
        ids = {
            f.id for i, s in enumerate(random_steps(target.capacity, 25, seed=4)) for f in drv.execute(s, i).findings
        }
    assert ids & {"FC301", "FC303"}
