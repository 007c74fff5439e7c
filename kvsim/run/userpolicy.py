"""A user's policy object (``module:Class`` under ``cache.policy.eviction``,
``cache.tiers[i].eviction`` or ``cache.policy.placement``), guarded: an exception that
the user's own code raises while the replay calls it becomes the config's error, naming
the key, the method, the exception's type and message (``guard``), which the commands
report in one ``error:`` line with exit code 2.

How: the object's class is swapped for a subclass of it that only wraps the methods of
the policy interface that the user's code defines (not kvsim's: a method a user's class
inherits from a built-in stays as it is, so an exception there is kvsim's bug and
propagates unchanged). A queue policy's ``tier_queue`` answer (a ``TierQueue``) is
guarded the same way. The core is untouched and a built-in policy is never guarded, so a
run of a built-in pays nothing; a user's policy pays one Python call per method call.
The subclass has the same name and no slots of its own, and adds nothing the core reads
(a marker, ``__kvsim_guard__``, that it is guarded already), so everything the core
reads (``static_keys``, ``floor_key``, ``fast_lru``...) and its identity checks
(``type(policy).on_use is EvictionPolicy.on_use`` for a class that does not define
``on_use``) see the user's class. ``MemoryError`` and the config's own errors
pass through.
"""

from __future__ import annotations

import functools
import inspect
from typing import Any, Callable

from kvsim.config import ConfigFileError
from kvsim.core.policy import EvictionPolicy, PlacementPolicy
from kvsim.core.policy.queues import TierQueue

#: the methods the core may call on a policy or on a queue policy's per-tier state
_INTERFACE = tuple(sorted({
    n for base in (EvictionPolicy, PlacementPolicy, TierQueue)
    for n, v in vars(base).items() if inspect.isfunction(v) and n != "__init__"
} | {"__contains__", "__len__"}))


def _users(fn: Any) -> bool:
    """Whether ``fn`` is a function of the user's code (not kvsim's)."""
    mod = getattr(fn, "__module__", None) or ""
    return inspect.isfunction(fn) and mod != "kvsim" and not mod.startswith("kvsim.")


def _wrap(fn: Callable, what: str, key: str, error: type[ConfigFileError]) -> Callable:
    """``fn``, whose exceptions (bar MemoryError and the config's errors) become ``error``
    naming ``key`` and ``what`` (Class.method); a generator function's, while iterated."""

    def fail(e: Exception) -> ConfigFileError:
        return error(f"{key}: {what} raised {type(e).__name__}: {e}")

    if inspect.isgeneratorfunction(fn):
        @functools.wraps(fn)
        def gen(*args: Any, **kwargs: Any) -> Any:
            try:
                return (yield from fn(*args, **kwargs))
            except (MemoryError, ConfigFileError):
                raise
            except Exception as e:  # noqa: BLE001 - a user's method may fail any way
                raise fail(e) from None
        return gen

    @functools.wraps(fn)
    def method(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except (MemoryError, ConfigFileError):
            raise
        except Exception as e:  # noqa: BLE001 - a user's method may fail any way
            raise fail(e) from None
    return method


def _guarded_class(cls: type, key: str, error: type[ConfigFileError]) -> type | None:
    """A subclass of ``cls`` whose interface methods of the user's code are wrapped, and
    whose ``tier_queue`` guards the queue it returns (None: nothing to guard)."""
    if vars(cls).get("__kvsim_guard__"):
        return None  # guarded already
    ns: dict[str, Any] = {"__kvsim_guard__": True}
    for name in _INTERFACE:
        fn = inspect.getattr_static(cls, name, None)  # (a staticmethod stays as it is)
        if _users(fn):
            ns[name] = _wrap(fn, f"{cls.__name__}.{name}", key, error)
    sub: list[type] = []
    if callable(getattr(cls, "tier_queue", None)):
        own = ns.get("tier_queue")
        queues: dict[type, type | None] = {}  # a queue class -> its guarded subclass

        def tier_queue(self: Any, tier: Any) -> Any:
            q = own(self, tier) if own is not None else super(sub[0], self).tier_queue(tier)
            if q is not None:
                kind = type(q)
                if kind not in queues:
                    queues[kind] = _guarded_class(kind, key, error)
                _swap(q, queues[kind])
            return q
        ns["tier_queue"] = tier_queue
    if len(ns) == 1:
        return None
    ns.update(__slots__=(), __module__=cls.__module__, __qualname__=cls.__qualname__,
              __doc__=cls.__doc__)
    sub.append(type(cls.__name__, (cls,), ns))
    return sub[0]


def _swap(obj: Any, cls: type | None) -> None:
    if cls is not None:
        try:
            obj.__class__ = cls
        except TypeError:  # a layout the subclass cannot take (not a plain class): as is
            pass


def guard(obj: Any, key: str, error: type[ConfigFileError]) -> Any:
    """``obj``, a user's policy (built and checked), guarded in place (see the module
    docstring): an exception its methods raise is ``error`` naming ``key``."""
    _swap(obj, _guarded_class(type(obj), key, error))
    return obj


__all__ = ["guard"]
