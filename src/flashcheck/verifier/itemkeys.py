"""Keys of items stored into attributes (``self.d[k] = v``, ``self.graphs[mb][bs] = w``, ``self.bufs["cpu"].append(t)``,
``self.bufs[bs]["host"] = t``): the `ClassInfo.item_assigns` key a store is indexed under and the keys a read looks
up. Pure syntax: the index records the stores, the value flow reads them."""

from __future__ import annotations

import ast

from flashcheck.verifier.astutil import dotted

__all__ = [
    "defaulted_items",
    "filtered_items",
    "is_dict_call",
    "is_key",
    "item_keys",
    "item_lookup_keys",
    "keyed_items_keys",
    "keyed_lookup",
    "keyed_store_keys",
]


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
    down (``obj.x["decode"][bs]["host"] = t``) the keys between are left out."""
    found = _first_subscript(container)
    return _stored_under(found[1].attr, _first_key(found[0]), f"[{key!r}]") if found is not None else []


def _stored_under(attr: str, first: str, below: str) -> list[str]:
    """The keys a store is filed under: by its first key (a string's repr, or ``?``), and ``*`` for any."""
    return [f"{attr}[{first}]{below}", f"{attr}[*]{below}"]


def _looked_up(attr: str, first: str, below: str) -> list[str]:
    """The keys a read looks up: its string first key's and the variable keys' stores, or any first key's."""
    return [f"{attr}[*]{below}"] if first == "?" else [f"{attr}[{first}]{below}", f"{attr}[?]{below}"]


def defaulted_items(target: ast.Subscript) -> ast.Subscript:
    """`target` with each ``x.setdefault(k, default)`` in its chain read as ``x[k]`` (``self.bufs.setdefault(mb,
    {})[bs]`` is ``self.bufs[mb][bs]``); `target` itself when there is none. New nodes share the originals'
    positions."""
    value = target.value
    if isinstance(value, ast.Call) and isinstance(value.func, ast.Attribute) and value.func.attr == "setdefault":
        if value.args and not value.keywords:
            inner = ast.Subscript(value.func.value, value.args[0], ast.Load())
            value = defaulted_items(inner) if isinstance(value.func.value, ast.Subscript | ast.Call) else inner
    elif isinstance(value, ast.Subscript):
        value = defaulted_items(value)
    if value is target.value:
        return target
    return ast.copy_location(ast.Subscript(value, target.slice, getattr(target, "ctx", ast.Store())), target)


def _first_subscript(container: ast.Subscript) -> tuple[ast.Subscript, ast.Attribute] | None:
    """The first subscript of ``obj.x[i]...[j]`` (``obj.x[i]``) and ``obj.x``; None when no attribute is indexed."""
    first: ast.Subscript = container
    while isinstance(first.value, ast.Subscript):
        first = first.value
    return (first, first.value) if isinstance(first.value, ast.Attribute) else None


def keyed_items_keys(container: ast.expr, *, lookup: bool = False) -> list[str]:
    """The `ClassInfo.item_assigns` keys of the items stored into an item kept under a string key below another key
    (``obj.x[bs]["host"][i] = t``, ``obj.x[mb][bs]["blocks"].append(t)``, ``obj.x[mb]["host"][bs][i] = t``), by
    the chain's first key and its last such string key, whatever keys come between, as `keyed_store_keys` files
    items: ``x['decode']['host'][]`` or ``x[?]['host'][]`` and ``x[*]['host'][]`` for a store; for a `lookup`,
    ``x['decode']['host'][]`` and ``x[?]['host'][]`` under a string first key, else ``x[*]['host'][]``. Empty for
    other containers (``obj.x["cpu"]`` and its items have their own keys, `item_keys`)."""
    key: str | None = None
    node = container
    while isinstance(node, ast.Subscript) and isinstance(node.value, ast.Subscript):
        k = node.slice
        if key is None and isinstance(k, ast.Constant) and isinstance(k.value, str):
            key = k.value
        node = node.value
    if key is None or not (isinstance(node, ast.Subscript) and isinstance(node.value, ast.Attribute)):
        return []
    return (_looked_up if lookup else _stored_under)(node.value.attr, _first_key(node), f"[{key!r}][]")


def keyed_lookup(container: ast.expr, key: object) -> tuple[ast.expr, list[str]] | None:
    """The owner expression and the `ClassInfo.item_assigns` keys whose stores are ``container[key]`` for a string
    `key`: ``obj`` and ``x['k']`` for ``obj.x['k']``; for ``obj.x[i]['k']`` and ``obj.x[i][j]['k']`` the stores
    under that string key below the same first key, or below any first key when ``i`` is not a string constant
    (keys between are left out). None for other containers and keys."""
    if not isinstance(key, str):
        return None
    if isinstance(container, ast.Attribute):
        return container.value, [f"{container.attr}[{key!r}]"]
    found = _first_subscript(container) if isinstance(container, ast.Subscript) else None
    if found is None:
        return None
    return found[1].value, _looked_up(found[1].attr, _first_key(found[0]), f"[{key!r}]")


def item_lookup_keys(container: ast.expr) -> list[str]:
    """The `ClassInfo.item_assigns` keys whose stores are the items of `container`: ``x`` for ``obj.x``; every
    first key's (``x[]``) for ``obj.x[var]``; for ``obj.x['cpu']`` that key's and the variable keys' stores."""
    keyed = keyed_items_keys(container, lookup=True)
    if keyed:
        return keyed  # obj.x[bs]["host"]: what is stored into that item, not every item of obj.x
    keys = item_keys(container)
    if len(keys) < 2 or keys[1].endswith("[?][]"):
        return keys[:1]
    return [keys[1], keys[0][:-2] + "[?][]"]


def filtered_items(v: ast.expr) -> ast.expr | None:
    """`d` of ``{k: x for k, x in d.items() if ...}``: a dict of some of `d`'s items under their own keys."""
    if not (isinstance(v, ast.DictComp) and len(v.generators) == 1):
        return None
    gen = v.generators[0]
    it, target = gen.iter, gen.target
    pairs = (
        isinstance(target, ast.Tuple) and len(target.elts) == 2 and all(isinstance(e, ast.Name) for e in target.elts)
    )
    if not (pairs and isinstance(it, ast.Call) and isinstance(it.func, ast.Attribute) and it.func.attr == "items"):
        return None
    assert isinstance(target, ast.Tuple) and isinstance(it, ast.Call) and isinstance(it.func, ast.Attribute)
    k, x = (e.id for e in target.elts if isinstance(e, ast.Name))
    same = isinstance(v.key, ast.Name) and v.key.id == k and isinstance(v.value, ast.Name) and v.value.id == x
    return it.func.value if same and not it.args else None
