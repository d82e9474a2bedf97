"""JSON configuration flags: a clear error naming the flag, an object otherwise."""

from __future__ import annotations

import pytest

from flashcheck.cli import main
from flashcheck.cli._common import parse_json_object
from flashcheck.errors import InvalidArgument


def test_parse_json_object() -> None:
    assert parse_json_object(None, "--config") == {}
    assert parse_json_object('{"buckets": [1, 2]}', "--config") == {"buckets": [1, 2]}
    with pytest.raises(InvalidArgument, match="--config is not JSON"):
        parse_json_object("{", "--config")
    with pytest.raises(InvalidArgument, match="--target-config must be a JSON object"):
        parse_json_object("[1]", "--target-config")


def test_fuzz_cli_rejects_bad_config(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["fuzz", "--target", "cpu-reference", "--config", "{oops"]) == 2
    assert "--config is not JSON" in capsys.readouterr().err
