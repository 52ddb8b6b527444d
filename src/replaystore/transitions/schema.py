"""The schema of a transition buffer: one fixed-shape, fixed-dtype column per key.

The schema is inferred from the first experience added (``infer_fields``) and
every later experience is checked against it. The hot path (``ReplayBuffer.add``)
checks with the precomputed ``FieldSpec.accepts`` set; the functions here build
those sets and the error messages, which name the key, the shapes and the dtypes.

Conversion rules for values:

* ``torch.Tensor`` and ``numpy.ndarray``/numpy scalars keep their dtype;
* Python ``bool`` -> ``torch.bool``, ``int`` -> ``torch.int64``, ``float`` ->
  torch's default dtype (``float32``), ``complex`` -> ``complex64``;
* lists and tuples go through ``numpy.asarray``;
* ``bytes``, ``bytearray`` and ``str`` are refused (``SchemaError`` naming the
  key), on every add path: they are text or raw data, not arrays, and NumPy
  would read them as one string scalar or as bytes depending on the type.
  ``numpy.frombuffer(value, dtype=numpy.uint8)`` makes an array of raw bytes.

A later value is accepted when its dtype casts to the column dtype under torch's
``same_kind`` rule (``torch.can_cast``): float64 into a float32 column is fine,
a float into an integer column or an integer into a bool column is not.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from tensordict import TensorDictBase

from replaystore.errors import SchemaError

__all__ = [
    "DTYPES",
    "FieldSpec",
    "as_flat_mapping",
    "dtype_from_name",
    "dtype_name",
    "infer_fields",
    "numpy_dtype",
    "raw_bytes_error",
    "schema_error",
]

# Column dtypes we store; the names are what checkpoints record.
DTYPES: dict[str, torch.dtype] = {
    "bool": torch.bool,
    "uint8": torch.uint8,
    "int8": torch.int8,
    "int16": torch.int16,
    "int32": torch.int32,
    "int64": torch.int64,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
    "float32": torch.float32,
    "float64": torch.float64,
    "complex64": torch.complex64,
    "complex128": torch.complex128,
}
_NAMES = {dtype: name for name, dtype in DTYPES.items()}
INT64_RANGE = (-(2**63), 2**63 - 1)
_TORCH_TO_NUMPY: dict[torch.dtype, np.dtype] = {
    dtype: np.dtype(name) for name, dtype in DTYPES.items() if name != "bfloat16"
}
_NUMPY_TO_TORCH: dict[np.dtype, torch.dtype] = {v: k for k, v in _TORCH_TO_NUMPY.items()}
_PY_TO_TORCH: dict[type, torch.dtype] = {
    bool: torch.bool,
    int: torch.int64,
    float: torch.float64,  # for cast checks; a new column from a float gets float32
    complex: torch.complex128,
}


def dtype_name(dtype: torch.dtype) -> str:
    """The checkpoint name of a supported torch dtype (``"float32"``)."""
    return _NAMES[dtype]


def dtype_from_name(name: str) -> torch.dtype:
    """The torch dtype of a checkpoint dtype name; raises KeyError for anything else."""
    return DTYPES[name]


def numpy_dtype(dtype: torch.dtype) -> np.dtype | None:
    """The numpy dtype with the same layout, or None (bfloat16)."""
    return _TORCH_TO_NUMPY.get(dtype)


@dataclass(frozen=True, slots=True)
class FieldSpec:
    """One column: its key, the shape of one item (without the batch dimension) and dtype.

    ``accepts`` holds every value type/dtype that may be written into the column
    without a cast across kinds: numpy dtypes, torch dtypes and Python scalar types.
    """

    name: str
    shape: tuple[int, ...]
    dtype: torch.dtype
    accepts: frozenset[Any] = field(default=frozenset(), compare=False, repr=False)
    scalar_types: frozenset[type] = field(default=frozenset(), compare=False, repr=False)

    @classmethod
    def make(cls, name: str, shape: tuple[int, ...], dtype: torch.dtype) -> FieldSpec:
        """A spec with its ``accepts`` set computed from torch's casting rule."""
        accepts: set[Any] = set()
        for src in DTYPES.values():
            if torch.can_cast(src, dtype):
                accepts.add(src)
                if src in _TORCH_TO_NUMPY:
                    accepts.add(_TORCH_TO_NUMPY[src])
        py_ok = {py for py, src in _PY_TO_TORCH.items() if torch.can_cast(src, dtype)}
        accepts.update(py_ok)
        # Scalars the add fast path writes without looking at their value. NumPy
        # raises OverflowError for an integer scalar outside the column's range, so
        # only NumPy integer types that always fit qualify (the others take the
        # checked path); Python ints are range-checked against ``int_range``.
        scalars = set(py_ok)
        own = _TORCH_TO_NUMPY.get(dtype)
        int_column = own is not None and own.kind in "iu"
        for npd in accepts:
            if isinstance(npd, np.dtype) and (
                npd.kind not in "iu"
                or not int_column
                or own is None
                or np.can_cast(npd, own, "safe")
            ):
                scalars.add(npd.type)
        item_shape = tuple(int(d) for d in shape)
        return cls(name, item_shape, dtype, frozenset(accepts), frozenset(scalars))

    @property
    def int_range(self) -> tuple[int, int]:
        """Python ints in this range are written without a further check."""
        npd = _TORCH_TO_NUMPY.get(self.dtype)
        if npd is not None and npd.kind in "iu":
            info = np.iinfo(npd)
            return int(info.min), int(info.max)
        return INT64_RANGE

    @property
    def item_nbytes(self) -> int:
        """Bytes of one item of this column."""
        n = torch.empty((), dtype=self.dtype).element_size()
        for d in self.shape:
            n *= d
        return n

    def describe(self) -> str:
        return f"{self.name!r}: shape {self.shape}, dtype {dtype_name(self.dtype)}"


def _value_dtype_shape(value: Any) -> tuple[torch.dtype | None, tuple[int, ...], str]:
    """(torch dtype or None when unsupported, shape, readable dtype) of one value."""
    if isinstance(value, torch.Tensor):
        dt = value.dtype if value.dtype in _NAMES else None
        return dt, tuple(value.shape), str(value.dtype).removeprefix("torch.")
    if isinstance(value, np.ndarray | np.generic):
        return _NUMPY_TO_TORCH.get(value.dtype), tuple(value.shape), str(value.dtype)
    if type(value) in _PY_TO_TORCH:
        return _PY_TO_TORCH[type(value)], (), f"python {type(value).__name__}"
    arr = np.asarray(value)
    return _NUMPY_TO_TORCH.get(arr.dtype), tuple(arr.shape), str(arr.dtype)


def _new_column_dtype(value: Any, dtype: torch.dtype) -> torch.dtype:
    if type(value) is float:
        return torch.get_default_dtype()
    if type(value) is complex:
        return torch.complex64 if torch.get_default_dtype() == torch.float32 else torch.complex128
    return dtype


_RAW_TYPES = (bytes, bytearray, str)


def raw_bytes_error(key: str, value: Any) -> SchemaError | None:
    """The error for a ``bytes``/``bytearray``/``str`` value of ``key``, else None.

    Every add path (compiled or NumPy, single or batch, first add or later)
    applies this one rule, so they accept and refuse the same inputs.
    """
    if not isinstance(value, _RAW_TYPES):
        return None
    return SchemaError(
        f"key {key!r} holds {type(value).__name__}, which is not an array: store raw bytes "
        "as numpy.frombuffer(value, dtype=numpy.uint8) (and text outside the buffer)"
    )


def as_flat_mapping(experience: Any, *, batched: bool) -> Mapping[str, Any]:
    """The experience as a mapping of string keys to leaf values.

    Raises:
        SchemaError: not a mapping or TensorDict, a non-string key, a nested
            mapping, raw bytes or text (:func:`raw_bytes_error`), or (for a
            TensorDict) a batch size that does not fit ``batched``.
    """
    if isinstance(experience, TensorDictBase):
        bs = tuple(experience.batch_size)
        if not batched and bs != ():
            raise SchemaError(
                f"add() takes one transition (TensorDict batch_size []), got batch_size "
                f"{list(bs)}; use add_batch() for several"
            )
        if batched and len(bs) != 1:
            raise SchemaError(f"add_batch() takes a TensorDict with batch_size [N], got {list(bs)}")
        experience = dict(experience.items())
    elif not isinstance(experience, Mapping):
        raise SchemaError(
            f"an experience must be a TensorDict or a mapping of key -> value, "
            f"got {type(experience).__name__}"
        )
    for key, value in experience.items():
        if not isinstance(key, str):
            raise SchemaError(f"keys must be strings, got {key!r}")
        if isinstance(value, Mapping | TensorDictBase):
            raise SchemaError(
                f"key {key!r} holds a nested mapping; nested keys are not supported "
                "(flatten them first, e.g. TensorDict.flatten_keys('.'))"
            )
        err = raw_bytes_error(key, value)
        if err is not None:
            raise err
    return experience


def infer_fields(
    experience: Mapping[str, Any], *, batched: bool, reserved: tuple[str, ...] = ()
) -> list[FieldSpec]:
    """Column specs from a first experience (or first batch when ``batched``).

    Raises:
        SchemaError: no keys, a reserved key, raw bytes or text, an unsupported dtype, or (batched)
            a value without a leading batch dimension.
    """
    if not experience:
        raise SchemaError("an experience needs at least one key")
    fields = []
    for key, value in experience.items():
        if key in reserved:
            raise SchemaError(
                f"key {key!r} is reserved: prioritized samples add {', '.join(reserved)} entries"
            )
        err = raw_bytes_error(key, value)
        if err is not None:
            raise err
        dtype, shape, readable = _value_dtype_shape(value)
        if dtype is None:
            raise SchemaError(
                f"key {key!r} has unsupported dtype {readable}; supported: {', '.join(DTYPES)}"
            )
        if batched:
            if not shape:
                raise SchemaError(
                    f"key {key!r} has no batch dimension (a scalar); add_batch() needs [N, ...]"
                )
            shape = shape[1:]
        fields.append(FieldSpec.make(key, shape, _new_column_dtype(value, dtype)))
    return fields


def schema_error(
    fields: Mapping[str, FieldSpec], experience: Mapping[str, Any], *, batched: bool
) -> SchemaError | None:
    """The error describing why ``experience`` does not fit ``fields``, or None if it fits.

    Checks, in order: missing keys, extra keys, then per key (in schema order)
    the item shape and the dtype. With ``batched``, also that every value has
    the same leading dimension.
    """
    missing = [k for k in fields if k not in experience]
    extra = [k for k in experience if k not in fields]
    if missing or extra:
        parts = []
        if missing:
            parts.append(f"missing key(s) {', '.join(map(repr, missing))}")
        if extra:
            parts.append(f"unexpected key(s) {', '.join(map(repr, extra))}")
        expected = ", ".join(map(repr, fields))
        return SchemaError(
            f"experience does not match the buffer schema: {'; '.join(parts)} "
            f"(expected keys: {expected})"
        )
    lead: tuple[str, int] | None = None
    for key, spec in fields.items():
        err = raw_bytes_error(key, experience[key])
        if err is not None:
            return err
        dtype, shape, readable = _value_dtype_shape(experience[key])
        if batched:
            if not shape:
                return SchemaError(
                    f"key {key!r}: add_batch() needs a leading batch dimension, got a scalar"
                )
            if lead is None:
                lead = (key, shape[0])
            elif shape[0] != lead[1]:
                return SchemaError(
                    f"key {key!r} has {shape[0]} rows but key {lead[0]!r} has {lead[1]}"
                )
            shape = shape[1:]
        if shape != spec.shape:
            return SchemaError(
                f"key {key!r}: expected item shape {spec.shape}, got {shape}"
                + (" (after the batch dimension)" if batched else "")
            )
        if dtype is None or not torch.can_cast(dtype, spec.dtype):
            return SchemaError(
                f"key {key!r}: dtype {readable} cannot be stored in a "
                f"{dtype_name(spec.dtype)} column without a cast across kinds"
            )
    return None
