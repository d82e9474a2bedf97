"""Keys of items stored into attributes (``self.d[k] = v``, ``self.graphs[mb][bs] = w``, ``self.bufs["cpu"].append(t)``,
``self.bufs[bs]["host"] = t``): the `ClassInfo.item_assigns` key a store is indexed under and the keys a read looks
up. Pure syntax: the index records the stores, the value flow reads them."""

from __future__ import annotations

import ast

from flashcheck.verifier.astutil import dotted

__all__ = ["is_dict_call", "is_key", "item_keys", "item_lookup_keys", "keyed_lookup", "keyed_store_keys"]


def is_key(node: ast.expr | None, key: str) -> bool:
    """Whether `node` is the constant `key`."""
    return isinstance(node, ast.Constant) and node.value == key


def is_dict_call(node: ast.expr) -> bool:
    """Whether `node` is a ``dict(...)`` call."""
    return isinstance(node, ast.Call) and dotted(node.func) == "dict"


def item_keys(container: ast.expr, *, of_self: bool = False) -> list[str]:
    """The `ClassInfo.item_assigns` keys of the items of ``obj.x`` (``x``) and of ``obj.x[k]``, ``obj.x[i][j]``:
    ``x[]`` (every first key), then ``x['cpu'][]`` for a string-constant first key or ``x[?][]`` for another; empty
    for other containers, and with `of_self` when ``obj`` is not ``self``."""
    first, node = None, container
    while isinstance(node, ast.Subscript):
        first, node = node, node.value
    if not isinstance(node, ast.Attribute) or (of_self and dotted(node.value) != "self"):
        return []
    if first is None:
        return [node.attr]
    key = first.slice
    if isinstance(key, ast.Constant) and isinstance(key.value, str):
        return [f"{node.attr}[]", f"{node.attr}[{key.value!r}][]"]
    return [f"{node.attr}[]", f"{node.attr}[?][]"]


def _first_key(container: ast.Subscript) -> str:
    k = container.slice
    return repr(k.value) if isinstance(k, ast.Constant) and isinstance(k.value, str) else "?"


def keyed_store_keys(container: ast.Subscript, key: str) -> list[str]:
    """The `ClassInfo.item_assigns` keys of a store under the string `key` into ``obj.x[k]`` (``obj.x[k]["host"] =
    t``): ``x['cpu']['host']`` or ``x[?]['host']`` by the first key, and ``x[*]['host']`` for any first key; deeper
    down (``obj.x[mb][bs]["host"] = t``) only ``x[*]['host']``."""
    if not isinstance(container.value, ast.Attribute):
        base = _deep_attribute(container)
        return [f"{base.attr}[*][{key!r}]"] if base is not None else []
    attr = container.value.attr
    return [f"{attr}[{_first_key(container)}][{key!r}]", f"{attr}[*][{key!r}]"]


def _deep_attribute(container: ast.Subscript) -> ast.Attribute | None:
    """``obj.x`` of ``obj.x[i][j]...``, two keys deep or more; None for other containers."""
    node: ast.expr = container.value
    while isinstance(node, ast.Subscript):
        node = node.value
    return node if isinstance(node, ast.Attribute) else None


def keyed_lookup(container: ast.expr, key: object) -> tuple[ast.expr, list[str]] | None:
    """The owner expression and the `ClassInfo.item_assigns` keys whose stores are ``container[key]`` for a string
    `key`: ``obj`` and ``x['k']`` for ``obj.x['k']``; for ``obj.x[i]['k']`` the stores under that string key below
    the same first key, or below any first key when ``i`` is not a string constant; for ``obj.x[i][j]['k']`` the
    stores under that key below any keys. None for other containers and keys."""
    if not isinstance(key, str):
        return None
    if isinstance(container, ast.Attribute):
        return container.value, [f"{container.attr}[{key!r}]"]
    if not isinstance(container, ast.Subscript):
        return None
    if not isinstance(container.value, ast.Attribute):
        base = _deep_attribute(container)
        return (base.value, [f"{base.attr}[*][{key!r}]"]) if base is not None else None
    first, attr = _first_key(container), container.value.attr
    keys = [f"{attr}[*][{key!r}]"] if first == "?" else [f"{attr}[{first}][{key!r}]", f"{attr}[?][{key!r}]"]
    return container.value.value, keys


def item_lookup_keys(container: ast.expr) -> list[str]:
    """The `ClassInfo.item_assigns` keys whose stores are the items of `container`: ``x`` for ``obj.x``; every
    first key's (``x[]``) for ``obj.x[var]``; for ``obj.x['cpu']`` that key's and the variable keys' stores."""
    keys = item_keys(container)
    if len(keys) < 2 or keys[1].endswith("[?][]"):
        return keys[:1]
    return [keys[1], keys[0][:-2] + "[?][]"]
