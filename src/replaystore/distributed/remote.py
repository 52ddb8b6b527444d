"""One buffer in a Ray actor, and a client whose methods are the buffer's.

:class:`RemoteBuffer` hosts any of the library's buffers
(``transitions.ReplayBuffer``, ``experience.ReplayBuffer``, a trajectories
storage or buffer: anything constructed from a class and arguments) in one Ray
actor. The client has the buffer class's public methods and properties, with
the same names, signatures, docstrings and return values; an exception raised
by the buffer is raised again on the caller's side with its own type and
message (Ray's ``RayTaskError`` wrapper is removed).

A buffer built with a ``rate_limiter`` blocks inside the actor (a sample waits
for inserts, an insert for samples). Such an actor gets two more concurrency
groups of one thread each, ``inserts`` (``add``, ``add_batch``) and ``samples``
(``sample_batch``, ``sample_random``, ``get_next_batch``): a call waiting on the
limiter holds only its own group, so the calls that unblock it still run, and
each group keeps its calls in the order they were sent. Every other call runs
in the default group. The buffer's own lock keeps the groups' threads safe.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import time
from collections.abc import Callable, Iterator
from typing import Any

import torch

from replaystore.distributed._ray import (
    RemoteActorError,
    get,
    import_ray,
    logger,
    require_initialized,
)
from replaystore.errors import ArgumentError

__all__ = ["RemoteActorError", "RemoteBuffer"]

# Calls that may wait on a rate limiter, by the concurrency group they run in.
_LIMITED_GROUPS = {
    "add": "inserts",
    "add_batch": "inserts",
    "sample_batch": "samples",
    "sample_random": "samples",
    "get_next_batch": "samples",
}


class BufferHost:
    """What runs inside the actor: the buffer and a generic dispatcher (not public)."""

    def __init__(self, class_path: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        module, _, name = class_path.rpartition(".")
        self.class_path = class_path
        self.error: Exception | None = None
        try:
            cls = getattr(importlib.import_module(module), name)
            self.buffer = cls(*args, **kwargs)
        except Exception as exc:
            # Raised from a method call, not from __init__: Ray would report an
            # __init__ error as a dead actor, losing the exception's type.
            self.error = exc

    def describe(self) -> str:
        if self.error is not None:
            raise self.error
        return self.class_path

    def call(self, name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        result = getattr(self.buffer, name)(*args, **kwargs)
        if isinstance(result, Iterator) or inspect.isgenerator(result):
            raise ArgumentError(
                f"{name}() returns an iterator, which cannot cross the actor boundary; "
                "draw batches with get_next_batch() or sample_batch() instead"
            )
        return _pack(result)

    def limited(self) -> bool:
        """Whether the buffer has a rate limiter (its actor then has the wait groups)."""
        return getattr(self.buffer, "rate_limiter", None) is not None

    def get_attr(self, name: str) -> Any:
        return getattr(self.buffer, name)

    def set_attr(self, name: str, value: Any) -> None:
        setattr(self.buffer, name, value)


class _PackedTensorDict:
    """A flat CPU TensorDict as NumPy arrays: Ray ships those zero-copy, without pickle."""

    __slots__ = ("arrays", "batch_size", "device")

    def __init__(self, arrays: dict[str, Any], batch_size: list[int], device: str | None) -> None:
        self.arrays = arrays
        self.batch_size = batch_size
        self.device = device


def _pack(result: Any) -> Any:
    from tensordict import TensorDictBase

    if not isinstance(result, TensorDictBase) or result.device not in (None, torch.device("cpu")):
        return result
    arrays = {}
    for key, value in result.items():
        if not isinstance(key, str) or not isinstance(value, torch.Tensor):
            return result  # nested or non-tensor entries: ship the TensorDict as is
        arrays[key] = value.numpy()
    device = None if result.device is None else str(result.device)
    return _PackedTensorDict(arrays, list(result.batch_size), device)


def _unpack(result: Any) -> Any:
    if not isinstance(result, _PackedTensorDict):
        return result
    from tensordict import TensorDict

    # Arrays read from Ray's object store are read-only views: one copy makes the
    # batch writable, as a local sample is.
    tensors = {
        k: torch.from_numpy(v if v.flags.writeable else v.copy()) for k, v in result.arrays.items()
    }
    return TensorDict(tensors, batch_size=result.batch_size, device=result.device)


def _public_api(cls: type) -> tuple[dict[str, Callable[..., Any]], dict[str, property]]:
    methods: dict[str, Callable[..., Any]] = {}
    props: dict[str, property] = {}
    for name, value in inspect.getmembers(cls):
        if name.startswith("_") and name not in ("__len__", "__contains__"):
            continue
        static = inspect.getattr_static(cls, name)
        if isinstance(static, property):
            props[name] = static
        elif callable(value) and not isinstance(static, staticmethod | classmethod):
            methods[name] = value
    return methods, props


@functools.cache
def _client_class(class_path: str) -> type[RemoteBuffer]:
    """A RemoteBuffer subclass with the methods and properties of the buffer class."""
    module, _, name = class_path.rpartition(".")
    cls = getattr(importlib.import_module(module), name)
    methods, props = _public_api(cls)
    namespace: dict[str, Any] = {"__doc__": f"Remote client of {class_path} (see RemoteBuffer)."}

    def make_method(mname: str, original: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(original)
        def method(self: RemoteBuffer, *args: Any, **kwargs: Any) -> Any:
            return self._call(mname, args, kwargs)

        return method

    def make_property(pname: str, original: property) -> property:
        def fget(self: RemoteBuffer) -> Any:
            return get(self._actor.get_attr.remote(pname), self._what)

        fset = None
        if original.fset is not None:

            def fset(self: RemoteBuffer, value: Any) -> None:
                get(self._actor.set_attr.remote(pname, value), self._what)

        return property(fget, fset, doc=original.__doc__)

    for mname, fn in methods.items():
        if mname in RemoteBuffer.__dict__:
            continue  # the client's own methods (terminate, actor, ...) win
        namespace[mname] = make_method(mname, fn)
    for pname, prop in props.items():
        namespace[pname] = make_property(pname, prop)
    return type(f"Remote{name}", (RemoteBuffer,), namespace)


class RemoteBuffer:
    """A client of a buffer hosted in a Ray actor; create with :meth:`create`.

    The returned object's class is a subclass generated for the buffer class:
    every public method of the buffer is a method of the client with the same
    signature and docstring (``client.add_batch(batch)``,
    ``client.sample_batch(256)``), every property a property (``client.size``,
    settable ones such as ``client.beta = 0.5`` too). Each call is one actor
    call, run in order with the other calls of this actor. Arguments and
    results travel through Ray's object store: NumPy arrays and tensors are
    serialised once and read without another copy on the same machine.

    Methods that return an iterator (``create_epoch_iterator``) cannot cross
    the boundary; they raise ``ArgumentError`` (use ``get_next_batch``).

    Errors: an exception raised by the buffer is raised here with its type and
    message (``EmptyBufferError``, ``SchemaError``, ...); a dead actor raises
    :class:`RemoteActorError` naming it.

    The client can be pickled (sent to other actors): it holds only the
    actor handle.
    """

    _actor: Any
    _class_path: str
    _what: str
    _limited: bool

    def __init__(self, actor: Any, class_path: str, what: str, limited: bool = False) -> None:
        object.__setattr__(self, "_actor", actor)
        object.__setattr__(self, "_class_path", class_path)
        object.__setattr__(self, "_what", what)
        object.__setattr__(self, "_limited", limited)

    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuild, (self._actor, self._class_path, self._what, self._limited))

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self._what}>"

    # ------------------------------------------------------------- creation

    @staticmethod
    def create(
        buffer_class: type | str,
        *args: Any,
        name: str | None = None,
        namespace: str | None = None,
        detached: bool = False,
        max_restarts: int = 0,
        num_cpus: float = 0,
        **kwargs: Any,
    ) -> RemoteBuffer:
        """Start an actor that builds ``buffer_class(*args, **kwargs)``; return its client.

        Args:
            buffer_class: the buffer class or its dotted path
                (``"replaystore.transitions.ReplayBuffer"``). It must be importable
                in the actor's process (same installation on every node).
            args, kwargs: the buffer's constructor arguments, exactly as locally.
            name: a Ray actor name, so other jobs find it with :meth:`connect`.
            namespace: the Ray namespace of the name (default: the job's).
            detached: keep the actor after this driver exits (needs ``name``);
                end it with :meth:`terminate`.
            max_restarts: how often Ray restarts a dead actor (its buffer is
                rebuilt empty from the same arguments, or reopened when the
                arguments name a ``path`` that holds it).
            num_cpus: CPUs the actor reserves (0: it never blocks scheduling).

        Raises:
            ArgumentError: ``detached`` without ``name``, or a ``buffer_class``
                that is not a class or a dotted path.
            RuntimeError: Ray is not initialized.
            ImportError: Ray is not installed (``pip install "replaystore[ray]"``).
            Whatever the buffer's constructor raises, with its type and message.
        """
        ray = import_ray()
        require_initialized(ray)
        if isinstance(buffer_class, type):
            class_path = f"{buffer_class.__module__}.{buffer_class.__qualname__}"
        elif isinstance(buffer_class, str) and "." in buffer_class:
            class_path = buffer_class
        else:
            raise ArgumentError(
                f"buffer_class must be a class or a dotted path, got {buffer_class!r}"
            )
        if detached and not name:
            raise ArgumentError("detached=True needs name= (a detached actor is found by name)")
        options: dict[str, Any] = {"num_cpus": num_cpus, "max_restarts": int(max_restarts)}
        if name:
            options["name"] = name
            if namespace:
                options["namespace"] = namespace
        if detached:
            options["lifetime"] = "detached"
        limited = kwargs.get("rate_limiter") is not None
        if limited:
            # Waits on the limiter hold their own group (see the module docstring).
            host = ray.remote(concurrency_groups={"inserts": 1, "samples": 1})(BufferHost)
        else:
            host = ray.remote(BufferHost)
        actor = host.options(**options).remote(class_path, args, kwargs)
        what = f"remote buffer {name!r}" if name else "remote buffer"
        # Construction errors (bad arguments) surface here, with their own type.
        try:
            get(actor.describe.remote(), what)
        except BaseException:
            ray.kill(actor, no_restart=True)
            raise
        logger.info("started %s hosting %s", what, class_path)
        return _client_class(class_path)(actor, class_path, what, limited)

    @staticmethod
    def connect(name: str, namespace: str | None = None) -> RemoteBuffer:
        """The client of the named actor started by :meth:`create` (maybe by another job).

        Raises:
            ValueError: no actor has that name (Ray's error).
            RuntimeError: Ray is not initialized.
        """
        ray = import_ray()
        require_initialized(ray)
        actor = ray.get_actor(name, namespace=namespace)
        what = f"remote buffer {name!r}"
        class_path = get(actor.describe.remote(), what)
        limited = get(actor.limited.remote(), what)
        return _client_class(class_path)(actor, class_path, what, limited)

    # ----------------------------------------------------------- the client

    @property
    def actor(self) -> Any:
        """The Ray actor handle (for ``ray.kill``, or passing to other actors)."""
        return self._actor

    def _method(self, name: str) -> Any:
        """The actor's ``call`` method, in the concurrency group ``name`` runs in."""
        group = _LIMITED_GROUPS.get(name) if self._limited else None
        if group is None:
            return self._actor.call
        return self._actor.call.options(concurrency_group=group)

    def _call(self, name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        return _unpack(get(self._method(name).remote(name, args, kwargs), self._what))

    def submit_add_batch(self, batch: Any) -> tuple[Any, str]:
        """Start ``add_batch(batch)`` in the actor without waiting: ``(ObjectRef, label)``,
        the label naming the actor in errors (what :class:`BatchingWriter` sends)."""
        return self._method("add_batch").remote("add_batch", (batch,), {}), self._what

    def terminate(self) -> None:
        """Kill the actor (its buffer is lost unless saved); detached ones too.

        Returns once the actor is gone (``ray.kill`` alone is asynchronous, so a
        call right after it could still reach the actor), or after 30 s.
        """
        ray = import_ray()
        ray.kill(self._actor, no_restart=True)
        deadline = time.monotonic() + 30.0
        while time.monotonic() < deadline:
            try:
                ray.get(self._actor.__ray_ready__.remote(), timeout=5.0)
            except (ray.exceptions.RayActorError, ray.exceptions.ActorUnavailableError):
                return
            except ray.exceptions.GetTimeoutError:
                continue
            time.sleep(0.01)

    def __setattr__(self, name: str, value: Any) -> None:
        if isinstance(getattr(type(self), name, None), property):
            object.__setattr__(self, name, value)
            return
        raise AttributeError(f"{type(self).__name__} has no settable attribute {name!r}")


def _rebuild(actor: Any, class_path: str, what: str, limited: bool = False) -> RemoteBuffer:
    return _client_class(class_path)(actor, class_path, what, limited)
