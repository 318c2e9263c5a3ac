"""A rank's training state as one flat buffer: every tensor's bytes copied once, the rest pickled beside them.

Layout (little-endian): ``MAGIC`` (8 bytes), header length, iteration, payload length (3 × int64), the pickled
skeleton (the state with each tensor replaced by a ``TensorRef``), then each tensor's bytes at a 64-byte
aligned offset. Capture is one ``memcpy`` per tensor into the destination (a shared-memory slot or a file);
restore builds fresh tensors from the bytes, so what comes back is bit for bit what was captured.
"""

from __future__ import annotations

import hashlib
import pickle
import random
import struct
from dataclasses import dataclass
from typing import Any

import torch

MAGIC = b"LSPROT01"
_HEAD = struct.Struct("<8sqqq")  # magic, skeleton length, iteration, total length
ALIGN = 64


@dataclass(frozen=True)
class TensorRef:
    offset: int
    nbytes: int
    dtype: str
    shape: tuple[int, ...]


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


def _flatten(value: Any, tensors: list[torch.Tensor]) -> Any:
    if isinstance(value, torch.Tensor):
        tensors.append(value)
        return ("__tensor__", len(tensors) - 1)
    if isinstance(value, dict):
        return {key: _flatten(item, tensors) for key, item in value.items()}
    if isinstance(value, list):
        return [_flatten(item, tensors) for item in value]
    if isinstance(value, tuple) and not hasattr(value, "_fields"):
        return tuple(_flatten(item, tensors) for item in value)
    return value


def _replace(value: Any, refs: list[TensorRef]) -> Any:
    if isinstance(value, tuple) and len(value) == 2 and value[0] == "__tensor__":
        return refs[value[1]]
    if isinstance(value, dict):
        return {key: _replace(item, refs) for key, item in value.items()}
    if isinstance(value, list):
        return [_replace(item, refs) for item in value]
    if isinstance(value, tuple) and not hasattr(value, "_fields"):
        return tuple(_replace(item, refs) for item in value)
    return value


class Packed:
    """A state ready to be written: its skeleton pickled, its tensors' offsets planned."""

    def __init__(self, state: dict[str, Any], iteration: int):
        tensors: list[torch.Tensor] = []
        shape_only = _flatten(state, tensors)
        self.tensors = [t.detach() for t in tensors]
        # Offsets depend on the skeleton's length, which depends on the offsets: plan with a generous header,
        # then fix it (a pickled int grows by at most a few bytes, so two passes settle).
        head = 4096
        for _ in range(4):
            offset = _align(_HEAD.size + head)
            refs = []
            for t in self.tensors:
                nbytes = t.numel() * t.element_size()
                refs.append(TensorRef(offset, nbytes, str(t.dtype).removeprefix("torch."), tuple(t.shape)))
                offset = _align(offset + nbytes)
            skeleton = pickle.dumps(_replace(shape_only, refs), protocol=pickle.HIGHEST_PROTOCOL)
            if _HEAD.size + len(skeleton) <= _align(_HEAD.size + head):
                break
            head = len(skeleton) + 1024
        self.skeleton = skeleton
        self.refs = refs
        self.iteration = int(iteration)
        self.nbytes = offset

    def write_into(self, buffer: torch.Tensor) -> int:
        """Copy into ``buffer`` (a 1-D uint8 tensor at least ``nbytes`` long); returns the bytes written."""
        if buffer.numel() < self.nbytes:
            raise ValueError(f"buffer of {buffer.numel()} bytes is too small for {self.nbytes}")
        head = _HEAD.pack(MAGIC, len(self.skeleton), self.iteration, self.nbytes) + self.skeleton
        buffer[: len(head)].copy_(torch.frombuffer(bytearray(head), dtype=torch.uint8))
        for t, ref in zip(self.tensors, self.refs, strict=True):
            if ref.nbytes:
                buffer[ref.offset : ref.offset + ref.nbytes].copy_(t.reshape(-1).view(torch.uint8))
        return self.nbytes

    def to_bytes(self) -> bytes:
        buffer = torch.zeros(self.nbytes, dtype=torch.uint8)
        self.write_into(buffer)
        return buffer.numpy().tobytes() if hasattr(buffer, "numpy") else bytes(buffer.tolist())


def peek(buffer) -> tuple[int, int]:
    """(iteration, total length) of a packed state, from its first bytes; ValueError when it is not one."""
    magic, _, iteration, total = _HEAD.unpack(bytes(memoryview(buffer)[: _HEAD.size]))
    if magic != MAGIC:
        raise ValueError("not a Lockstep protection snapshot")
    return iteration, total


def unpack(buffer) -> tuple[int, dict[str, Any]]:
    """(iteration, state) from a packed buffer (bytes, bytearray, mmap or a uint8 tensor); tensors are copies."""
    if isinstance(buffer, torch.Tensor):
        view = buffer
    else:
        view = torch.frombuffer(buffer, dtype=torch.uint8)
    head = bytes(view[: _HEAD.size].tolist())
    magic, skeleton_length, iteration, total = _HEAD.unpack(head)
    if magic != MAGIC or total > view.numel():
        raise ValueError("not a complete Lockstep protection snapshot")
    skeleton = pickle.loads(bytes(view[_HEAD.size : _HEAD.size + skeleton_length].numpy()))

    def build(value):
        if isinstance(value, TensorRef):
            raw = view[value.offset : value.offset + value.nbytes].clone()
            return raw.view(getattr(torch, value.dtype)).reshape(value.shape)
        if isinstance(value, dict):
            return {key: build(item) for key, item in value.items()}
        if isinstance(value, list):
            return [build(item) for item in value]
        if isinstance(value, tuple) and not hasattr(value, "_fields"):
            return tuple(build(item) for item in value)
        return value

    return iteration, build(skeleton)


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
