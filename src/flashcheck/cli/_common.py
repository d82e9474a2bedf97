"""Helpers shared by the subcommands."""

from __future__ import annotations

import json
from typing import Any

from flashcheck.errors import InvalidArgument

__all__ = ["parse_json_object"]


def parse_json_object(text: str | None, flag: str) -> dict[str, Any]:
    """The JSON object given to `flag` (empty when not given); `InvalidArgument` naming the flag otherwise."""
    if not text:
        return {}
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise InvalidArgument(f"{flag} is not JSON: {exc}") from exc
    if not isinstance(value, dict):
        raise InvalidArgument(f"{flag} must be a JSON object of target constructor arguments")
    return value
