"""Constructor injection: `resolve(Iface)` builds the bound class from its `__init__` annotations."""
import inspect
from typing import Any, Callable, Dict, List, Type, TypeVar

T = TypeVar("T")


class Container:
    def __init__(self, config):
        self._config = config
        self._impls: Dict[type, type] = {}
        self._factories: Dict[type, Callable[["Container"], Any]] = {}
        self._singletons: Dict[type, Any] = {}
        self._resolving: List[type] = []
        self._frozen = False

    def register(self, iface: type, impl: type) -> None:
        assert issubclass(impl, iface), f"{impl.__name__} does not implement {iface.__name__}"  # expect: FC109
        if self._frozen:
            raise RuntimeError(f"container is frozen; cannot bind {iface.__name__}")
        self._impls[iface] = impl

    def register_factory(self, iface: type, factory: Callable[["Container"], Any]) -> None:
        assert callable(factory)  # expect: FC109
        self._factories[iface] = factory

    def resolve(self, iface: Type[T]) -> T:
        if iface in self._singletons:
            return self._singletons[iface]
        if iface in self._resolving:
            raise RuntimeError(f"dependency cycle through {iface.__name__}")
        self._resolving.append(iface)
        try:
            if iface in self._factories:
                obj = self._factories[iface](self)
            else:
                obj = self._construct(self._impls.get(iface, iface))
        finally:
            self._resolving.pop()
        self._singletons[iface] = obj
        return obj

    def _construct(self, impl: type) -> Any:
        kwargs = {}
        for p in list(inspect.signature(impl.__init__).parameters.values())[1:]:
            if p.name == "config":
                kwargs["config"] = self._config
            elif p.annotation is not inspect.Parameter.empty:
                kwargs[p.name] = self.resolve(p.annotation)
            elif p.default is inspect.Parameter.empty:
                raise TypeError(f"{impl.__name__}.__init__ parameter {p.name!r} has no annotation")
        return impl(**kwargs)

    def freeze(self) -> None:
        assert not self._resolving, "freeze() called while resolving"  # ok: FC109
        assert len(self._impls) + len(self._factories) > 0  # ok: FC109
        self._frozen = True
