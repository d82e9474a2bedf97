"""Where a device attribute kept on a project object names (``self.dev = torch.device("cpu")``): read from the
stores of that attribute when each names a place literally; and what the names of a field's siblings say of a field
of an object whose class the project does not hold (``prefix_lengths`` beside ``prefix_lengths_device``, ``kv_len_h``
beside ``kv_len_d``). Part of `flashcheck.verifier.provenance.core.Provenance`.
"""

from __future__ import annotations

import ast
from typing import TYPE_CHECKING

from flashcheck.verifier.astutil import dotted, is_none, terminal_name
from flashcheck.verifier.index import ClassInfo, FunctionInfo, store_receiver, with_bases
from flashcheck.verifier.provenance.where import UNKNOWN, Where

if TYPE_CHECKING:
    from flashcheck.verifier.project import Project

__all__ = ["StoredPlaces"]


class StoredPlaces:
    """The stored-attribute half of `Provenance.device_value`, and what sibling field names say."""

    _attribute_names: frozenset[str] | None = None

    if TYPE_CHECKING:
        project: Project

        def device_value(self, dev: ast.expr, fn: FunctionInfo | None = None, depth: int = 0) -> Where: ...

    def _stored_device(self, dev: ast.Attribute, fn: FunctionInfo, depth: int) -> Where:
        """Where the stores of the attribute `dev` of a project object name (``self.dev = torch.device("cpu")``) when
        each names a place literally (a string, ``torch.device("cpu")``, a local bound once to one, another such
        attribute) and they agree; UNKNOWN otherwise (a store of a parameter: the attribute's name decides), also
        where the class computes the attribute (a property) or a store elsewhere binds it (``None`` stores aside)."""
        owner = self.project.instance_type(dev.value, fn, 1)
        if owner is None:
            return UNKNOWN
        family = self._place_family(owner)
        if any(dev.attr in c.methods or dev.attr in c.fields for c in family):
            return UNKNOWN  # a property, or a dataclass field the constructor may be handed
        stored = [(v, w) for c in family for v, w in c.attr_assigns.get(dev.attr, [])]
        outside = [vw for vw in self.project.attr_stores.get(dev.attr, [])[:16] if self._stored_on(vw, dev, family)]
        values = [vw for vw in [*stored, *outside] if not is_none(vw[0])]
        if not values or len(values) > 6:
            return UNKNOWN
        found = {self._literal_place(v, w, depth + 1) for v, w in values}
        return found.pop() if len(found) == 1 else UNKNOWN

    def _stored_on(self, store: tuple[ast.expr, FunctionInfo], dev: ast.Attribute, family: list[ClassInfo]) -> bool:
        """Whether ``obj.<attr> = value`` elsewhere stores on an object of the family (``runner.device = ...`` in a
        worker); a store on an object whose class the analysis cannot tell (``args.device``) is not counted."""
        value, where = store
        receiver = store_receiver(where, value, dev.attr)
        cls = self.project.instance_type(receiver, where, 1) if receiver is not None else None
        return cls is not None and any(cls is c for c in family)

    def _place_family(self, owner: ClassInfo) -> list[ClassInfo]:
        """Every class an object of class `owner` may be, with their bases (a mixin's subclass's other bases store
        too): `owner`, its subclasses also through generic bases, and all of their bases."""
        below, stack, seen = [owner], [owner], {id(owner)}
        while stack and len(below) < 64:
            c = stack.pop()
            for s in [*c.subclasses, *self.project.generic_subclasses.get(id(c), [])]:
                if id(s) not in seen:
                    seen.add(id(s))
                    below.append(s)
                    stack.append(s)
        family: dict[int, ClassInfo] = {}
        for c in below:
            family.update((id(b), b) for b in with_bases(c))
        return list(family.values())

    def _literal_place(self, dev: ast.expr, fn: FunctionInfo, depth: int) -> Where:
        """`device_value` of an expression that names a place literally; UNKNOWN for names it would only guess."""
        if isinstance(dev, ast.Call) and dotted(dev.func) in ("torch.device", "device") and dev.args:
            dev = dev.args[0]
        if isinstance(dev, ast.Constant):
            return self.device_value(dev, fn, depth)
        if isinstance(dev, ast.Name) and dev.id not in fn.params and depth < 4:
            values = fn.local_assigns.get(dev.id)
            return self._literal_place(values[0], fn, depth + 1) if values and len(values) == 1 else UNKNOWN
        if isinstance(dev, ast.Attribute) and depth < 4:
            return self._stored_device(dev, fn, depth)
        return UNKNOWN

    def _host_by_sibling(self, expr: ast.Attribute) -> bool:
        """Whether the names of a field's siblings make it the host copy, on an object of unknown class (a compiled
        extension's struct): serving code reads, on a receiver of the same name, the field's device copy
        (``attn_inputs.prefix_lengths_device``, ``*_gpu``, ``*_cuda``) and no host copy, or the field is ``<x>_h``
        and ``<x>_d`` is read on any object (rtp-llm's naming of host and device copies; a ``_d`` name alone says
        nothing: ``kernel_h``/``kernel_d`` may be plain numbers)."""
        names, recv, attr = self.project.attribute_reads(), terminal_name(expr.value), expr.attr
        if attr.endswith("_h") and len(attr) > 2 and f"{attr[:-1]}d" in self._read_attribute_names():
            return True
        device = any((recv, f"{attr}_{w}") in names for w in ("device", "gpu", "cuda"))
        return device and not any((recv, f"{attr}_{w}") in names for w in ("cpu", "host"))

    def _read_attribute_names(self) -> frozenset[str]:
        if self._attribute_names is None:
            self._attribute_names = frozenset(a for _, a in self.project.attribute_reads())
        return self._attribute_names
