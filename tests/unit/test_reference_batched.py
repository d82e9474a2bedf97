"""The CPU reference target runs well-formed metadata for every request at once: the same outputs and the same
workspace partials as request by request, and malformed metadata still runs request by request."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import pytest

torch = pytest.importorskip("torch")

from flashcheck.fuzzing.scenarios import random_steps  # noqa: E402
from flashcheck.session import open_session  # noqa: E402
from flashcheck.targets.reference import ReferenceTarget  # noqa: E402

SMALL = {"max_kv_len": 256, "chunk": 32, "max_pages": 256}


@pytest.fixture
def driver() -> Iterator[Any]:
    with open_session("cpu-reference", device="cpu", layers="off", seed=0, config=SMALL) as drv:
        env = drv.target.env  # type: ignore[attr-defined]
        torch.manual_seed(0)
        env.k_cache.normal_()
        env.v_cache.normal_()
        yield drv


def _args(drv: Any, step: Any) -> tuple[Any, ...]:
    spec = drv.spec_for(step)
    lay = drv.layout_for(step, spec=spec, pad_to=None if step.op == "eager" else drv._bucket(step, spec))
    meta = (lay.qo_indptr, lay.kv_indptr, lay.kv_indices, lay.kv_last_page_len)
    return (drv.queries(spec, step.seed), *(torch.as_tensor(m) for m in meta), lay.batch_size)


def _run(tgt: ReferenceTarget, args: tuple[Any, ...], *, one_by_one: bool, monkeypatch: pytest.MonkeyPatch) -> Any:
    with monkeypatch.context() as m:
        if one_by_one:
            m.setattr(ReferenceTarget, "_batched", lambda *a: pytest.fail("the batched path ran"))
            m.setattr(ReferenceTarget, "_well_formed", lambda *a: None)
        tgt.workspace.fill_(7)
        return tgt._attend(*args), tgt.workspace.view(torch.float32).clone()


def test_every_request_at_once_matches_request_by_request(driver: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    tgt = driver.target
    batched = 0
    for step in random_steps(driver.cap, 60, 1):
        args = _args(driver, step)
        q, qo, kv, idx, last, n = args
        batched += tgt._well_formed(qo.tolist(), kv.tolist(), last.tolist(), n, q.shape[0], idx.long()) is not None
        got, ws_got = _run(tgt, args, one_by_one=False, monkeypatch=monkeypatch)
        want, ws_want = _run(tgt, args, one_by_one=True, monkeypatch=monkeypatch)
        assert torch.allclose(got, want, atol=1e-5, rtol=1e-5)
        assert torch.allclose(ws_got, ws_want, atol=1e-5, rtol=1e-5, equal_nan=True)  # the same partials
    assert batched == 60  # generated steps are well formed: every one ran batched


def test_malformed_metadata_runs_request_by_request(driver: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    tgt = driver.target
    step = next(s for s in random_steps(driver.cap, 60, 2) if s.op == "eager" and len(s.kv_lens) >= 2)
    q, qo, kv, idx, last, n = _args(driver, step)
    bad = [
        (qo.flip(0), kv, last),  # a non-monotone qo_indptr: overlapping rows
        (qo, kv, last * 0),  # last-page lengths of 0
    ]
    monkeypatch.setattr(ReferenceTarget, "_batched", lambda *a: pytest.fail("the batched path ran"))
    for qo_b, kv_b, last_b in bad:
        assert tgt._well_formed(qo_b.tolist(), kv_b.tolist(), last_b.tolist(), n, q.shape[0], idx.long()) is None
        # what the request-by-request kernel does with it (an error is the target's, not ours)
        with contextlib.suppress(RuntimeError, IndexError):
            tgt._attend(q, qo_b, kv_b, idx, last_b, n)
