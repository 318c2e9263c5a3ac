"""A rank's training state as one flat, authenticated buffer: every tensor's bytes copied once, the rest described
in JSON beside them. Nothing in it is ever unpickled.

Layout (little-endian): the header — ``MAGIC`` (8 bytes), iteration, owner rank, world size, skeleton length and
total length (5 × int64) — then a 32-byte tag, then the skeleton (UTF-8 JSON: the state with each tensor and array
replaced by a reference into a table of offsets, dtypes and shapes), then each tensor's bytes at a 64-byte aligned
offset. Capture is one ``memcpy`` per tensor into the destination (a shared-memory slot or a file), then
``seal`` writes the tag; ``unpack`` checks the tag before it reads anything else, then builds fresh tensors from the
bytes, so what comes back is bit for bit what was captured, and only what the job's own ranks wrote.

The tag is HMAC-SHA256 under the job's snapshot key (``protect.keys``) of the header and of the SHA-256 of each
``CHUNK`` of what follows the tag: the chunks hash in parallel threads (hashlib releases the GIL), so sealing a
large state costs a fraction of one core per chunk rather than one core for all of it.

The skeleton holds ``None``, booleans, integers, floats, strings, bytes, dicts (any of these as keys), lists and
tuples of them, torch tensors, numpy arrays and numpy scalars; a state holding anything else cannot be captured
(``TypeError`` naming where it is).
"""

from __future__ import annotations

import base64
import concurrent.futures
import hashlib
import hmac
import json
import math
import os
import random
import re
import struct
import threading
from dataclasses import dataclass
from typing import Any

import torch

MAGIC = b"LSPROT02"
_HEAD = struct.Struct("<8sqqqqq")  # magic, iteration, owner, world, skeleton length, total length
TAG_BYTES = 32
DATA_START = _HEAD.size + TAG_BYTES  # where the skeleton starts
ALIGN = 64
CHUNK = 16 << 20
MAX_SKELETON = 256 << 20
_NUMPY_DTYPE = re.compile(
    r"^[<>|=]?[biufc][1-9][0-9]?$"
)  # plain numbers only: no object, no structured dtypes


class SnapshotRefused(ValueError):
    """A buffer that is not a complete snapshot of this job's (wrong tag, wrong owner, truncated, malformed)."""


@dataclass(frozen=True)
class Header:
    iteration: int
    owner: int
    world: int
    skeleton_length: int
    total: int


def _align(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


def rng_state() -> dict[str, Any]:
    """Every random number generator a training step may draw from on the CPU."""
    state: dict[str, Any] = {"torch": torch.get_rng_state(), "python": random.getstate()}
    try:
        import numpy

        state["numpy"] = numpy.random.get_state()
    except ImportError:  # torch does not need numpy
        pass
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    if "numpy" in state:
        import numpy

        numpy.random.set_state(state["numpy"])


# --- the skeleton: data-only JSON ---------------------------------------------------------------------------------
# Every container is a JSON array whose first element says what it is; JSON objects are never used, so no value of
# the state can be mistaken for a marker. Plain values (null, booleans, numbers, strings) stay as they are.
def _is_numpy(value: Any) -> str:
    module = type(value).__module__
    if not module.startswith("numpy"):
        return ""
    import numpy

    if isinstance(value, numpy.ndarray):
        return "array"
    if isinstance(value, numpy.generic):
        return "scalar"
    return ""


def _encode(value: Any, arrays: list, path: str) -> Any:
    if value is None or isinstance(value, bool | str):
        return value
    kind = _is_numpy(value)
    if kind:
        arrays.append(value)
        return ["A" if kind == "array" else "S", len(arrays) - 1]
    if isinstance(value, int):
        return value
    if isinstance(value, float):
        return value
    if isinstance(value, torch.Tensor):
        arrays.append(value)
        return ["T", len(arrays) - 1]
    if isinstance(value, bytes | bytearray):
        return ["b", base64.b64encode(bytes(value)).decode()]
    if isinstance(value, dict):
        return [
            "d",
            *(
                [_encode(k, arrays, f"{path}.<key>"), _encode(v, arrays, f"{path}[{k!r}]")]
                for k, v in value.items()
            ),
        ]
    if isinstance(value, list):
        return ["l", *(_encode(item, arrays, f"{path}[{i}]") for i, item in enumerate(value))]
    if isinstance(value, tuple) and not hasattr(value, "_fields"):
        return ["t", *(_encode(item, arrays, f"{path}[{i}]") for i, item in enumerate(value))]
    raise TypeError(
        f"cannot snapshot {path}: a {type(value).__qualname__}. A snapshot holds tensors, numpy arrays and scalars, "
        "numbers, strings, bytes, None, and dicts, lists and tuples of them"
    )


class Packed:
    """A state ready to be written: its skeleton encoded, its tensors' offsets planned."""

    def __init__(self, state: dict[str, Any], iteration: int, *, owner: int = 0, world: int = 1):
        arrays: list = []
        shape_only = _encode(state, arrays, "state")
        self.arrays = []
        table = []
        offset = 0  # relative to the start of the data, fixed below
        for item in arrays:
            if isinstance(item, torch.Tensor):
                t = item.detach()
                if t.layout != torch.strided:
                    raise TypeError(f"cannot snapshot a {t.layout} tensor")
                table.append(
                    [
                        "torch",
                        str(t.dtype).removeprefix("torch."),
                        list(t.shape),
                        t.numel() * t.element_size(),
                    ]
                )
            else:
                import numpy

                t = numpy.array(item, copy=True, order="C")  # keeps a scalar 0-d
                if not _NUMPY_DTYPE.match(t.dtype.str):
                    raise TypeError(f"cannot snapshot a numpy array of dtype {t.dtype}")
                table.append(["numpy", t.dtype.str, list(t.shape), t.nbytes])
            self.arrays.append(t)
        self.iteration, self.owner, self.world = int(iteration), int(owner), int(world)
        # Offsets depend on the skeleton's length, which depends on the offsets: plan with a generous length, then
        # fix it (an offset's digits grow by a few characters at most, so two passes settle).
        room = 4096
        for _ in range(8):
            offset = _align(DATA_START + room)
            placed = []
            for kind, dtype, shape, nbytes in table:
                placed.append([kind, dtype, shape, offset, nbytes])
                offset = _align(offset + nbytes)
            skeleton = json.dumps({"v": shape_only, "a": placed}, separators=(",", ":")).encode()
            if DATA_START + len(skeleton) <= _align(DATA_START + room):
                break
            room = len(skeleton) + 1024
        self.skeleton = skeleton
        self.placed = placed
        self.nbytes = offset

    def write_into(self, buffer: torch.Tensor) -> int:
        """Copy into ``buffer`` (a 1-D uint8 tensor at least ``nbytes`` long), tag zeroed (``seal`` writes it);
        returns the bytes written."""
        if buffer.numel() < self.nbytes:
            raise ValueError(f"buffer of {buffer.numel()} bytes is too small for {self.nbytes}")
        head = (
            _HEAD.pack(MAGIC, self.iteration, self.owner, self.world, len(self.skeleton), self.nbytes)
            + bytes(TAG_BYTES)
            + self.skeleton
        )
        buffer[: len(head)].copy_(torch.frombuffer(bytearray(head), dtype=torch.uint8))
        for t, (kind, _, _, offset, nbytes) in zip(self.arrays, self.placed, strict=True):
            if not nbytes:
                continue
            source = (
                t.reshape(-1).view(torch.uint8)
                if kind == "torch"
                else torch.from_numpy(t.reshape(-1).view("u1"))
            )
            buffer[offset : offset + nbytes].copy_(source)
        return self.nbytes

    def to_bytes(self, key: bytes) -> bytes:
        """The sealed state as bytes (tests, tools)."""
        buffer = torch.zeros(self.nbytes, dtype=torch.uint8)
        self.write_into(buffer)
        seal(buffer, key)
        return buffer.numpy().tobytes()


# --- the tag ---------------------------------------------------------------------------------------------------------
_pool: concurrent.futures.ThreadPoolExecutor | None = None
_pool_lock = threading.Lock()


def _hash_pool() -> concurrent.futures.ThreadPoolExecutor:
    global _pool
    with _pool_lock:
        if _pool is None:
            _pool = concurrent.futures.ThreadPoolExecutor(
                max_workers=min(8, os.cpu_count() or 2), thread_name_prefix="lockstep-protect-hash"
            )
        return _pool


def _bytes_view(buffer) -> memoryview:
    if isinstance(buffer, torch.Tensor):
        if buffer.dtype != torch.uint8 or buffer.dim() != 1:
            raise ValueError("a snapshot buffer is a 1-D uint8 tensor")
        return memoryview(buffer.numpy()).cast("B")
    return memoryview(buffer).cast("B")


def _compute_tag(key: bytes, view: memoryview, total: int) -> bytes:
    head = bytes(view[: _HEAD.size])
    starts = range(DATA_START, total, CHUNK)
    chunks = [view[start : min(start + CHUNK, total)] for start in starts]
    if len(chunks) > 1:
        digests = list(_hash_pool().map(lambda c: hashlib.sha256(c).digest(), chunks))
    else:
        digests = [hashlib.sha256(c).digest() for c in chunks]
    mac = hmac.new(key, b"lockstep-protect-snapshot/2\0" + head + struct.pack("<q", CHUNK), hashlib.sha256)
    for digest in digests:
        mac.update(digest)
    return mac.digest()


def header(buffer) -> Header:
    """The header of a snapshot, from its first bytes; ``SnapshotRefused`` when it is not one (nothing verified)."""
    view = _bytes_view(buffer)
    if len(view) < DATA_START:
        raise SnapshotRefused("too short to be a snapshot")
    magic, iteration, owner, world, skeleton_length, total = _HEAD.unpack(bytes(view[: _HEAD.size]))
    if magic != MAGIC:
        older = magic.startswith(b"LSPROT")
        raise SnapshotRefused(
            "a snapshot of an older, unauthenticated format"
            if older
            else "not a Lockstep protection snapshot"
        )
    if not (0 <= skeleton_length <= MAX_SKELETON and DATA_START + skeleton_length <= total and world >= 1):
        raise SnapshotRefused("a snapshot header with impossible lengths")
    return Header(iteration, owner, world, skeleton_length, total)


def peek(buffer) -> tuple[int, int]:
    """(iteration, total length) of a snapshot, from its first bytes; ValueError when it is not one."""
    head = header(buffer)
    return head.iteration, head.total


def seal(buffer, key: bytes) -> bytes:
    """Write the tag of the snapshot written into ``buffer`` (under the job's snapshot key); returns it."""
    view = _bytes_view(buffer)
    head = header(view)
    if head.total > len(view):
        raise ValueError("the snapshot is longer than its buffer")
    tag = _compute_tag(key, view, head.total)
    view[_HEAD.size : DATA_START] = tag
    return tag


def verify(buffer, key: bytes, *, owner: int | None = None, world: int | None = None) -> Header:
    """The header of a complete snapshot whose tag is right under ``key`` (and of ``owner``'s, in a world of
    ``world`` ranks, when given); ``SnapshotRefused`` saying why otherwise. Reads nothing but the header first."""
    view = _bytes_view(buffer)
    head = header(view)
    if head.total > len(view):
        raise SnapshotRefused(f"truncated: {len(view)} of its {head.total} bytes")
    tag = _compute_tag(key, view, head.total)
    if not hmac.compare_digest(tag, bytes(view[_HEAD.size : DATA_START])):
        raise SnapshotRefused("its tag is wrong: not written with this job's secret")
    if owner is not None and head.owner != owner:
        raise SnapshotRefused(f"it is rank {head.owner}'s state, not rank {owner}'s")
    if world is not None and head.world != world:
        raise SnapshotRefused(f"it is from a world of {head.world} ranks, not {world}")
    return head


def unpack(
    buffer, key: bytes, *, owner: int | None = None, world: int | None = None
) -> tuple[int, dict[str, Any]]:
    """(iteration, state) from a sealed buffer (bytes, bytearray, mmap or a 1-D uint8 tensor) after ``verify``;
    tensors and arrays are copies. ``SnapshotRefused`` when it is not a complete snapshot of this job's."""
    head = verify(buffer, key, owner=owner, world=world)
    view = buffer if isinstance(buffer, torch.Tensor) else torch.frombuffer(buffer, dtype=torch.uint8)
    raw = _bytes_view(buffer)[DATA_START : DATA_START + head.skeleton_length]
    try:
        skeleton = json.loads(bytes(raw))
        arrays = [_build_array(entry, view, head) for entry in skeleton["a"]]
        state = _decode(skeleton["v"], arrays)
    except SnapshotRefused:
        raise
    except (ValueError, TypeError, KeyError, IndexError, RecursionError, OverflowError) as error:
        raise SnapshotRefused(f"its skeleton is malformed: {error}") from None
    if not isinstance(state, dict):
        raise SnapshotRefused("its state is not a dict")
    return head.iteration, state


def _build_array(entry: list, view: torch.Tensor, head: Header):
    kind, dtype_name, shape, offset, nbytes = entry
    if not (
        isinstance(shape, list)
        and all(isinstance(n, int) and n >= 0 for n in shape)
        and isinstance(offset, int)
        and isinstance(nbytes, int)
        and DATA_START + head.skeleton_length <= offset
        and 0 <= nbytes
        and offset + nbytes <= head.total
    ):
        raise SnapshotRefused("an array entry out of bounds")
    if kind == "torch":
        dtype = getattr(torch, str(dtype_name), None)
        if not isinstance(dtype, torch.dtype):
            raise SnapshotRefused(f"unknown tensor dtype {dtype_name!r}")
        itemsize = torch.empty((), dtype=dtype).element_size()
        if math.prod(shape) * itemsize != nbytes:
            raise SnapshotRefused("a tensor whose shape does not match its bytes")
        return view[offset : offset + nbytes].clone().view(dtype).reshape(shape)
    if kind == "numpy":
        import numpy

        if not (isinstance(dtype_name, str) and _NUMPY_DTYPE.match(dtype_name)):
            raise SnapshotRefused(f"unknown array dtype {dtype_name!r}")
        dtype = numpy.dtype(dtype_name)
        if math.prod(shape) * dtype.itemsize != nbytes:
            raise SnapshotRefused("an array whose shape does not match its bytes")
        data = view[offset : offset + nbytes].numpy().tobytes()
        return numpy.frombuffer(data, dtype=dtype).reshape(shape).copy()
    raise SnapshotRefused(f"unknown array kind {kind!r}")


def _decode(value: Any, arrays: list) -> Any:
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if not isinstance(value, list) or not value:
        raise SnapshotRefused("a skeleton value of an unknown shape")
    tag, rest = value[0], value[1:]
    if tag == "d":
        out = {}
        for pair in rest:
            if not (isinstance(pair, list) and len(pair) == 2):
                raise SnapshotRefused("a malformed dict entry")
            out[_decode(pair[0], arrays)] = _decode(pair[1], arrays)
        return out
    if tag == "l":
        return [_decode(item, arrays) for item in rest]
    if tag == "t":
        return tuple(_decode(item, arrays) for item in rest)
    if tag in ("T", "A", "S") and len(rest) == 1 and isinstance(rest[0], int) and 0 <= rest[0] < len(arrays):
        array = arrays[rest[0]]
        if tag == "T" and isinstance(array, torch.Tensor):
            return array
        if tag == "A" and not isinstance(array, torch.Tensor):
            return array
        if tag == "S" and not isinstance(array, torch.Tensor) and array.shape == ():
            return array[()]
    if tag == "b" and len(rest) == 1 and isinstance(rest[0], str):
        return base64.b64decode(rest[0], validate=True)
    raise SnapshotRefused(f"an unknown skeleton marker {str(tag)[:20]!r}")


def digest(state: dict[str, Any]) -> str:
    """SHA-256 over every tensor's (and array's) dtype, shape and bytes and every other value's repr, walked in
    order: equal digests, bit-identical states."""
    h = hashlib.sha256()

    def walk(value: Any) -> None:
        if isinstance(value, torch.Tensor):
            t = value.detach().contiguous()
            h.update(f"T{t.dtype}{tuple(t.shape)}".encode())
            if t.numel():
                h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())
        elif hasattr(value, "__array__") and hasattr(value, "dtype") and hasattr(value, "tobytes"):
            h.update(f"A{value.dtype}{value.shape}".encode() + value.tobytes())
        elif isinstance(value, dict):
            h.update(b"{")
            for key in value:
                h.update(repr(key).encode())
                walk(value[key])
            h.update(b"}")
        elif isinstance(value, list | tuple):
            h.update(b"(" if isinstance(value, tuple) else b"[")
            for item in value:
                walk(item)
            h.update(b")")
        else:
            h.update(f"{type(value).__name__}:{value!r};".encode())

    walk(state)
    return h.hexdigest()
