from __future__ import annotations

from typing import Dict, Iterator, Protocol, Tuple


class TraceHook(Protocol):
    def after_step(self, step_idx: int) -> None: ...


HOOKS: Dict[str, Tuple[TraceHook, int]] = {}


def register_hook(name: str, hook: TraceHook, every_n: int = 1) -> None:
    assert every_n > 0, "every_n must be positive"  # expect: FC109
    HOOKS[name] = (hook, every_n)


def due_hooks(step_idx: int) -> Iterator[TraceHook]:
    for hook, every_n in HOOKS.values():
        if step_idx % every_n == 0:
            yield hook
