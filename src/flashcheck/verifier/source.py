"""Source files: discovery, one parse per file, module names and ``# flashcheck: ignore[...]`` comments.

A file that cannot be read or parsed becomes a `SourceFile` with ``tree=None`` and an ``error``; the engine reports
it (FC199) and carries on with the other files.
"""

from __future__ import annotations

import ast
import fnmatch
import importlib.util
import io
import os
import re
import tokenize
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

from flashcheck.errors import InvalidArgument
from flashcheck.verifier.module_idioms import desugar_module_idioms
from flashcheck.verifier.operator_idioms import desugar_namespace_items, desugar_operator_idioms

__all__ = ["SourceFile", "Suppression", "discover", "module_name", "parse_source", "read_source", "relpath"]

_SKIP_DIRS = frozenset(
    {
        ".git",
        ".hg",
        ".venv",
        "venv",
        "__pycache__",
        ".mypy_cache",
        ".ruff_cache",
        ".tox",
        "node_modules",
        ".eggs",
    }
)
# Build outputs (``build/lib/...``, wheels in ``dist/``) are skipped, but a package or namespace folder of that name
# (``epserve/dist/a2a.py``, ``pkg/dist/comm/a2a.py``) is source: such a folder is walked when it, or a folder in it,
# holds Python files, and setuptools' output folders inside a ``build`` folder are never walked.
_BUILD_DIRS = frozenset({"build", "dist"})
_SETUPTOOLS_OUTPUTS = ("lib.", "bdist.", "temp.", "scripts-")
_SUPPRESS = re.compile(r"#\s*flashcheck:\s*ignore(?:\[(?P<ids>[^\]]*)\])?(?P<rest>.*)$")


@dataclass(frozen=True)
class Suppression:
    """One ``# flashcheck: ignore[IDS] reason`` comment; it covers `line` (and the next line if it stands alone)."""

    line: int
    ids: tuple[str, ...]
    reason: str
    covers: tuple[int, ...]


@dataclass
class SourceFile:
    """One Python file, parsed once."""

    path: Path
    relpath: str
    module: str
    text: str  # empty once `flashcheck.verifier.frontend` summarised the file (`lines` holds it)
    tree: ast.Module | None
    error: str | None = None
    error_line: int = 1
    error_column: int = 1
    lines: list[str] = field(default_factory=list)
    suppressions: list[Suppression] = field(default_factory=list)

    @cached_property
    def is_test(self) -> bool:
        name = self.path.name
        parts = set(Path(self.relpath).parts[:-1])
        return (
            name.startswith("test_")
            or name.endswith("_test.py")
            or name == "conftest.py"
            or bool(parts & {"tests", "test", "testing"})
        )

    @cached_property
    def is_tooling(self) -> bool:
        """Tests and benchmarks: code that drives the engine for one known case, never the serving path."""
        parts = set(Path(self.relpath).parts[:-1])
        return (
            self.is_test
            or bool(parts & {"benchmarks", "benchmark", "bench", "perf"})
            or self.path.name.startswith(("bench_", "benchmark_"))
        )

    def line_text(self, line: int) -> str:
        return self.lines[line - 1].strip() if 0 < line <= len(self.lines) else ""


def discover(paths: Sequence[str], exclude: Sequence[str], root: Path) -> list[Path]:
    """Every ``.py`` file under `paths` (files are taken as given), sorted, minus `exclude` patterns."""
    out: set[Path] = set()
    for raw in paths:
        p = Path(raw)
        if not p.exists():
            raise InvalidArgument(f"path {raw!r} does not exist; pass files or directories to check")
        if p.is_file():
            out.add(p.resolve())
            continue
        for dirpath, dirnames, filenames in os.walk(p, onerror=_unreadable):
            kept = (d for d in dirnames if not _excluded(Path(dirpath, d, "*").resolve(), exclude, root))
            dirnames[:] = sorted(d for d in kept if _walked(dirpath, d))  # an excluded folder is not even listed
            out.update(Path(dirpath, f).resolve() for f in filenames if f.endswith(".py"))
    return sorted(f for f in out if not _excluded(f, exclude, root))


def _unreadable(exc: OSError) -> None:
    """A folder under the paths that cannot be listed: its files would go unchecked without a word."""
    raise InvalidArgument(
        f"cannot read folder {exc.filename}: {exc.strerror}; make it readable or add it to exclude (or pass paths "
        "that leave it out)"
    )


def _walked(parent: str, name: str) -> bool:
    """Whether `discover` descends into directory `name` of `parent`."""
    if name in _SKIP_DIRS or name.endswith(".egg-info"):
        return False
    if os.path.basename(parent) == "build" and (name == "lib" or name.startswith(_SETUPTOOLS_OUTPUTS)):
        return False  # build/lib/pkg: setuptools' copy of the sources
    return name not in _BUILD_DIRS or _holds_python(os.path.join(parent, name), 2)


def _holds_python(path: str, depth: int) -> bool:
    """A ``.py`` file in `path`, or in a folder below it (`depth` levels), other than build outputs."""
    try:
        entries = list(os.scandir(path))
    except OSError:
        return True  # walked, so that the walk reports what it cannot read
    if any(e.name.endswith(".py") and e.is_file() for e in entries):
        return True
    return depth > 1 and any(e.is_dir() and _walked(path, e.name) and _holds_python(e.path, depth - 1) for e in entries)


def _excluded(path: Path, patterns: Sequence[str], root: Path) -> bool:
    rel = relpath(path, root)
    return any(fnmatch.fnmatch(rel, pat) or fnmatch.fnmatch(path.name, pat) for pat in patterns)


def relpath(path: Path, root: Path) -> str:
    """`path` relative to `root` (``/``-separated), or the whole path when it is outside `root`."""
    try:
        return path.relative_to(root).as_posix()
    except ValueError:
        return path.as_posix()


def module_name(path: Path, root: Path | None = None) -> str:
    """Dotted module name: climb while the parent directory is a package (has ``__init__.py``).

    A file outside any regular package (a namespace package, PEP 420) is named by its path relative to `root`
    (``srt/layers/attention/backend.py`` is ``srt.layers.attention.backend``), so imports between such folders
    resolve; `Project` also accepts any dotted suffix of that name. A regular package inside a namespace folder that
    is itself inside a regular package (``pkg/layers/attention/``, ``layers`` without ``__init__.py``) is named from
    the outermost one, as Python imports it (``pkg.layers.attention``).
    """
    parts = [] if path.name == "__init__.py" else [path.stem]
    d = path.parent
    if root is not None and not (d / "__init__.py").is_file():
        try:
            rel = path.relative_to(root).with_suffix("").parts
        except ValueError:
            rel = ()
        if rel and all(p.isidentifier() for p in rel):
            return ".".join(rel)
    while (d / "__init__.py").is_file():
        parts.append(d.name)
        if d.parent == d:
            break
        d = d.parent
    outer = _outer_package(d, root) if parts and root is not None else None
    if outer is not None:  # a namespace folder inside a regular package (pkg/layers/attention/): pkg.layers.attention
        rel = path.relative_to(outer.parent).with_suffix("").parts
        if all(p.isidentifier() for p in rel):
            return ".".join(rel[:-1] if path.name == "__init__.py" else rel)
    return ".".join(reversed(parts)) or path.stem


def _outer_package(d: Path, root: Path) -> Path | None:
    """The outermost regular package (a folder with ``__init__.py``) above folder `d` and within `root`, or None."""
    found = None
    try:
        depth = len(d.relative_to(root).parts)
    except ValueError:
        return None
    for _ in range(depth):
        d = d.parent
        if (d / "__init__.py").is_file():
            found = d
    return found


def read_source(path: Path, root: Path) -> SourceFile:
    """Read and parse `path`; never raises for a bad file (the error is recorded instead)."""
    rel = relpath(path, root)
    mod = module_name(path, root)
    try:
        data = path.read_bytes()
    except OSError as exc:
        return SourceFile(path, rel, mod, "", None, error=f"cannot read: {exc}")
    return parse_source(path, rel, mod, data)


def parse_source(path: Path, rel: str, mod: str, data: bytes) -> SourceFile:
    """Parse the bytes read from `path` (reported as `rel`, module `mod`); never raises for a bad file."""
    try:  # as Python reads a module: a UTF-8 byte-order mark or a coding declaration, newlines made ``\n``
        text = importlib.util.decode_source(data)
    except (SyntaxError, UnicodeDecodeError, LookupError) as exc:
        return SourceFile(path, rel, mod, "", None, error=f"cannot read: {exc}")
    lines = text.split("\n")  # the tokenizer's lines: str.splitlines also splits on \f, \x1c-\x1e, \x85, \u2028, \u2029
    if lines[-1] == "":
        lines.pop()
    try:
        tree = ast.parse(text, filename=str(path))
    except (SyntaxError, ValueError) as exc:
        line = getattr(exc, "lineno", None) or 1
        col = getattr(exc, "offset", None) or 1
        msg = getattr(exc, "msg", None) or str(exc)
        return SourceFile(
            path, rel, mod, text, None, error=f"does not parse: {msg}", error_line=line, error_column=col, lines=lines
        )
    desugar_module_idioms(tree, text)  # self.register_buffer("k", t), self._buffers["k"]: plain attributes
    desugar_operator_idioms(tree, text)  # operator.attrgetter("seq_lens")(batch): batch.seq_lens
    desugar_namespace_items(tree, text)  # vars(bufs)["kv_indptr"]: bufs.kv_indptr
    sf = SourceFile(path, rel, mod, text, tree, lines=lines)
    if "flashcheck:" in text:
        sf.suppressions = list(_suppressions(text, lines))
    return sf


def _comments(text: str) -> Iterator[tuple[int, str]]:
    """(line, text) of real comments: a marker inside a string or docstring is not a suppression."""
    try:
        for tok in tokenize.generate_tokens(io.StringIO(text).readline):
            if tok.type == tokenize.COMMENT and "flashcheck:" in tok.string:
                yield tok.start[0], tok.string
    except (tokenize.TokenError, SyntaxError):  # the file parsed, so this is unreachable in practice
        return


def _suppressions(text: str, lines: list[str]) -> Iterator[Suppression]:
    for i, comment in _comments(text):
        line = lines[i - 1]
        m = _SUPPRESS.search(comment)
        if m is None:
            continue
        ids = tuple(s.strip().upper() for s in (m.group("ids") or "").split(",") if s.strip())
        # The reason ends where another comment starts: `# flashcheck: ignore[FC101]  # TODO` has no reason.
        reason = m.group("rest").split("#", 1)[0].strip().lstrip(":-—–").strip()
        standalone = line.lstrip().startswith("#")
        covers = (i, _next_code_line(lines, i)) if standalone else (i,)
        yield Suppression(i, ids, reason, covers)


def _next_code_line(lines: list[str], i: int) -> int:
    for j in range(i, len(lines)):
        s = lines[j].strip()
        if s and not s.startswith("#"):
            return j + 1
    return i
