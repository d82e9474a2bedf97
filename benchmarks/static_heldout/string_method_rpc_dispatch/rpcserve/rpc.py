"""String-named method dispatch shared by the executors, the worker threads and the runner."""

from __future__ import annotations

import functools
import logging
import queue
import threading
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

logger = logging.getLogger(__name__)

# Methods an executor may invoke on a worker by name. Everything else is refused, so that a
# client's collective_rpc("__del__") or a typo never reaches the worker object.
WORKER_RPC_METHODS = frozenset(
    {
        "init_device",
        "load_model",
        "determine_num_available_pages",
        "initialize_cache",
        "compile_or_warm_up_model",
        "execute_model",
        "sample_tokens",
        "record_step_stats",
        "dump_kv_stats",
        "get_memory_stats",
        "check_health",
        "shutdown",
    }
)
# What the engine core sends on every step, in order.
STEP_RPC_METHODS = ("execute_model", "sample_tokens", "record_step_stats")
# Operator commands of the admin endpoint.
ADMIN_RPC_METHODS = ("dump_kv_stats", "get_memory_stats", "check_health")

assert set(STEP_RPC_METHODS) <= WORKER_RPC_METHODS


class RpcError(RuntimeError):
    pass


def run_method(obj: Any, method: str | bytes | Callable, args: tuple = (), kwargs: dict | None = None) -> Any:
    """Run a method of ``obj`` given by name (or a function taking ``obj`` first), as vLLM's run_method."""
    if kwargs is None:
        kwargs = {}
    if isinstance(method, bytes):
        method = method.decode()
    if isinstance(method, str):
        try:
            func = getattr(obj, method)
        except AttributeError as exc:
            raise NotImplementedError(f"{type(obj).__name__} has no method {method!r}") from exc
    else:
        func = functools.partial(method, obj)
    return func(*args, **kwargs)


class MethodAllowList:
    """A string-keyed allow-list of method names, optionally mapped onto a prefix."""

    def __init__(self, names: Iterable[str], prefix: str = "") -> None:
        self._names = frozenset(names)
        self._prefix = prefix

    def __contains__(self, name: object) -> bool:
        return name in self._names

    def check(self, name: str) -> str:
        if name not in self._names:
            raise RpcError(f"method {name!r} is not allowed; allowed: {sorted(self._names)}")
        return f"{self._prefix}{name}"

    def resolve(self, obj: Any, name: str) -> Callable:
        return getattr(obj, self.check(name))


@dataclass
class RpcCommand:
    method: str
    args: tuple = ()
    kwargs: dict = field(default_factory=dict)
    reply: "queue.Queue[Any] | None" = None


class CommandQueue:
    """A queue of (method_name, args) commands drained by a worker loop."""

    def __init__(self, allowed: frozenset[str] = WORKER_RPC_METHODS, maxsize: int = 0) -> None:
        self._q: queue.Queue[RpcCommand] = queue.Queue(maxsize)
        self._allowed = allowed
        self._closed = threading.Event()

    def put(self, method: str, *args: Any, reply: "queue.Queue[Any] | None" = None, **kwargs: Any) -> None:
        assert isinstance(method, str) and method in self._allowed, method  # expect: FC109
        if self._closed.is_set():
            raise RpcError(f"command queue closed; dropped {method!r}")
        self._q.put(RpcCommand(method, args, kwargs, reply))

    def get(self, timeout: float | None = None) -> RpcCommand:
        return self._q.get(timeout=timeout)

    def drain(self) -> list[RpcCommand]:
        out: list[RpcCommand] = []
        while True:
            try:
                out.append(self._q.get_nowait())
            except queue.Empty:
                return out

    def close(self) -> None:
        self._closed.set()
        for cmd in self.drain():
            if cmd.reply is not None:
                cmd.reply.put(RpcError(f"{cmd.method!r} cancelled: queue closed"))
