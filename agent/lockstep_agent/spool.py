"""An append-only, fsynced JSON-lines spool of batches not yet accepted by the control plane.

Layout in the spool directory:

- ``spool.jsonl``: one batch per line, appended and fsynced before append() returns.
- ``spool.offset``: the byte offset of the first batch not yet delivered, replaced atomically
  (write, fsync, rename) after each delivery. A crash between a delivery and this write re-sends that
  batch once; its batch_id lets the server recognise the duplicate.
- ``rejected.jsonl``: batches the server refused as invalid (400/413/422), with its answer, kept for
  a human instead of blocking the queue forever.

When every spooled batch has been delivered the two spool files are removed, so the spool never grows
while the control plane is reachable.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterator
from pathlib import Path

log = logging.getLogger(__name__)


def _fsync_directory(directory: Path) -> None:
    descriptor = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


class Spool:
    def __init__(self, directory: str | os.PathLike):
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        if not os.access(self.directory, os.W_OK | os.X_OK):
            raise PermissionError(f"{self.directory} is not writable")
        self.path = self.directory / "spool.jsonl"
        self.offset_path = self.directory / "spool.offset"
        self.rejected_path = self.directory / "rejected.jsonl"
        self._drop_torn_tail()

    def _drop_torn_tail(self) -> None:
        """A crash in the middle of an append leaves a line without its newline; that batch was never
        acknowledged as spooled, so cut it off rather than let the next append glue onto it."""
        if not self.path.exists():
            return
        with open(self.path, "rb+") as handle:
            data = handle.read()
            if data and not data.endswith(b"\n"):
                keep = data.rfind(b"\n") + 1
                log.warning("spool: dropping a torn last line of %d bytes", len(data) - keep)
                handle.truncate(keep)
                handle.flush()
                os.fsync(handle.fileno())

    # --- state ---------------------------------------------------------------------------------------------

    def _offset(self) -> int:
        try:
            return int(self.offset_path.read_text().strip() or 0)
        except (OSError, ValueError):
            return 0

    def _size(self) -> int:
        try:
            return self.path.stat().st_size
        except FileNotFoundError:
            return 0

    def is_empty(self) -> bool:
        return self._offset() >= self._size()

    def __len__(self) -> int:
        return sum(1 for _ in self.pending())

    # --- writing -------------------------------------------------------------------------------------------

    def append(self, batch: dict) -> None:
        """Durably add a batch at the end: it is on disk when this returns."""
        line = (json.dumps(batch, separators=(",", ":")) + "\n").encode()
        created = not self.path.exists()
        with open(self.path, "ab") as handle:
            handle.write(line)
            handle.flush()
            os.fsync(handle.fileno())
        if created:
            _fsync_directory(self.directory)

    def pending(self) -> Iterator[tuple[int, dict]]:
        """(offset just past the batch, batch) for every undelivered batch, oldest first."""
        offset = self._offset()
        if offset >= self._size():
            return
        with open(self.path, "rb") as handle:
            handle.seek(offset)
            for line in handle:
                offset += len(line)
                if not line.endswith(b"\n"):
                    return  # an append in progress elsewhere; not a whole batch yet
                try:
                    yield offset, json.loads(line)
                except ValueError:
                    log.error(
                        "spool: an unreadable line at byte %d; set aside in %s",
                        offset - len(line),
                        self.rejected_path,
                    )
                    self._set_aside(line.decode(errors="replace").rstrip("\n"), "unreadable spool line")
                    self.commit(offset)

    def commit(self, offset: int) -> None:
        """Record that everything before `offset` was delivered; empty the spool when nothing is left."""
        if offset >= self._size():
            for path in (self.path, self.offset_path):
                path.unlink(missing_ok=True)
            _fsync_directory(self.directory)
            return
        temporary = self.offset_path.with_suffix(".tmp")
        with open(temporary, "w") as handle:
            handle.write(str(offset))
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temporary, self.offset_path)
        _fsync_directory(self.directory)

    def reject(self, batch: dict, reason: str) -> None:
        """Keep a batch the server refused as invalid, with the reason, out of the queue."""
        self._set_aside(batch, reason)

    def _set_aside(self, batch: dict | str, reason: str) -> None:
        with open(self.rejected_path, "a") as handle:
            handle.write(json.dumps({"reason": reason, "batch": batch}) + "\n")
            handle.flush()
            os.fsync(handle.fileno())
