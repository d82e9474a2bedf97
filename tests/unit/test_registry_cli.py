"""Check pages in the catalogue and the CLI's rules/demo subcommands."""

from __future__ import annotations

import pytest

from flashcheck.catalogue import all_checks, get_check
from flashcheck.check import REQUIRED_SECTIONS, Check
from flashcheck.cli import main
from flashcheck.errors import InvalidDefinition


def test_every_check_page_has_every_section() -> None:
    checks = all_checks()
    assert checks, "no checks registered"
    for c in checks:
        assert c.missing_sections() == [], f"{c.id} lacks {c.missing_sections()}"


def test_lookup_by_id_and_name() -> None:
    assert get_check("fc301").name == "csr-well-formed"
    assert get_check("csr-well-formed").id == "FC301"


@pytest.mark.parametrize(
    ("id_", "name", "kind", "match"),
    [
        ("X1", "a", "static", "must look like"),
        ("FC301", "a", "static", "must start with FC1"),
        ("FC199", "Bad_Name", "static", "lower-case words"),
    ],
)
def test_check_rejects_malformed(id_: str, name: str, kind: str, match: str) -> None:
    with pytest.raises(InvalidDefinition, match=match):
        Check(id_, name, kind, "A page.")  # type: ignore[arg-type]


def test_rules_cli(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["rules"]) == 0
    assert "FC301" in capsys.readouterr().out
    assert main(["rules", "FC301"]) == 0
    page = capsys.readouterr().out
    assert all(s in page for s in REQUIRED_SECTIONS)
    assert main(["rules", "FC999"]) == 2
    assert "unknown check 'FC999'" in capsys.readouterr().err


def test_demo_reports_only_the_planted_bug(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["demo", "--steps", "12", "--seed", "4"]) == 0
    out = capsys.readouterr().out
    assert "seed=4" in out and "[planted]" in out and "1 finding(s)" in out
    assert main(["demo", "--steps", "8", "--no-plant"]) == 0
    assert "0 finding(s)" in capsys.readouterr().out
    assert main(["demo", "--steps", "0"]) == 2
