"""Where evidence lives: a local folder or an S3 prefix, behind one small interface.

Locations are written as URIs so that a worker process (or a Prefect task) can reopen the same
store from a string: ``/var/denpex/incident-7``, ``file:///...`` or ``s3://bucket/prefix``.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from functools import cached_property
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol

from denpex.evidence.errors import DumpError, EvidenceSourceError
from denpex.evidence.files import temporary_name, write_atomic

__all__ = ["StoredObject", "EvidenceStore", "LocalStore", "S3Store", "open_store", "store_for"]


@dataclass(frozen=True, slots=True)
class StoredObject:
    """One object in a store: its name relative to the store's root, size and modification time.

    ``version`` changes whenever the object is written again, even within the second and at the
    same size, where ``modified`` may not (S3 keeps whole seconds): the S3 ETag, or a local file's
    inode and nanosecond mtime (an atomic rewrite is a new inode).
    """

    name: str
    size: int
    modified: datetime | None = None
    version: str | None = None


class EvidenceStore(Protocol):
    """Read and write named blobs under one root."""

    uri: str

    @property
    def reads_wait(self) -> bool:
        """Whether a read waits long enough (on the network) that reading the next object on a
        thread while this one decodes pays off. ``denpex.evidence.read_ahead`` reads inline where
        it does not."""
        ...

    def list(self) -> list[StoredObject]: ...

    def read(self, name: str, *, max_bytes: int) -> bytes: ...

    def write(self, name: str, data: bytes) -> None: ...

    def write_file(self, name: str, path: Path) -> None:
        """Write the file at ``path`` as ``name``, streamed (a dump is never held whole in memory)."""
        ...

    def delete(self, name: str) -> None:
        """Remove ``name``; a name that is not there is no error."""
        ...

    def folder(self, name: str) -> EvidenceStore:
        """The store of the sub-folder ``name``, reached the same way as this one (the same S3
        client, endpoint and credentials: a store given a client must not fall back to defaults)."""
        ...


def _plain_folder_name(name: str) -> str:
    """``name`` if it is a plain relative path (``a`` or ``a/b``); EvidenceSourceError otherwise.

    One rule for every store: S3 keys are literal, so "", "." and "a//b" would name other keys
    than the folder a LocalStore reads for the same name, and a climb or an absolute name leaves
    the store; a control character (NUL) is no name of either."""
    if (name.startswith("/") or any(part in ("", ".", "..") for part in name.split("/"))
            or any(ord(c) < 32 or ord(c) == 127 for c in name)):
        raise EvidenceSourceError(f"folder name {name!r} escapes the store root or is not a plain path")
    return name


class LocalStore:
    """A folder on disk. Only regular files directly in the folder are evidence."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.uri = str(root)

    @cached_property
    def reads_wait(self) -> bool:
        """True on a network filesystem (NFS, Lustre, a FUSE mount...), where dumps often land.

        On a local disk a read of a real dump takes well under a millisecond, and a reader thread
        beside each decode cost the parse workers about 4 ms of CPU a dump (issue 29's scale runs).
        """
        return _on_network_filesystem(self.root)

    def list(self) -> list[StoredObject]:
        try:
            names = sorted(os.listdir(self.root))
        except FileNotFoundError as exc:
            raise EvidenceSourceError(f"{self.root}: no such folder") from exc
        except NotADirectoryError as exc:
            raise EvidenceSourceError(f"{self.root}: not a folder") from exc
        except OSError as exc:
            raise EvidenceSourceError(f"{self.root}: cannot list ({exc.strerror})") from exc
        objects = []
        for name in names:
            path = self.root / name
            try:
                st = path.lstat()
            except OSError:
                continue
            if path.is_file() and not path.is_symlink():
                objects.append(StoredObject(name, st.st_size, datetime.fromtimestamp(st.st_mtime, UTC),
                                            f"{st.st_ino}:{st.st_mtime_ns}"))
        return objects

    def read(self, name: str, *, max_bytes: int) -> bytes:
        path = self._path(name)
        try:
            with path.open("rb") as fh:
                # Sized by the file, not the cap: a read of cap + 1 bytes first allocates the cap.
                size = os.fstat(fh.fileno()).st_size
                data = fh.read(min(size, max_bytes) + 1)
                if len(data) > size:  # it grew since (or a special file): read on, up to the cap
                    data += fh.read(max_bytes + 1 - len(data))  # rare: a copy is fine here
        except OSError as exc:
            raise DumpError(f"cannot read ({exc.strerror or exc})") from exc
        if len(data) > max_bytes:
            raise DumpError(f"larger than the {max_bytes}-byte cap per dump")
        return data

    def write(self, name: str, data: bytes) -> None:
        try:
            write_atomic(self._path(name), data)
        except OSError as exc:
            raise EvidenceSourceError(f"cannot write {self.root / name} ({exc.strerror or exc})") from exc

    def write_file(self, name: str, path: Path) -> None:
        target = self._path(name)
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = temporary_name(target)
        try:
            shutil.copyfile(path, tmp)
            with tmp.open("rb") as fh:
                os.fsync(fh.fileno())
            os.replace(tmp, target)
        except OSError as exc:
            raise EvidenceSourceError(f"cannot write {target} ({exc.strerror or exc})") from exc
        finally:
            tmp.unlink(missing_ok=True)

    def delete(self, name: str) -> None:
        try:
            self._path(name).unlink(missing_ok=True)
        except OSError as exc:
            raise EvidenceSourceError(f"cannot delete {self.root / name} ({exc.strerror or exc})") from exc

    def folder(self, name: str) -> LocalStore:
        path = self.root
        for part in _plain_folder_name(name).split("/"):
            path = path / part
            # As list() skips a linked file: a linked folder, at any depth, may lead out of the store.
            if path.is_symlink():
                raise EvidenceSourceError(f"{path} is a symbolic link, not a folder of the store")
        return LocalStore(path)

    def _path(self, name: str) -> Path:
        if name.startswith("/") or ".." in Path(name).parts:
            raise EvidenceSourceError(f"object name {name!r} escapes the store root")
        return self.root / name


# Filesystem types whose reads wait on a server; any FUSE mount (s3fs, gcsfuse, juicefs) too.
_NETWORK_FILESYSTEMS = frozenset({"nfs", "nfs4", "lustre", "cifs", "smb3", "smbfs", "ceph", "gpfs",
                                  "beegfs", "glusterfs", "9p", "afs", "wekafs", "orangefs", "pvfs2"})


_MOUNTS = Path("/proc/self/mounts")


def _on_network_filesystem(path: Path) -> bool:
    """Whether ``path`` lies on a network filesystem, by its mount in ``/proc/self/mounts``
    (the longest mount point that contains it); False where that cannot be read."""
    try:
        target = os.path.realpath(path)
        mounts = _MOUNTS.read_text()
    except OSError:
        return False
    point_found, kind = "", ""
    for line in mounts.splitlines():
        fields = line.split()
        if len(fields) < 3:
            continue
        point = fields[1].replace("\\040", " ")  # the kernel escapes a space in a mount point
        inside = target == point or target.startswith(point.rstrip("/") + "/")
        if inside and len(point) >= len(point_found):
            point_found, kind = point, fields[2]
    return kind in _NETWORK_FILESYSTEMS or kind.startswith("fuse.")


class S3Store:
    """An S3 prefix (moto in tests). boto3 retries throttling; errors become EvidenceErrors."""

    reads_wait = True  # each read waits on the network and the store's server

    def __init__(self, bucket: str, prefix: str = "", *, client: Any = None,
                 endpoint_url: str | None = None) -> None:
        self.bucket = bucket
        self.prefix = prefix.strip("/")
        self.uri = f"s3://{bucket}/{self.prefix}" if self.prefix else f"s3://{bucket}"
        self._client = client or _s3_client(endpoint_url)

    def _key(self, name: str) -> str:
        return f"{self.prefix}/{name}" if self.prefix else name

    def folder(self, name: str) -> S3Store:
        return S3Store(self.bucket, self._key(_plain_folder_name(name)), client=self._client)

    def list(self) -> list[StoredObject]:
        from botocore.exceptions import BotoCoreError, ClientError

        base = f"{self.prefix}/" if self.prefix else ""
        objects = []
        try:
            for page in self._client.get_paginator("list_objects_v2").paginate(
                Bucket=self.bucket, Prefix=base, Delimiter="/"
            ):
                for item in page.get("Contents", []):
                    name = item["Key"][len(base):]
                    if name:
                        objects.append(StoredObject(name, int(item["Size"]), item.get("LastModified"),
                                                    item.get("ETag")))
        except (ClientError, BotoCoreError) as exc:
            raise EvidenceSourceError(f"{self.uri}: cannot list ({exc})") from exc
        return sorted(objects, key=lambda o: o.name)

    def read(self, name: str, *, max_bytes: int) -> bytes:
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            response = self._client.get_object(Bucket=self.bucket, Key=self._key(name))
            body = response["Body"]
            try:
                if int(response.get("ContentLength", 0)) > max_bytes:
                    raise DumpError(f"larger than the {max_bytes}-byte cap per dump")
                data: bytes = body.read(max_bytes + 1)
            finally:
                body.close()
        except (ClientError, BotoCoreError) as exc:
            raise DumpError(f"cannot read {self.uri}/{name} ({exc})") from exc
        if len(data) > max_bytes:
            raise DumpError(f"larger than the {max_bytes}-byte cap per dump")
        return data

    def write(self, name: str, data: bytes) -> None:
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            self._client.put_object(Bucket=self.bucket, Key=self._key(name), Body=data)
        except (ClientError, BotoCoreError) as exc:
            raise EvidenceSourceError(f"cannot write {self.uri}/{name} ({exc})") from exc

    def write_file(self, name: str, path: Path) -> None:
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            with path.open("rb") as fh:
                # One PUT from the open file (botocore streams it), as write() does from bytes.
                self._client.put_object(Bucket=self.bucket, Key=self._key(name), Body=fh)
        except (ClientError, BotoCoreError, OSError) as exc:
            raise EvidenceSourceError(f"cannot write {self.uri}/{name} ({exc})") from exc

    def delete(self, name: str) -> None:
        from botocore.exceptions import BotoCoreError, ClientError

        try:
            self._client.delete_object(Bucket=self.bucket, Key=self._key(name))
        except (ClientError, BotoCoreError) as exc:
            raise EvidenceSourceError(f"cannot delete {self.uri}/{name} ({exc})") from exc


def _s3_client(endpoint_url: str | None) -> Any:
    import boto3
    from botocore.config import Config

    # Five retries (six attempts) in botocore's standard mode, unless the operator set the
    # environment variables every AWS SDK honours: AWS_MAX_ATTEMPTS (attempts in all, the first
    # included) or AWS_RETRY_MODE. A value given here would override them.
    retries: dict[str, Any] = {}
    if "AWS_MAX_ATTEMPTS" not in os.environ:
        retries["max_attempts"] = 5
    if "AWS_RETRY_MODE" not in os.environ:
        retries["mode"] = "standard"
    config = Config(retries=retries, connect_timeout=10, read_timeout=60)
    return boto3.client("s3", endpoint_url=endpoint_url or os.environ.get("DENPEX_S3_ENDPOINT_URL"),
                        config=config)


def open_store(location: str | Path) -> EvidenceStore:
    """``s3://bucket/prefix`` -> S3Store; a path or ``file://`` URI -> LocalStore."""
    text = str(location)
    if text.startswith("s3://"):
        bucket, _, prefix = text[5:].partition("/")
        if not bucket:
            raise EvidenceSourceError(f"{text}: no bucket in S3 URI")
        return S3Store(bucket, prefix)
    if text.startswith("file://"):
        text = text[7:]
    return LocalStore(Path(text))


def store_for(uri: str, stores: dict[str, EvidenceStore]) -> EvidenceStore:
    """The store at ``uri`` from ``stores``, opened once and kept there: one S3 client and its
    connection pool per store (a client per dump cost about 0.1 s each, ten times the GET itself).
    A store the caller put in ``stores`` is used as given (its own client)."""
    if uri not in stores:
        stores[uri] = open_store(uri)
    return stores[uri]
