"""Download one published file, verified: stdlib HTTP, streamed, hashed while written.

The bytes go to a temporary file next to the destination (``.NAME.XXXX.part``, a name no loader
looks for) and are renamed onto ``NAME`` only after the whole body arrived and its digest matched
the pinned one. A wrong, short or interrupted transfer raises and deletes the temporary file, so
the destination either holds a verified file or is untouched.

A destination that already exists is hashed first: if it matches, nothing is downloaded (a second
fetch costs one read of the file, about 0.3 s per 100 MB, and never a request). Re-hashing rather
than trusting a "verified" marker keeps the check true when the file was replaced or damaged after
it was fetched; the loaders hash every file before use anyway.

``$DFBENCH_MIRROR`` (a base URL) replaces every official address by ``MIRROR/<file name>``, for
clusters whose nodes reach the internet only through an internal mirror or proxy cache.

This module is the datasets package's own so that ``dfbench.datasets`` needs nothing from
``dfbench.benchmark``; ``dfbench.benchmark.grid.fetch`` uses it for the Inception weights as well.
"""
from __future__ import annotations

import hashlib
import http.client
import os
import sys
import tempfile
import urllib.error
import urllib.request
from pathlib import Path

from .errors import DatasetError
from .safeio import follow_umask

__all__ = ["MIRROR_ENV_VAR", "DownloadError", "ChecksumMismatchError", "file_digest", "resolve_url", "download_file"]

MIRROR_ENV_VAR = "DFBENCH_MIRROR"
_CHUNK = 1 << 20
_USER_AGENT = "dfbench-fetch (python urllib)"


class DownloadError(DatasetError):
    """A download failed (network, HTTP status, short body); nothing was left at the destination."""


class ChecksumMismatchError(DownloadError):
    """The downloaded bytes are not the pinned file; they were deleted."""

    def __init__(self, url: str, dest: Path, algo: str, expected: str, actual: str, size: int) -> None:
        self.expected, self.actual = expected, actual
        super().__init__(
            f"{url}: checksum mismatch, the download was deleted and nothing was written to {dest}.\n"
            f"  expected {algo} {expected}\n  actual   {algo} {actual} ({size:,} bytes)\n"
            f"The server (or a proxy / mirror) sent a different or damaged file; try again later, or "
            f"fetch it from the official source on another machine and check its {algo}."
        )


def _hasher(algo: str):
    # md5 is what the dataset authors publish: an integrity check here, not a security boundary
    return hashlib.new(algo, usedforsecurity=False) if algo == "md5" else hashlib.new(algo)


def file_digest(path: str | os.PathLike, algo: str) -> str:
    """Hex digest (``algo``: sha256 or md5) of a file, read in chunks."""
    h = _hasher(algo)
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(_CHUNK), b""):
            h.update(chunk)
    return h.hexdigest()


def resolve_url(url: str, filename: str) -> str:
    """``$DFBENCH_MIRROR/<filename>`` when the mirror variable is set, else ``url``."""
    mirror = os.environ.get(MIRROR_ENV_VAR, "").strip()
    return f"{mirror.rstrip('/')}/{filename}" if mirror else url


def _bar(total: int | None, desc: str, enabled: bool):
    from tqdm import tqdm

    return tqdm(total=total, desc=desc, unit="B", unit_scale=True, unit_divisor=1024,
                disable=not enabled, file=sys.stderr, leave=False)


def download_file(url: str, dest: str | os.PathLike, algo: str, digest: str, *, progress: bool = True,
                  timeout: float = 60.0) -> bool:
    """Make ``dest`` the verified file published at ``url`` (or at the mirror, see the module
    docstring). Returns False when ``dest`` already held the right file (no request made), True
    after a download. Raises :class:`DownloadError` / :class:`ChecksumMismatchError`.

    ``timeout`` bounds the connection and every read, so a stalled server fails instead of hanging.
    """
    dest = Path(dest)
    digest = digest.lower()
    if dest.is_file():
        if file_digest(dest, algo) == digest:
            return False
        # a damaged or foreign file at the destination: replaced below only by a verified download
    url = resolve_url(url, dest.name)
    try:
        dest.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp_name = tempfile.mkstemp(dir=dest.parent, prefix=f".{dest.name}.", suffix=".part")
    except OSError as e:
        raise DownloadError(f"cannot write into {dest.parent}: {e}") from e
    tmp = Path(tmp_name)
    try:
        h = _hasher(algo)
        written = 0
        request = urllib.request.Request(url, headers={"User-Agent": _USER_AGENT})
        with os.fdopen(fd, "wb") as out, urllib.request.urlopen(request, timeout=timeout) as response:
            follow_umask(out.fileno())  # the cache's files readable as the umask says, not mkstemp's 0o600
            length = response.headers.get("Content-Length")
            total = int(length) if length and length.isdigit() else None
            with _bar(total, dest.name, progress) as bar:
                for chunk in iter(lambda: response.read(_CHUNK), b""):
                    out.write(chunk)
                    h.update(chunk)
                    written += len(chunk)
                    bar.update(len(chunk))
        # http.client returns a short body without an error when the server closes early
        if total is not None and written != total:
            raise DownloadError(f"{url}: the connection closed after {written:,} of {total:,} bytes; nothing was "
                                f"written to {dest}. Run the same command again to retry.")
        actual = h.hexdigest()
        if actual != digest:
            raise ChecksumMismatchError(url, dest, algo, digest, actual, written)
        os.replace(tmp, dest)
        return True
    except urllib.error.HTTPError as e:
        raise DownloadError(f"{url}: HTTP {e.code} {e.reason}; nothing was written to {dest}.") from e
    except urllib.error.URLError as e:
        raise DownloadError(f"{url}: cannot connect ({e.reason}); nothing was written to {dest}.") from e
    except (TimeoutError, ConnectionError, http.client.HTTPException) as e:
        raise DownloadError(f"{url}: {type(e).__name__}: {e}; nothing was written to {dest}.") from e
    except OSError as e:  # the destination side: permissions, a full disk
        raise DownloadError(f"{url} -> {dest}: {e}; nothing was written to {dest}.") from e
    finally:
        tmp.unlink(missing_ok=True)  # after os.replace it no longer exists; on any error it goes
