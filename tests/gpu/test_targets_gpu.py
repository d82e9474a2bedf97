"""Built-in FlashInfer targets on a real GPU: generated capture/replay/eager scenarios under every runtime property
produce no finding on the clean targets; FlashInfer's silent acceptance of a non-monotone decode kv_indptr is shown."""

from __future__ import annotations

import os

import numpy as np
import pytest

from flashcheck.fuzzing.scenarios import random_steps
from flashcheck.known import split_known
from flashcheck.layout import build_paged_layout
from flashcheck.properties.csr import check_layout
from flashcheck.session import open_session
from flashcheck.targets.registry import GPU_TARGETS, make_target

STEPS = int(os.environ.get("FLASHCHECK_GPU_STEPS", "40"))


@pytest.mark.parametrize("name", GPU_TARGETS)
def test_clean_target_has_no_finding(name: str) -> None:
    """Findings that are documented FlashInfer behaviour (flashcheck.known) are allowed; nothing else is."""
    target = make_target(name)
    steps = random_steps(target.capacity, STEPS, seed=1234)
    with open_session(target, layers="all", seed=7) as drv:
        for i, s in enumerate(steps):
            r = drv.execute(s, i)
            unexpected, _known = split_known(r.findings, name)
            assert not unexpected, f"{name} step {i} {s.to_dict()}:\n" + "\n".join(map(str, unexpected))


def test_decode_accepts_non_monotone_kv_indptr_silently() -> None:
    """FlashInfer's decode planner does not validate indptr: [0,5,3,9] is accepted and request 1 is not computed.
    flashcheck's FC301 flags the metadata before the kernel sees it."""
    import torch

    target = make_target("decode-cuda", buckets=(4,))
    spec = target.capacity.template.with_lengths((1, 1, 1), (80, 48, 96))
    good = build_paged_layout(spec, num_pages=target.capacity.max_pages)
    bad_indptr = np.array([0, 5, 3, 9], dtype=np.int32)
    bad = type(good)(
        spec,
        good.qo_indptr,
        bad_indptr,
        good.kv_indices,
        good.kv_last_page_len,
        good.seq_lens,
        good.num_pages,
        good.padding,
    )
    assert [f.evidence["check"] for f in check_layout(bad)][:1] == ["indptr-non-decreasing"]
    with open_session(target, layers="off", seed=3) as drv:
        q = drv.queries(spec, 1)
        target.plan(bad)  # no exception: silent acceptance
        out = target.run(q).float()
        torch.cuda.synchronize()
        target.plan(good)
        ref = target.run(q).float()
    assert not torch.allclose(out[1], ref[1], atol=5e-2), "request 1 was computed despite the malformed indptr"
