"""Arrow arrays of a few Python values, without pandas.

``pa.array()`` of a Python list (and ``pa.scalar()``, ``pc.field(...).isin(list)``,
``Schema.empty_table()``) first asks pandas whether the list is one of its
array-likes, which imports pandas: 0.2-0.3 s, a quarter of a ``lakehouse get``
that never uses it. The interactive reads build the few arrays they need
(the ids and buckets a point read looks up, a column of a partition value)
here, from buffers; other types fall back to ``pa.array``.
"""

from __future__ import annotations

from array import array
from collections.abc import Sequence
from itertools import accumulate

import pyarrow as pa

#: Arrow integer type → the ``array`` module's type code of the same width.
_INT_CODES = {
    pa.int8(): "b",
    pa.int16(): "h",
    pa.int32(): "i",
    pa.int64(): "q",
    pa.uint8(): "B",
    pa.uint16(): "H",
    pa.uint32(): "I",
    pa.uint64(): "Q",
}


def values_array(values: Sequence[str | int], type: pa.DataType) -> pa.Array:
    """``pa.array(values, type)`` for strings and integers (no nulls), built from
    buffers so that pandas is not imported."""
    if pa.types.is_string(type) or pa.types.is_large_string(type):
        encoded = [str(v).encode("utf-8") for v in values]
        offsets = array("q" if pa.types.is_large_string(type) else "i", [0])
        offsets.extend(accumulate(len(b) for b in encoded))
        data = pa.py_buffer(b"".join(encoded))
        return pa.Array.from_buffers(type, len(encoded), [None, pa.py_buffer(offsets), data])
    code = _INT_CODES.get(type)
    if code is not None:
        numbers = array(code, [int(v) for v in values])
        return pa.Array.from_buffers(type, len(numbers), [None, pa.py_buffer(numbers)])
    return pa.array(values, type)


def constant_array(value: str | None, type: pa.DataType, length: int) -> pa.Array:
    """``length`` times ``value`` (a partition value, or NULL for a missing column)."""
    if value is None:
        return pa.nulls(length, type)
    return values_array([value] * length, type)


def empty_table(schema: pa.Schema) -> pa.Table:
    """An empty table of ``schema`` (``Schema.empty_table()`` imports pandas)."""
    return pa.Table.from_batches([], schema=schema)
