"""The workspace oracle on a real GPU: each witness of the too-small preset runs clean at the bound, overflows one
byte below its need, and its reproducer replays to FC302; the MLA preset's exact bound is the planner's."""

from __future__ import annotations

from pathlib import Path

import pytest

from flashcheck.repro import load_repro, replay_repro
from flashcheck.workspace import preset, run_oracle
from flashcheck.workspace.confirm import confirm_result, installed_rules
from flashcheck.workspace.report import findings

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA and FlashInfer")


@pytest.mark.parametrize("name", ["prefill-64h-16mib", "deepseek-v3-mla-tp8"])
def test_witnesses_confirm_the_bound(name: str) -> None:
    records = confirm_result(run_oracle(preset(name)))
    assert records
    for r in records:
        assert r["status"] == "confirmed", r
        if "workspace_size_agrees" in r:
            assert r["workspace_size_agrees"], r
        elif r["rules"] == "0.7" and "oracle_plan" in r:  # compared unless the wrapper offers no size (0.7's MLA)
            assert r["use"].startswith("mla-") and "has no workspace_size()" in r["workspace_size_absent"], r


def test_shortfall_witness_overflows_when_replayed(tmp_path: Path) -> None:
    rules = installed_rules()
    mine = [
        f
        for f in findings(run_oracle(preset("prefill-64h-16mib")), tmp_path)
        if f.evidence["flashinfer_rules"] == rules
    ]
    assert mine and all(f.repro for f in mine)
    for f in mine:
        assert f.repro is not None
        found, hit = replay_repro(load_repro(f.repro), device="cuda")
        assert hit, [str(g) for g in found]
