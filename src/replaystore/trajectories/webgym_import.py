"""Safe import of WebGym's ``.pt`` iteration files (``train_trajectories.pt.iterationN``).

WebGym saves each rollout iteration with ``torch.save`` and reads it back with
``torch.load(weights_only=False)``: a full pickle, which runs whatever code the
file names. A trajectory file copied from another machine is then as dangerous
as a script. This module reads the same files without executing anything the
file asks for:

* the pickle is read straight out of the torch zip (``<archive>/data.pkl``) with
  :class:`SafeUnpickler`, whose ``find_class`` allows only a fixed table of
  globals: the five WebGym component classes (``webgym.data.components.Task``,
  ``Observation``, ``Action``, ``Response``, ``Reward``), plain containers
  (``set``, ``frozenset``, ``bytearray``, ``complex``, ``OrderedDict``),
  ``_codecs.encode`` (how protocol 2 stores ``bytes``), ``datetime`` values,
  numeric NumPy scalars, and the tensor rebuild helper ``_rebuild_tensor_v2``
  with the typed storage classes. Every allowed global is replaced by a small
  function of ours; nothing from the file's modules is imported or called.
  Anything else raises :class:`~replaystore.errors.UnsafeFileError` naming the
  global, before it is resolved;
* WebGym component objects are rebuilt as inert records (whether pickled by
  default, via ``__reduce__`` with constructor arguments, or with a
  ``__setstate__`` dict / field list) and then mapped onto
  :mod:`replaystore.trajectories.components` by field name. A field our
  component does not know raises :class:`~replaystore.errors.SchemaError`
  naming class, field and file (WebGym's deprecated ``Observation.submit``
  argument, which WebGym itself discards, is the one field dropped);
* tensors become nested Python lists and NumPy scalars Python numbers, because
  replaystore's iteration files are JSON.

The modules and classes named in the file never need to be importable: a
WebGym file loads on a machine without WebGym.

Resource limits (:class:`ImportLimits`): a hostile file of a few KB can ask
for gigabytes (a tensor whose storage is a highly compressed zip member, a
stride-0 view of 10^8 elements over one stored number, ``bytearray(10**12)``).
Every size is checked *before* anything is allocated: the uncompressed bytes of
the pickle and the tensor storages read from the zip (against ``max_bytes``
and against ``max_expansion`` times the file's size on disk), the elements of
each tensor view (``max_elements``, counted over the whole file, since each
element becomes a Python number) and ``bytearray`` sizes (``max_bytes``). A
file over a limit raises :class:`~replaystore.errors.UnsafeFileError` naming
the limit and how to raise it; nothing large has been allocated by then.
"""

from __future__ import annotations

import codecs
import collections
import datetime
import io
import logging
import math
import os
import pickle
import re
import zipfile
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from replaystore.errors import (
    ArgumentError,
    SchemaError,
    StorageError,
    TrajectoryError,
    UnsafeFileError,
)
from replaystore.trajectories import components

if TYPE_CHECKING:
    from replaystore.trajectories.storage import TrajectoryStorage

__all__ = [
    "DEFAULT_LIMITS",
    "WEBGYM_COMPONENT_MODULE",
    "ImportLimits",
    "ImportedFile",
    "SafeUnpickler",
    "import_webgym",
    "load_webgym_file",
    "load_webgym_file_with_metadata",
    "load_webgym_payload",
    "webgym_file_iteration",
]

logger = logging.getLogger("replaystore.trajectories.webgym_import")

#: The module WebGym's component classes live in (as recorded in its pickles).
WEBGYM_COMPONENT_MODULE = "webgym.data.components"


@dataclass(frozen=True, slots=True)
class ImportLimits:
    """What one WebGym ``.pt`` file may make the importer allocate (checked before allocating).

    Attributes:
        max_bytes: uncompressed bytes read out of the zip (``data.pkl`` plus every
            tensor storage, each counted once) plus the bytes of every
            ``bytearray(n)`` the pickle asks for. Default 1 GiB.
        max_elements: tensor elements materialised as Python numbers, summed over
            every tensor view in the file (a stride-0 view of 10^8 elements over
            one stored value counts 10^8). Each costs ~32 bytes of Python
            objects. Default 2**24 (16.7 million, ~0.5 GB).
        max_expansion: uncompressed bytes read out of the zip may be at most this
            many times the file's size on disk, plus 1 MiB (torch stores its zip
            members uncompressed, so real files are ~1x; a zip bomb is not).
            Default 16.

    Raises:
        ValueError: a limit that is not a positive number.
    """

    max_bytes: int = 1 << 30
    max_elements: int = 1 << 24
    max_expansion: float = 16.0

    def __post_init__(self) -> None:
        for name in ("max_bytes", "max_elements"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ArgumentError(f"ImportLimits.{name} must be an integer >= 1, got {value!r}")
        value = self.max_expansion
        if isinstance(value, bool) or not isinstance(value, int | float) or not value >= 1:
            raise ArgumentError(f"ImportLimits.max_expansion must be a number >= 1, got {value!r}")


#: The limits used when none are given.
DEFAULT_LIMITS = ImportLimits()
_EXPANSION_SLACK = 1 << 20


class _Budget:
    """Running totals of one file's allocations against its :class:`ImportLimits`."""

    def __init__(self, limits: ImportLimits, source: str, file_size: int) -> None:
        self.limits = limits
        self.source = source
        self.read_cap = min(
            limits.max_bytes, int(limits.max_expansion * file_size) + _EXPANSION_SLACK
        )
        self.bytes = 0
        self.elements = 0

    def _refuse(self, what: str, limit: str, value: int) -> UnsafeFileError:
        return UnsafeFileError(
            f"{self.source}: {what}, over the importer's {limit}={value:,} "
            f"(pass limits=ImportLimits({limit}=...) to import_webgym / load_webgym_file "
            "if the file is trusted and really that large)"
        )

    def take_bytes(self, n: int, what: str) -> None:
        """Count ``n`` more bytes (refused before anything is allocated)."""
        self.bytes += n
        if self.bytes > self.limits.max_bytes:
            raise self._refuse(
                f"{what} brings the file's allocations to {self.bytes:,} bytes",
                "max_bytes",
                self.limits.max_bytes,
            )

    def take_read(self, n: int, what: str) -> None:
        """Count ``n`` uncompressed bytes read from the zip (bytes and expansion limits)."""
        if self.bytes + n > self.read_cap and self.read_cap < self.limits.max_bytes:
            raise self._refuse(
                f"{what} would bring the bytes unpacked from the zip to {self.bytes + n:,}, "
                f"more than max_expansion x its {self.read_cap - _EXPANSION_SLACK:,}-byte "
                "share of the file size + 1 MiB",
                "max_expansion",
                int(self.limits.max_expansion),
            )
        self.take_bytes(n, what)

    def take_elements(self, n: int, what: str) -> None:
        """Count ``n`` more tensor elements to materialise."""
        self.elements += n
        if self.elements > self.limits.max_elements:
            raise self._refuse(
                f"{what} brings the tensor elements to materialise to {self.elements:,}",
                "max_elements",
                self.limits.max_elements,
            )


# Constructor parameters of WebGym's component classes, in order: positional
# arguments of a ``__reduce__`` are mapped onto these names.
_WEBGYM_PARAMS: dict[str, tuple[str, ...]] = {
    "Task": (
        "task_name",
        "domain",
        "subdomain",
        "website",
        "difficulty",
        "evaluator_reference",
        "reference_answer",
        "attempt_level",
        "task_id",
        "max_steps",
        "trajectory_index",
    ),
    "Observation": ("task", "image_path", "ac_tree", "submit", "page_metadata"),
    "Action": ("action", "action_string"),
    "Response": ("raw_response", "answering_tokens", "raw_prompt"),
    "Reward": ("reward", "evaluation", "is_blocked", "submit", "submission_judgment"),
}
_OURS: dict[str, type[Any]] = {
    "Task": components.Task,
    "Observation": components.Observation,
    "Action": components.Action,
    "Response": components.Response,
    "Reward": components.Reward,
}
# Fields WebGym accepts but does not keep; dropped on import.
_DISCARDED = {("Observation", "submit")}


class _Record:
    """An inert stand-in for a WebGym component: collects args, kwargs and state only."""

    kind: str = ""
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    state: Any

    def __new__(cls, *args: Any, **kwargs: Any) -> _Record:
        record = object.__new__(cls)
        record.args = args
        record.kwargs = dict(kwargs)
        record.state = None
        return record

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        # REDUCE calls cls(*args): __new__ already kept them; nothing else to do.
        pass

    def __setstate__(self, state: Any) -> None:
        self.state = state


_RECORD_TYPES: dict[str, type[_Record]] = {
    name: type(f"WebGym{name}Record", (_Record,), {"kind": name}) for name in _WEBGYM_PARAMS
}


def _reconstructor(cls: Any, base: Any, state: Any) -> _Record:
    """``copyreg._reconstructor`` (protocols 0/1), limited to our record types."""
    if not (isinstance(cls, type) and issubclass(cls, _Record)) or base is not object:
        raise UnsafeFileError(f"copyreg._reconstructor used on {cls!r}/{base!r}")
    if state is not None:
        raise UnsafeFileError(f"copyreg._reconstructor with base state for {cls.__name__}")
    return cls.__new__(cls)


def _codecs_encode(text: Any, encoding: str = "utf-8") -> bytes:
    """``_codecs.encode`` as protocol 2 uses it for ``bytes``: str -> latin-1 bytes."""
    try:
        codec = codecs.lookup(encoding).name
    except (LookupError, TypeError):
        codec = None
    if not isinstance(text, str) or codec not in ("iso8859-1", "utf-8"):
        raise UnsafeFileError(f"_codecs.encode called with {type(text).__name__}/{encoding!r}")
    return text.encode(codec)


class _Dtype:
    """Stand-in for ``numpy.dtype(...)`` in a pickle: numeric kinds only."""

    def __init__(self, code: Any, align: Any = False, copy: Any = True) -> None:
        if not isinstance(code, str):
            raise UnsafeFileError(f"numpy.dtype pickled with {type(code).__name__}")
        dtype = np.dtype(code)
        if dtype.kind not in "biufc":
            raise UnsafeFileError(f"numpy dtype {code!r} is not numeric")
        self.dtype = dtype

    def __setstate__(self, state: Any) -> None:
        if isinstance(state, tuple) and len(state) > 1 and state[1] in "<>=|":
            self.dtype = self.dtype.newbyteorder(state[1])


def _numpy_scalar(dtype: Any, data: Any = None) -> int | float | complex | bool:
    if not isinstance(dtype, _Dtype) or not isinstance(data, bytes):
        raise UnsafeFileError("numpy scalar pickled without a numeric dtype and bytes")
    return np.frombuffer(data, dtype=dtype.dtype, count=1)[0].item()


@dataclass(frozen=True, slots=True)
class _StorageRef:
    dtype: torch.dtype
    data: bytes
    budget: _Budget | None = None


_STORAGE_DTYPES: dict[str, torch.dtype] = {
    "FloatStorage": torch.float32,
    "DoubleStorage": torch.float64,
    "HalfStorage": torch.float16,
    "BFloat16Storage": torch.bfloat16,
    "LongStorage": torch.int64,
    "IntStorage": torch.int32,
    "ShortStorage": torch.int16,
    "CharStorage": torch.int8,
    "ByteStorage": torch.uint8,
    "BoolStorage": torch.bool,
}


def _rebuild_tensor(
    storage: Any,
    offset: Any,
    size: Any,
    stride: Any,
    requires_grad: Any = False,
    hooks: Any = None,
    metadata: Any = None,
) -> list[Any] | int | float | bool:
    """``torch._utils._rebuild_tensor_v2``, returning the tensor's values as nested lists."""
    if not isinstance(storage, _StorageRef):
        raise UnsafeFileError("tensor rebuilt from something other than a stored buffer")
    if not (isinstance(offset, int) and isinstance(size, tuple) and isinstance(stride, tuple)):
        raise UnsafeFileError("tensor rebuilt with a malformed offset/size/stride")
    if not all(isinstance(n, int) and not isinstance(n, bool) for n in (*size, *stride)):
        raise UnsafeFileError("tensor rebuilt with a non-integer size or stride")
    if len(size) != len(stride) or len(size) > 64 or any(n < 0 for n in size):
        raise UnsafeFileError(f"tensor rebuilt with size {size!r:.80} and stride {stride!r:.80}")
    numel = math.prod(size)  # exact (Python ints): counted before anything is built
    if storage.budget is not None:
        storage.budget.take_elements(numel, f"a tensor of shape {tuple(size)!r:.80}")
    if storage.data:
        flat = torch.frombuffer(bytearray(storage.data), dtype=storage.dtype)
    else:
        flat = torch.empty(0, dtype=storage.dtype)
    try:
        tensor = flat.as_strided(size, stride, offset)
    except RuntimeError as exc:
        raise UnsafeFileError(f"tensor view out of its storage: {exc}") from None
    return tensor.tolist()


# (module, name) -> what the unpickler gets instead of the real global.
_ALLOWED: dict[tuple[str, str], Any] = {
    **{(WEBGYM_COMPONENT_MODULE, name): cls for name, cls in _RECORD_TYPES.items()},
    ("builtins", "object"): object,  # only as copyreg._reconstructor's base
    ("builtins", "set"): set,
    ("builtins", "frozenset"): frozenset,
    ("builtins", "bytearray"): "bytearray",  # replaced per unpickler (size-checked)
    ("builtins", "complex"): complex,
    ("collections", "OrderedDict"): collections.OrderedDict,
    ("copyreg", "_reconstructor"): _reconstructor,
    ("_codecs", "encode"): _codecs_encode,
    ("datetime", "datetime"): datetime.datetime,
    ("datetime", "date"): datetime.date,
    ("datetime", "time"): datetime.time,
    ("datetime", "timedelta"): datetime.timedelta,
    ("datetime", "timezone"): datetime.timezone,
    ("numpy", "dtype"): _Dtype,
    ("numpy.core.multiarray", "scalar"): _numpy_scalar,
    ("numpy._core.multiarray", "scalar"): _numpy_scalar,
    ("torch._utils", "_rebuild_tensor_v2"): _rebuild_tensor,
    **{("torch", name): name for name in _STORAGE_DTYPES},
}
# Python 2 names that protocol-2 pickles use for builtins.
_MODULE_ALIASES = {"__builtin__": "builtins", "copy_reg": "copyreg"}


class SafeUnpickler(pickle.Unpickler):
    """An unpickler that resolves only the globals in a fixed allow-list (see module doc).

    Args:
        file: binary file holding the pickle.
        source: name used in error messages (the ``.pt`` file).
        storages: ``key -> (bytes)`` loader for torch storage records, or
            ``None`` when the pickle may not reference tensor storage. Each key
            is loaded once, however many tensors share it.
        limits: what the pickle may allocate (default :data:`DEFAULT_LIMITS`):
            ``bytearray(n)`` sizes and tensor element counts are checked here.
        file_size: the source file's size on disk, for ``max_expansion``
            (default: no expansion limit beyond ``max_bytes``).

    Raises (from :meth:`load`):
        UnsafeFileError: the pickle names a global outside the allow-list, or
            uses an allowed one in a way it was not allowed for, or asks for
            more than ``limits`` allow.
    """

    def __init__(
        self,
        file: io.BufferedIOBase | io.BytesIO,
        *,
        source: str = "<pickle>",
        storages: Callable[[str], bytes] | None = None,
        limits: ImportLimits | None = None,
        file_size: int | None = None,
    ) -> None:
        super().__init__(file)
        self.source = source
        self._storages = storages
        self._loaded: dict[str, bytes] = {}
        if file_size is None:
            file_size = limits.max_bytes if limits is not None else DEFAULT_LIMITS.max_bytes
        self.budget = _Budget(limits or DEFAULT_LIMITS, source, file_size)

    def find_class(self, module: str, name: str) -> Any:
        key = (_MODULE_ALIASES.get(module, module), name)
        if key not in _ALLOWED:
            raise UnsafeFileError(
                f"{self.source} references the global {module}.{name}, which replaystore "
                "does not load (only WebGym components, plain containers and tensors are allowed)"
            )
        if key == ("builtins", "bytearray"):
            return self._bytearray
        return _ALLOWED[key]

    def _bytearray(self, *args: Any) -> bytearray:
        """``bytearray(...)`` with the size of ``bytearray(n)`` checked against ``max_bytes``."""
        if len(args) > 2:
            raise UnsafeFileError(f"{self.source}: bytearray called with {len(args)} arguments")
        if args and isinstance(args[0], int) and not isinstance(args[0], bool):
            if args[0] < 0:
                raise UnsafeFileError(f"{self.source}: bytearray of negative size {args[0]}")
            self.budget.take_bytes(args[0], f"bytearray({args[0]:,})")
        elif args and not isinstance(args[0], str | bytes | bytearray | list | tuple):
            # An iterator could be endless; what a pickle can hold is one of these.
            raise UnsafeFileError(f"{self.source}: bytearray built from a {type(args[0]).__name__}")
        try:
            return bytearray(*args)
        except (TypeError, ValueError, LookupError) as exc:
            raise UnsafeFileError(f"{self.source}: bad bytearray arguments ({exc})") from None

    def persistent_load(self, pid: Any) -> Any:
        if (
            not isinstance(pid, tuple)
            or len(pid) != 5
            or pid[0] != "storage"
            or pid[1] not in _STORAGE_DTYPES
            or not isinstance(pid[2], str)
        ):
            raise UnsafeFileError(f"{self.source} has an unsupported persistent id {pid!r:.80}")
        if self._storages is None:
            raise UnsafeFileError(f"{self.source} references tensor storage outside a torch zip")
        data = self._loaded.get(pid[2])
        if data is None:
            data = self._loaded[pid[2]] = self._storages(pid[2])
        return _StorageRef(_STORAGE_DTYPES[pid[1]], data, self.budget)


def load_webgym_payload(path: str | os.PathLike[str], *, limits: ImportLimits | None = None) -> Any:
    """The object a WebGym ``.pt`` file holds, with WebGym components mapped to ours.

    Usually ``{"trajectories": [...], "metadata": {...}}`` (or, for older files,
    the list of trajectories itself).

    Args:
        path: the ``.pt`` file.
        limits: what the file may allocate (default :data:`DEFAULT_LIMITS`).

    Raises:
        StorageError: the file is missing, not a torch zip archive, or big-endian.
        UnsafeFileError: the pickle references a global that is not allowed, or
            the file asks for more than ``limits`` allow (the limit is named).
        SchemaError: a WebGym component has a field replaystore's component lacks.
    """
    file = Path(path)
    try:
        file_size = file.stat().st_size
        archive = zipfile.ZipFile(file)
    except FileNotFoundError:
        raise StorageError(f"WebGym file not found: {file}") from None
    except zipfile.BadZipFile:
        raise StorageError(
            f"{file} is not a torch zip archive (saved with torch.save, torch >= 1.6)"
        ) from None
    with archive:
        pickles = [n for n in archive.namelist() if n.endswith("/data.pkl") and n.count("/") == 1]
        if len(pickles) != 1:
            raise StorageError(f"{file}: expected one <archive>/data.pkl, found {pickles}")
        prefix = pickles[0][: -len("data.pkl")]
        names = set(archive.namelist())
        if f"{prefix}byteorder" in names:
            order = archive.read(f"{prefix}byteorder").decode("ascii", "replace").strip()
            if order != "little":
                raise StorageError(f"{file}: byte order {order!r} is not supported")

        def read(member: str, budget: _Budget) -> bytes:
            # The directory's size is checked first; the read itself is bounded
            # too, since a crafted zip may understate it.
            declared = archive.getinfo(member).file_size
            budget.take_read(declared, f"zip member {member} ({declared:,} bytes unpacked)")
            with archive.open(member) as handle:
                data = handle.read(declared + 1)
            if len(data) != declared:
                raise StorageError(f"{file}: zip member {member} is not the size its entry says")
            return data

        budget = _Budget(limits or DEFAULT_LIMITS, str(file), file_size)

        def storage(key: str) -> bytes:
            member = f"{prefix}data/{key}"
            if member not in names:
                raise StorageError(f"{file}: tensor storage {member} is missing")
            return read(member, budget)

        unpickler = SafeUnpickler(
            io.BytesIO(read(pickles[0], budget)), source=str(file), storages=storage
        )
        unpickler.budget = budget  # the pickle's own bytes are already counted
        try:
            raw = unpickler.load()
        except (UnsafeFileError, StorageError):
            raise
        except Exception as exc:
            raise StorageError(f"{file}: corrupt pickle: {type(exc).__name__}: {exc}") from exc
    try:
        return _to_components(raw, str(file))
    except (RecursionError, TypeError) as exc:
        # Cyclic or absurdly deep data, or a component used as a dict key / set member.
        raise StorageError(f"{file}: malformed data: {type(exc).__name__}: {exc}") from None


def _record_fields(record: _Record, source: str) -> dict[str, Any]:
    """The field dict of a WebGym record: constructor args, then kwargs, then pickled state."""
    kind = record.kind
    params = _WEBGYM_PARAMS[kind]
    where = f"{source}: {WEBGYM_COMPONENT_MODULE}.{kind}"
    if len(record.args) > len(params):
        raise SchemaError(
            f"{where} was built with {len(record.args)} arguments, at most {len(params)}"
        )
    fields = dict(zip(params, record.args, strict=False))
    fields.update(record.kwargs)
    state = record.state
    if isinstance(state, tuple) and len(state) == 2 and isinstance(state[1], dict | type(None)):
        dict_state, slot_state = state
        state = {**(dict_state or {}), **(slot_state or {})}
    if isinstance(state, dict):
        fields.update(state)
    elif isinstance(state, list | tuple):
        # A dataclass with slots pickles its fields as a list, in field order.
        names = [f for f in params if (kind, f) not in _DISCARDED]
        if len(state) > len(names):
            raise SchemaError(f"{where} has {len(state)} state values, at most {len(names)}")
        fields.update(zip(names, state, strict=False))
    elif state is not None:
        raise SchemaError(f"{where} has state of type {type(state).__name__}")
    if not all(isinstance(name, str) for name in fields):
        raise SchemaError(f"{where} has a non-string field name")
    for field in list(fields):
        if (kind, field) in _DISCARDED:
            del fields[field]
    ours = _OURS[kind]
    known = set(ours.__dataclass_fields__)
    unknown = sorted(set(fields) - known)
    if unknown:
        raise SchemaError(f"{where} has field {unknown[0]!r}, which {ours.__name__} does not know")
    return fields


def _to_components(obj: Any, source: str) -> Any:
    """Replace WebGym records by our components, recursively (containers rebuilt)."""
    memo: dict[int, Any] = {}

    def convert(value: Any) -> Any:
        if isinstance(value, str | int | float | bool | bytes | type(None)):
            return value
        key = id(value)
        if key in memo:
            return memo[key]
        if isinstance(value, _Record):
            fields = {k: convert(v) for k, v in _record_fields(value, source).items()}
            try:
                result: Any = _OURS[value.kind].from_dict(fields)
            except SchemaError as exc:
                raise SchemaError(f"{source}: {exc}") from None
        elif isinstance(value, dict):
            result = type(value)((convert(k), convert(v)) for k, v in value.items())
        elif isinstance(value, list):
            result = [convert(v) for v in value]
        elif isinstance(value, tuple):
            result = tuple(convert(v) for v in value)
        elif isinstance(value, set | frozenset):
            result = type(value)(convert(v) for v in value)
        else:
            result = value
        memo[key] = result
        return result

    return convert(obj)


def load_webgym_file(
    path: str | os.PathLike[str], *, limits: ImportLimits | None = None
) -> list[list[dict[str, Any]]]:
    """The trajectories of a WebGym ``.pt`` file: lists of step mappings with our components.

    Each step is ``{"observation": Observation, "action": Action, "response":
    Response, "reward": Reward}`` plus ``same_as_next_screenshot`` /
    ``trajectory_metadata`` when the file has them. ``None`` trajectories
    (WebGym's placeholders for failed rollouts) hold no data and are skipped
    with a log line; a ``None`` step inside a trajectory is an error.

    Cost: reads and decodes the whole file; memory about that of the loaded steps,
    bounded by ``limits`` (default :data:`DEFAULT_LIMITS`, see :class:`ImportLimits`).

    Raises:
        StorageError: see :func:`load_webgym_payload`; or the payload has no trajectories.
        UnsafeFileError: the pickle references a global that is not allowed, or the
            file asks for more than ``limits`` allow.
        SchemaError / TrajectoryError: a component or step does not fit replaystore's
            schema (file, trajectory and step named).
    """
    return _load(path, limits)[0]


def load_webgym_file_with_metadata(
    path: str | os.PathLike[str], *, limits: ImportLimits | None = None
) -> tuple[list[list[dict[str, Any]]], dict[str, Any]]:
    """:func:`load_webgym_file` plus the file's ``metadata`` dict (``{}`` for the old list format).

    Raises:
        The same as :func:`load_webgym_file`.
    """
    return _load(path, limits)


def _load(
    path: str | os.PathLike[str], limits: ImportLimits | None = None
) -> tuple[list[list[dict[str, Any]]], dict[str, Any]]:
    """Trajectories and the file's ``metadata`` dict (empty for the old list format)."""
    payload = load_webgym_payload(path, limits=limits)
    metadata: dict[str, Any] = {}
    if isinstance(payload, Mapping):
        if "trajectories" not in payload:
            raise StorageError(f"{path}: no 'trajectories' key (keys: {sorted(map(str, payload))})")
        raw = payload["trajectories"]
        if isinstance(payload.get("metadata"), Mapping):
            metadata = dict(payload["metadata"])
    else:
        raw = payload
    if not isinstance(raw, list | tuple):
        raise StorageError(f"{path}: trajectories is a {type(raw).__name__}, not a list")
    trajectories: list[list[dict[str, Any]]] = []
    skipped = 0
    for t, trajectory in enumerate(raw):
        if trajectory is None:
            skipped += 1
            continue
        if not isinstance(trajectory, list | tuple):
            raise TrajectoryError(f"{path}: trajectory {t} is a {type(trajectory).__name__}")
        steps = []
        for s, step in enumerate(trajectory):
            if not isinstance(step, Mapping):
                raise TrajectoryError(
                    f"{path}: trajectory {t}, step {s} is a {type(step).__name__}, not a mapping"
                )
            try:
                steps.append(components.step_from_dict(step))
            except SchemaError as exc:
                raise TrajectoryError(f"{path}: trajectory {t}, step {s}: {exc}") from None
        trajectories.append(steps)
    if skipped:
        logger.info("%s: skipped %d empty (None) trajectories", path, skipped)
    return trajectories, metadata


_ITERATION_NAME = re.compile(r"\.iteration(\d+)(?:_rank_(\d+))?$")


def webgym_file_iteration(path: str | os.PathLike[str]) -> tuple[int, int | None] | None:
    """``(iteration, rank)`` from a WebGym file name, ``None`` if it does not follow the pattern.

    ``train_trajectories.pt.iteration5`` -> ``(5, None)`` (a merged file);
    ``train_trajectories.pt.iteration5_rank_1`` -> ``(5, 1)``.
    """
    match = _ITERATION_NAME.search(Path(path).name)
    if match is None:
        return None
    return int(match.group(1)), None if match.group(2) is None else int(match.group(2))


@dataclass(frozen=True, slots=True)
class ImportedFile:
    """What :func:`import_webgym` did with one source file.

    Attributes:
        source: the WebGym file.
        iteration / rank: where it went in the storage.
        trajectories / steps: how much it held (``None`` trajectories not counted).
        written: the iteration file written.
    """

    source: Path
    iteration: int
    rank: int
    trajectories: int
    steps: int
    written: Path


def import_webgym(
    files: Iterable[str | os.PathLike[str]] | str | os.PathLike[str],
    out_storage_or_dir: TrajectoryStorage | str | os.PathLike[str],
    *,
    progress: Callable[[int, int, ImportedFile], None] | None = None,
    limits: ImportLimits | None = None,
) -> list[ImportedFile]:
    """Import WebGym ``.pt`` iteration files into replaystore's iteration storage.

    ``files`` is one file, a list of files, or a directory (WebGym's
    ``<split>_trajectories/``: every ``*.pt.iteration<N>[_rank_<R>]`` in it; a
    rank file is left out when the merged file of its iteration is there, since
    the merged file already holds its trajectories). Iteration and rank come
    from the file name (merged files: rank 0); other names take the next free
    iteration numbers, in the order given. ``out_storage_or_dir`` is a
    :class:`~replaystore.trajectories.storage.TrajectoryStorage` or its root
    directory. The WebGym file's ``metadata`` is kept in the iteration file's
    header (``webgym_metadata``), with the source path (``imported_from``).
    ``progress(done, total, imported)``, when given, is called after each file
    is written (e.g. to drive a progress bar). ``limits`` bounds what each file
    may allocate (default :data:`DEFAULT_LIMITS`; see :class:`ImportLimits`).

    Before anything is written, all target (iteration, rank) slots are checked
    to be distinct and free. Then each file is read, checked, and written
    atomically in turn; if a later file turns out malformed, the files before it
    stay imported (each complete) and the error names the bad file.

    Returns:
        One :class:`ImportedFile` per file, in (iteration, rank) order.

    Raises:
        UnsafeFileError, StorageError, SchemaError, TrajectoryError: see
            :func:`load_webgym_file`; StorageError also when two files map to the
            same iteration and rank or the storage already has that iteration.
    """
    from replaystore.trajectories.storage import TrajectoryStorage

    storage = (
        out_storage_or_dir
        if isinstance(out_storage_or_dir, TrajectoryStorage)
        else TrajectoryStorage(out_storage_or_dir)
    )
    plan = _import_plan(_expand(files), storage)
    done: list[ImportedFile] = []
    for path, iteration, rank in plan:
        trajectories, metadata = _load(path, limits)
        header = {"imported_from": str(path), "webgym_metadata": _jsonable(metadata)}
        written = storage.save_iteration(iteration, trajectories, rank=rank, metadata=header)
        steps = sum(len(t) for t in trajectories)
        logger.info(
            "imported %s as iteration %d rank %d: %d trajectories, %d steps",
            path,
            iteration,
            rank,
            len(trajectories),
            steps,
        )
        done.append(ImportedFile(path, iteration, rank, len(trajectories), steps, Path(written)))
        if progress is not None:
            progress(len(done), len(plan), done[-1])
    return done


def _import_plan(paths: list[Path], storage: TrajectoryStorage) -> list[tuple[Path, int, int]]:
    """``(file, iteration, rank)`` of every file to import, in (iteration, rank) order:
    from the file's name, else the next free iteration numbers.

    Raises:
        StorageError: two files map to the same slot, or the storage has the iteration.
    """
    named = [webgym_file_iteration(p) for p in paths]
    taken = set(storage.iterations())
    next_iteration = max([n[0] for n in named if n is not None] + list(taken) + [0]) + 1
    plan: list[tuple[Path, int, int]] = []
    seen: dict[tuple[int, int], Path] = {}
    for path, name in zip(paths, named, strict=True):
        if name is None:
            slot = (next_iteration, 0)
            next_iteration += 1
        else:
            slot = (name[0], name[1] or 0)
        if slot in seen:
            raise StorageError(
                f"{path} and {seen[slot]} both map to iteration {slot[0]}, rank {slot[1]}"
            )
        if slot[0] in taken:
            raise StorageError(f"{storage.root} already has iteration {slot[0]} (for {path})")
        seen[slot] = path
        plan.append((path, *slot))
    plan.sort(key=lambda item: (item[1], item[2]))
    return plan


def _jsonable(value: Any) -> Any:
    """Metadata as JSON values: datetimes as ISO text, sets/tuples as lists, bytes as latin-1."""
    if isinstance(value, Mapping):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        items = sorted(value, key=repr) if isinstance(value, set | frozenset) else value
        return [_jsonable(v) for v in items]
    if isinstance(value, datetime.date | datetime.time):
        return value.isoformat()
    if isinstance(value, datetime.timedelta):
        return value.total_seconds()
    if isinstance(value, bytes | bytearray):
        return bytes(value).decode("latin-1")
    if isinstance(value, complex):
        return [value.real, value.imag]
    return value


def _expand(files: Iterable[str | os.PathLike[str]] | str | os.PathLike[str]) -> list[Path]:
    if not isinstance(files, str | os.PathLike):
        return [Path(f) for f in files]
    root = Path(files)
    if not root.is_dir():
        return [root]
    named = {p: webgym_file_iteration(p) for p in sorted(root.iterdir()) if p.is_file()}
    found = {p: n for p, n in named.items() if n is not None}
    if not found:
        raise StorageError(f"no WebGym iteration files (*.pt.iterationN) in {root}")
    merged = {n[0] for n in found.values() if n[1] is None}
    chosen = [p for p, n in found.items() if n[1] is None or n[0] not in merged]
    if len(chosen) < len(found):
        logger.info(
            "%s: %d rank files left out (their iterations have merged files)",
            root,
            len(found) - len(chosen),
        )
    return chosen
