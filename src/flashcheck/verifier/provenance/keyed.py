"""Items stored under string keys (``self.bufs[bs]["host"] = t``, ``{"metadata": m}["metadata"]``) as the value
flow reads them: the stores a keyed read may see, also through a local or a parameter bound to part of the chain.
Part of `flashcheck.verifier.provenance.flow.ValueFlow`."""

from __future__ import annotations

import ast
from typing import TYPE_CHECKING

from flashcheck.verifier.astutil import annotation, dotted, terminal_name
from flashcheck.verifier.index import ClassInfo, with_bases
from flashcheck.verifier.itemkeys import is_key, keyed_lookup
from flashcheck.verifier.project import FunctionInfo, Project

__all__ = ["KeyedItems", "last_entries", "literal_item_stores", "literal_pairs", "name_item_stores"]

Source = tuple[ast.expr, FunctionInfo]


class KeyedItems:
    """The keyed-item half of `flashcheck.verifier.provenance.flow.ValueFlow`."""

    project: Project
    _typed_dict_index: dict[tuple[int, str], list[Source]] | None = None

    if TYPE_CHECKING:

        def sources(self, expr: ast.expr, fn: FunctionInfo) -> list[Source]: ...

    def keyed_sources(self, expr: ast.Subscript, fn: FunctionInfo, depth: int = 0) -> list[Source]:
        """The values stored into an attribute under the string key `expr` reads (``self.d["decode"]``,
        ``self.bufs[bs]["host"]``); empty for another key or when no store is known."""
        at = keyed_lookup(expr.value, expr.slice.value) if isinstance(expr.slice, ast.Constant) else None
        if at is None and isinstance(expr.slice, ast.Constant) and isinstance(expr.slice.value, str):
            return self._rebased_keyed(expr, fn, depth) if depth < 2 else []
        cls = self.project.instance_type(at[0], fn) if at else None
        return [s for c in with_bases(cls) for k in (at[1] if at else []) for s in c.item_assigns.get(k, [])]

    def _rebased_keyed(self, expr: ast.Subscript, fn: FunctionInfo, depth: int) -> list[Source]:
        """`keyed_sources` of ``d[bs]["host"]`` where ``d`` is a local or a parameter bound to an item of an
        attribute (``d = self.bufs[mb]``, a caller passing ``self.bufs[mb]``): the same read on what it is bound
        to, ``self.bufs[mb][bs]["host"]``, in the code that binds it."""
        keys: list[ast.expr] = []
        root: ast.expr = expr.value
        while isinstance(root, ast.Subscript):
            keys.append(root.slice)
            root = root.value
        if not isinstance(root, ast.Name):
            return []
        out: list[Source] = []
        for v, where in self.sources(root, fn)[:8]:
            if not isinstance(v, ast.Attribute | ast.Subscript):
                continue
            rebuilt: ast.expr = v  # synthetic nodes over `v`: keyed_lookup reads them as syntax only
            for k in reversed(keys):
                rebuilt = ast.Subscript(rebuilt, k)
            out.extend(self.keyed_sources(ast.Subscript(rebuilt, expr.slice), where, depth + 1))
        return out

    def _keyed(self, container: ast.expr, key: str, fn: FunctionInfo, depth: int = 0) -> list[Source] | None:
        found = self._keyed_flow(container, key, fn, depth)
        if found is None and depth == 0 and (cls := self.tensor_field(container, key, fn)) is not None:
            found = self._typed_dicts().get((id(cls), key))  # batch["seq_lens"] of a ForwardBatch: its literals'
        return found

    def tensor_field(self, container: ast.expr, key: str, fn: FunctionInfo) -> ClassInfo | None:
        """The ``typing.TypedDict`` class `container` is declared with, when it declares `key` a tensor
        (``seq_lens: torch.Tensor``)."""
        cls = self.project.instance_type(container, fn)
        if cls is None or not _is_typed_dict(cls):
            return None
        ann = next((c.attr_types[key] for c in with_bases(cls) if key in c.attr_types), None)
        while isinstance(ann, ast.Subscript) and terminal_name(ann.value) in _QUALIFIERS:  # NotRequired[Tensor]
            ann = ann.slice.elts[0] if isinstance(ann.slice, ast.Tuple) and ann.slice.elts else ann.slice
        return cls if ann is not None and terminal_name(annotation(ann) or ann) == "Tensor" else None

    def _typed_dicts(self) -> dict[tuple[int, str], list[Source]]:
        """The values of each ``typing.TypedDict`` class of the project under each key, wherever the project builds one:
        a dict literal returned by a function annotated with the class or assigned to a name so annotated, a call of
        the class with keywords, and ``meta["k"] = v`` on a parameter or local so annotated."""
        if self._typed_dict_index is None:
            self._typed_dict_index = _typed_dict_index(self.project)
        return self._typed_dict_index

    def _keyed_flow(self, container: ast.expr, key: str, fn: FunctionInfo, depth: int = 0) -> list[Source] | None:
        """The values stored under a string key when every dict the container may be is a literal or ``dict(...)``
        (``res["metadata"]`` of ``{"metadata": m, "output": t}`` is ``m``), also through names, parameters and calls
        that hand one on (``batch`` filled by ``build_forward_batch()``, which returns a literal), or an item of an
        attribute whose stores under that key are known (``entry = self.bufs[mb][bs]``, then ``entry["host"]``); None
        when some dict is neither."""
        own = name_item_stores({container.id}, key, fn) if isinstance(container, ast.Name) else []
        sources = self.sources(container, fn)  # kw = base_kwargs(cfg); kw.update(indptr=ptr): own decides the key
        if not sources:
            return own or None
        out: list[Source] = []
        for v, where in sources[:8]:
            if isinstance(v, ast.Name | ast.Call) and not _literal(v) and depth < 3:
                handed = self._keyed_flow(v, key, where, depth + 1)
                if handed is None:
                    return own or None
                out.extend(handed)
                continue
            if isinstance(v, ast.Dict) and all(k is not None for k in v.keys):  # not {**other, ...}
                pairs = zip(v.keys, v.values, strict=False)
                out.extend((item, where) for k, item in pairs if isinstance(k, ast.Constant) and k.value == key)
                out.extend(literal_item_stores(v, key, where))
                if isinstance(where.node, ast.Module):  # a module's global table: what its functions store there
                    names = [n for n, vs in where.local_assigns.items() if len(vs) == 1 and vs[0] is v]
                    out.extend(s for n in names for s in self.project.module_keyed_items(where.module, n, key))
            elif isinstance(v, ast.Call) and dotted(v.func) == "dict" and not v.args:
                out.extend((kw.value, where) for kw in v.keywords if kw.arg == key)
                out.extend(literal_item_stores(v, key, where))
            elif isinstance(v, ast.Subscript | ast.Attribute) and (
                stored := self.keyed_sources(ast.Subscript(v, ast.Constant(key)), where)
            ):
                out.extend(stored)
            else:
                return own or None
        return out + own or None  # a key the literals do not hold: stored later (d["k"] = v), read every item


def literal_item_stores(literal: ast.expr, key: str, fn: FunctionInfo) -> list[Source]:
    """What `fn` stores under `key` into a local bound to `literal` (``state = {"decode": None}; state["decode"] =
    Wrapper(...)``, ``kw = {...}; kw["backend"] = "trtllm-gen"``, ``kw.setdefault(key, v)``, ``kw.update(key=v)``)."""
    return name_item_stores({n for n, values in fn.local_assigns.items() if any(x is literal for x in values)}, key, fn)


def name_item_stores(names: set[str], key: str, fn: FunctionInfo) -> list[Source]:
    """What `fn` stores under `key` into the dicts its locals `names` hold (`literal_item_stores`' forms)."""
    out: list[Source] = []
    for a in fn.assigns if names else ():
        targets = a.targets if isinstance(a, ast.Assign) else [a.target]
        for t in targets:
            named = isinstance(t, ast.Subscript) and isinstance(t.value, ast.Name) and t.value.id in names
            if named and isinstance(t, ast.Subscript) and is_key(t.slice, key) and a.value is not None:
                out.append((a.value, fn))
    for c in fn.calls if names else ():  # kw.setdefault("last_page_len", v), kw.update(indptr=v) or ({...})
        f = c.func
        if not (isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name) and f.value.id in names):
            continue
        if f.attr == "setdefault" and len(c.args) == 2 and is_key(c.args[0], key):
            out.append((c.args[1], fn))
        elif f.attr == "update":
            out += [(k.value, fn) for k in c.keywords if k.arg == key]
            d = c.args[0] if c.args else None
            out += (
                [(v, fn) for k, v in zip(d.keys, d.values, strict=False) if is_key(k, key)]
                if isinstance(d, ast.Dict)
                else []
            )
    return out


def _literal(v: ast.expr) -> bool:
    """``dict(...)`` without positional arguments: a literal dict built by keywords."""
    return isinstance(v, ast.Call) and dotted(v.func) == "dict" and not v.args


_QUALIFIERS = frozenset({"NotRequired", "Required", "ReadOnly", "Annotated"})


def _is_typed_dict(cls: ClassInfo) -> bool:
    """A ``typing.TypedDict`` class (or one derived from such a class of the project)."""
    return any(terminal_name(b) == "TypedDict" for c in with_bases(cls) for b in c.node.bases)


def _typed_dict_index(project: Project) -> dict[tuple[int, str], list[Source]]:
    """`KeyedItems._typed_dicts`: (id(class), key) -> the values the project puts under that key."""
    index: dict[tuple[int, str], list[Source]] = {}

    def put(cls: ClassInfo | None, key: object, value: ast.expr, fn: FunctionInfo) -> None:
        if cls is not None and isinstance(key, str) and _is_typed_dict(cls):
            index.setdefault((id(cls), key), []).append((value, fn))

    for fn in project.all_functions():
        built = [(fn.local_types.get(n), v) for n, vs in fn.local_assigns.items() for v in vs]
        if not isinstance(fn.node, ast.Module):
            built += [(fn.node.returns, r) for r in fn.returns]
        for ann, value in built:  # meta: DecodeMeta = {...}; def build() -> ForwardBatch: return {...}
            if ann is not None and isinstance(value, ast.Dict):
                cls = project._annotation_class(ann, fn, 1)
                for k, v in zip(value.keys, value.values, strict=True):
                    put(cls, k.value if isinstance(k, ast.Constant) else None, v, fn)
        for a in fn.assigns:  # meta["kv_indices"] = torch.empty(...) on a local or parameter so annotated
            t = a.targets[0] if isinstance(a, ast.Assign) and len(a.targets) == 1 else None
            if isinstance(a, ast.Assign) and isinstance(t, ast.Subscript) and isinstance(t.value, ast.Name):
                name, k = t.value.id, t.slice
                cls = project._annotation_class(fn.local_types.get(name) or fn.params.get(name), fn, 1)
                put(cls, k.value if isinstance(k, ast.Constant) else None, a.value, fn)
        for call in fn.calls:  # ForwardBatch(seq_lens=..., ...)
            made = project.resolve_def(call.func, fn) if isinstance(call.func, ast.Name | ast.Attribute) else None
            for kw in call.keywords if isinstance(made, ClassInfo) else ():
                put(made if isinstance(made, ClassInfo) else None, kw.arg, kw.value, fn)
    return index


def literal_pairs(d: ast.expr, method: str, fn: FunctionInfo) -> list[Source]:
    """The items of ``d.items()`` (``(key, value)`` tuples, made once per literal) or ``d.keys()`` where `d` is a
    dict literal, written in place or bound once to a local; empty otherwise."""
    if isinstance(d, ast.Name) and d.id not in fn.params and len(bound := fn.local_assigns.get(d.id, [])) == 1:
        d = bound[0]
    if not isinstance(d, ast.Dict) or any(k is None for k in d.keys):
        return []
    if method == "keys":
        return [(k, fn) for k in d.keys if k is not None]
    made: list[ast.expr] | None = d.__dict__.get("_flashcheck_pairs")  # made once, kept on the literal
    if made is None:
        made = d.__dict__["_flashcheck_pairs"] = [
            ast.copy_location(ast.Tuple([k, v], ast.Load()), v) for k, v in zip(d.keys, d.values, strict=True) if k
        ]
    return [(t, fn) for t in made]


def last_entries(d: ast.Dict, key: str) -> tuple[list[ast.expr], list[ast.expr]]:
    """What a dict literal may hold under `key`: its last entry under that key, and the ``**spread`` dicts after it
    (or all of them, where no entry names the key), whose own items may replace it: ``{**base, "indptr": host}``
    holds ``host``, not what ``base`` holds under "indptr"."""
    items: list[ast.expr] = []
    spreads: list[ast.expr] = []
    for k, item in zip(d.keys, d.values, strict=False):
        if k is None:
            spreads.append(item)
        elif is_key(k, key):
            items, spreads = [item], []
    return items, spreads
