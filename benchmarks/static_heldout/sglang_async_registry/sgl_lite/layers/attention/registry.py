from typing import Callable, Dict, Type

ATTENTION_BACKENDS: Dict[str, Type] = {}


def register_backend(name: str) -> Callable[[Type], Type]:
    assert name not in ATTENTION_BACKENDS, f"backend {name} registered twice"  # expect: FC109

    def _wrap(cls: Type) -> Type:
        ATTENTION_BACKENDS[name] = cls
        cls._backend_name = name
        return cls

    return _wrap


def create_backend(name: str, model_runner):
    if name not in ATTENTION_BACKENDS:
        raise KeyError(f"unknown attention backend {name!r}; known: {sorted(ATTENTION_BACKENDS)}")
    return ATTENTION_BACKENDS[name](model_runner)
