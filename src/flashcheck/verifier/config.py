"""Configuration of ``flashcheck static``: the ``[tool.flashcheck.static]`` table of ``pyproject.toml``.

Every key is optional; an unknown key or a value of the wrong type is an `InvalidArgument` whose message names the
file, the key, what was found and what to write instead (the CLI turns it into exit code 2).
"""

from __future__ import annotations

import difflib
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any

from flashcheck.errors import InvalidArgument

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on Python 3.10 only
    import tomli as tomllib  # type: ignore[import-not-found, unused-ignore]

__all__ = ["TABLE", "StaticConfig", "find_pyproject", "load_config"]

TABLE = "tool.flashcheck.static"


@dataclass(frozen=True)
class StaticConfig:
    """Settings of one static run (file values, then command-line overrides).

    Attributes:
        hot_paths: fnmatch patterns of qualified names (``pkg.mod.Class.method``, ``*.Backend.prepare_step``) that
            run every step or before every replay.
        capture_paths: patterns of functions that run while CUDA graphs are captured.
        replay_prep_paths: patterns of per-step functions that prepare a replay (fill graph-bound buffers and
            call ``plan()``): hot paths where FC104 allows writes to graph-bound buffers before the last plan.
        default_roots: also use the built-in engine name patterns (see ``docs/static.md``).
        select / ignore: rule IDs, ID prefixes (``FC1``, ``FC10``) or rule names.
        exclude: fnmatch patterns of paths (relative, ``/``-separated) that are never read.
        baseline: path of the baseline file (relative to the pyproject.toml that names it).
        host_names: extra fnmatch patterns of variable/attribute names that always hold host data.
        zeroed_workspace_consumers: extra callables (last name) whose workspace must start zeroed.
        root: directory that reported paths are relative to (the pyproject.toml's, or the current one).
        jobs: processes the run may use (0: one per CPU; 1: none but this one). With more, the model is built in a
            forked child, FC101 runs in a process forked from it and further ones write new cache entries.
        cache_dir: directory of the summary cache (`flashcheck.verifier.cache`); None: no cache. The command line
            sets it to ``.flashcheck_cache`` next to the pyproject.toml unless ``--no-cache``.
    """

    hot_paths: tuple[str, ...] = ()
    capture_paths: tuple[str, ...] = ()
    replay_prep_paths: tuple[str, ...] = ()
    default_roots: bool = True
    select: tuple[str, ...] = ("FC1",)
    ignore: tuple[str, ...] = ()
    exclude: tuple[str, ...] = ()
    baseline: str | None = None
    host_names: tuple[str, ...] = ()
    zeroed_workspace_consumers: tuple[str, ...] = ()
    root: str = "."
    jobs: int = 0
    cache_dir: str | None = None

    def with_overrides(self, **changes: Any) -> StaticConfig:
        """A copy with the given fields replaced (values of None are ignored)."""
        return replace(self, **{k: v for k, v in changes.items() if v is not None})


_NOT_TOML = frozenset({"root", "jobs", "cache_dir"})  # run settings: the command line's, not the project's
_TOML_KEYS: dict[str, str] = {f.name.replace("_", "-"): f.name for f in fields(StaticConfig) if f.name not in _NOT_TOML}
_BOOL_KEYS = {"default_roots"}
_STR_KEYS = {"baseline"}


def find_pyproject(start: Path) -> Path | None:
    """The nearest ``pyproject.toml`` at or above `start` (a file or a directory)."""
    here = start.resolve()
    if here.is_file():
        here = here.parent
    for d in (here, *here.parents):
        candidate = d / "pyproject.toml"
        if candidate.is_file():
            return candidate
    return None


def load_config(pyproject: Path | None) -> StaticConfig:
    """Read ``[tool.flashcheck.static]`` from `pyproject` (None or a file without the table gives the defaults)."""
    if pyproject is None:
        return StaticConfig(root=str(Path.cwd()))
    try:
        doc = tomllib.loads(pyproject.read_text(encoding="utf-8"))
    except FileNotFoundError as exc:
        raise InvalidArgument(f"config file {pyproject} does not exist; pass an existing pyproject.toml") from exc
    except tomllib.TOMLDecodeError as exc:
        raise InvalidArgument(f"{pyproject} is not valid TOML ({exc}); fix the file or pass --config") from exc
    table: Any = doc.get("tool", {}).get("flashcheck", {}).get("static", {})
    if not isinstance(table, Mapping):
        raise InvalidArgument(f"{pyproject}: [{TABLE}] must be a table, got {type(table).__name__}")
    return _parse_table(table, pyproject)


def _parse_table(table: Mapping[str, Any], src: Path) -> StaticConfig:
    values: dict[str, Any] = {"root": str(src.parent.resolve())}
    for key, value in table.items():
        field_name = _TOML_KEYS.get(key)
        if field_name is None:
            close = difflib.get_close_matches(key, list(_TOML_KEYS), n=1)
            hint = f"did you mean {close[0]!r}? " if close else ""
            raise InvalidArgument(
                f"{src}: unknown key {key!r} in [{TABLE}]; {hint}known keys: {', '.join(sorted(_TOML_KEYS))}"
            )
        where = f"{src}: [{TABLE}] {key}"
        if field_name in _BOOL_KEYS:
            if not isinstance(value, bool):
                raise InvalidArgument(f"{where} must be true or false, got {value!r}; write {key} = true")
            values[field_name] = value
        elif field_name in _STR_KEYS:
            if not isinstance(value, str):
                raise InvalidArgument(f'{where} must be a string path, got {value!r}; write {key} = "path"')
            values[field_name] = value if Path(value).is_absolute() else str(src.parent / value)
        else:
            values[field_name] = _str_list(value, where, key)
    return StaticConfig(**values)


def _str_list(value: Any, where: str, key: str) -> tuple[str, ...]:
    if isinstance(value, str) or not isinstance(value, Sequence) or not all(isinstance(v, str) for v in value):
        example = f'{key} = ["{value}"]' if isinstance(value, str) else f'{key} = ["..."]'
        raise InvalidArgument(f"{where} must be a list of strings, got {value!r}; write {example}")
    return tuple(value)
