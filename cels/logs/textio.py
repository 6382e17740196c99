"""Byte-exact text I/O shared by the readers and writers.

Logs are read as bytes, split on ``\\n`` only (a stray ``\\r`` inside a query stays part of
it), and decoded strictly in the log's encoding (``LoadOptions.encoding``, default UTF-8):
bytes that are not valid in it are refused by the readers, naming file, line and field
(docs/formats.md).  Every writer writes UTF-8.  ``.gz`` files are (de)compressed transparently.
"""

from __future__ import annotations

import codecs
import gzip
import io
import os
import zlib
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import BinaryIO, TextIO

from tqdm import tqdm

from cels.fileio import atomic_write
from cels.logs.records import LogError

ENCODING = "utf-8"  # the default input encoding and the one every output is written in
BOM = "\ufeff"
_PROGRESS_EVERY = 1 << 16  # lines between progress-bar updates


def is_gzip(path: str | os.PathLike[str]) -> bool:
    return str(path).endswith(".gz")


def check_encoding(encoding: str) -> None:
    """Raise ValueError unless ``encoding`` is a codec that keeps ``\\n`` and ``\\r`` as those single bytes."""
    try:
        codecs.lookup(encoding)
    except LookupError:
        raise ValueError(f"unknown encoding {encoding!r}; e.g. utf-8 (the default) or latin-1") from None
    if "\r\n".encode(encoding) != b"\r\n":
        raise ValueError(f"encoding {encoding!r} does not write a line break as the byte 0x0a; logs must use an ASCII-compatible encoding")


def undecodable(raw: bytes, error: UnicodeDecodeError, encoding: str) -> str:
    """What a refusal says about ``raw[error.start]``, the first byte that is not valid ``encoding``."""
    label = codecs.lookup(encoding).name.upper()
    return (
        f"byte 0x{raw[error.start]:02x} is not valid {label} (byte {error.start + 1} of the line); "
        "read a log in another encoding with the encoding option (e.g. --encoding latin-1, [data] encoding = \"latin-1\")"
    )


GZIP_ERRORS = (EOFError, OSError, zlib.error)
"""What reading a damaged gzip file raises: truncated (EOFError), not gzip or a bad CRC
(gzip.BadGzipFile, an OSError), corrupted deflate data (zlib.error)."""


def damaged_gzip(path: str | os.PathLike[str], lines: int, error: BaseException) -> LogError:
    """The refusal of a ``.gz`` log that cannot be decompressed, naming the last whole line read."""
    where = f"after line {lines} (the last line read)" if lines else "before its first line"
    if isinstance(error, EOFError):
        what = f"the compressed data ends {where}, before gzip's end-of-stream marker: the file is truncated"
    else:
        what = f"damaged gzip data {where}: {error}"
    return LogError(str(path), None, None, f"{what} (copy the file again, or read an uncompressed copy)")


def read_bytes(path: str | os.PathLike[str]) -> bytes:
    """The whole (decompressed) file; a damaged ``.gz`` is a LogError (:func:`damaged_gzip`)."""
    with open(path, "rb") as raw:
        if not is_gzip(path):
            return raw.read()
        parts: list[bytes] = []
        stream = gzip.GzipFile(fileobj=raw)
        try:
            while chunk := stream.read1(1 << 20):  # what is decompressed so far, line counts included
                parts.append(chunk)
        except GZIP_ERRORS as exc:
            raise damaged_gzip(path, sum(part.count(b"\n") for part in parts), exc) from None
        return b"".join(parts)


def _gzip_lines(path: str | os.PathLike[str], stream: BinaryIO) -> Iterator[bytes]:
    """The lines of a gzip stream; a damaged stream is a LogError (:func:`damaged_gzip`)."""
    lines = iter(stream)
    read = 0
    while True:
        try:
            line = next(lines)
        except StopIteration:
            return
        except GZIP_ERRORS as exc:
            raise damaged_gzip(path, read, exc) from None
        read += 1
        yield line


def iter_lines(path: str | os.PathLike[str]) -> Iterator[tuple[int, bytes, bytes]]:
    """Yield ``(1-based line number, line without terminator, terminator)`` with a progress bar.

    The terminator is ``b"\\r\\n"``, ``b"\\n"`` or ``b""`` (last line without one).
    """
    size = os.path.getsize(path)
    with open(path, "rb") as raw, tqdm(
        total=size, unit="B", unit_scale=True, desc=f"reading {Path(path).name}", disable=None, leave=False
    ) as bar:
        stream: Iterator[bytes] = _gzip_lines(path, gzip.GzipFile(fileobj=raw)) if is_gzip(path) else raw  # type: ignore[arg-type]
        for lineno, line in enumerate(stream, start=1):
            if lineno % _PROGRESS_EVERY == 0:
                bar.update(raw.tell() - bar.n)
            if line.endswith(b"\r\n"):
                yield lineno, line[:-2], b"\r\n"
            elif line.endswith(b"\n"):
                yield lineno, line[:-1], b"\n"
            else:
                yield lineno, line, b""
        bar.update(size - bar.n)


@contextmanager
def open_text_output(path: str | os.PathLike[str], bom: bool = False) -> Iterator[TextIO]:
    """Atomically write text (UTF-8, newlines untranslated), gzip for ``.gz``."""
    with atomic_write(path, mode="wb") as raw, (
        gzip.GzipFile(filename="", fileobj=raw, mode="wb", mtime=0) if is_gzip(path) else nullcontext(raw)
    ) as sink:
        text = io.TextIOWrapper(sink, encoding=ENCODING, newline="")
        try:
            if bom:
                text.write(BOM)
            yield text
        finally:
            text.detach()  # flushes; the sink is closed by its own context
