"""Where a Spark-free run writes files: a local folder or an object store, as one pyarrow FileSystem.

Exactly-once into files needs two things of the place it writes (`delivery.py`): that a file
appears whole or not at all, and that a commit record written last can be read back. A local
folder gets both from a rename. An object store (S3 and anything speaking its API) has no rename,
but every object appears whole when its upload completes (a single PUT, or a multipart upload's
completion): an object written straight to its final, range-keyed name is either there complete or
not there, and a process killed mid-upload leaves nothing a reader can list. So on an object store
a run uploads each object under a name of its own try (`.<name>.<uuid>.tmp`), copies it server-side
to its final name when complete (an aborted writer's upload still completes on close, and must
not land on a final name another try of the run committed), then writes its commit record (one
object: the manifest of the run's objects); readers that must never see an uncommitted run read
through the manifests (`committed.py`).

The file system comes from, in this order: an explicit `filesystem` (a `pyarrow.fs.FileSystem`
or an fsspec file system, e.g. `s3fs.S3FileSystem`), `storage_options` (fsspec options for the
URI's scheme, as pandas and Dask take them: `{"key", "secret", "endpoint_url", ...}`; needs
`rmqs[s3]` for `s3://`), else pyarrow's own file system for the URI (for `s3://`: the AWS
environment and configuration chain, `AWS_ENDPOINT_URL` included).

Storage options hold credentials: they are never part of a message, a log line or a summary;
`storage_secrets` names them for the edges' redaction.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from pyspark_rmqs.core.errors import ConfigurationError

# Parts of fsspec / s3fs / adlfs / gcsfs option names that hold credentials (compared without case
# or `_`); an access key id is masked too: it names the account.
_SECRET_KEYS = ("secret", "token", "password", "key", "credential", "sas", "accountkey", "privatekey")


@dataclass(frozen=True)
class Location:
    """A folder of a file system: `fs` and the path of the folder in it (`base`, no trailing `/`)."""

    fs: Any  # pyarrow.fs.FileSystem
    base: str
    # The folder as the user named it (a path or a URI without credentials): for messages and XCom.
    uri: str
    # A local (or mounted) file system: renames are atomic there; on an object store they are copies.
    local: bool

    def path(self, relative: str) -> str:
        """The file system path of `relative` (a `/`-separated path under the folder)."""
        return f"{self.base}/{relative}" if self.base else relative

    def uri_of(self, relative: str) -> str:
        """`relative` as a URI (or local path) a user can open: `s3://bucket/orders/x.parquet`."""
        return f"{self.uri.rstrip('/')}/{relative}"

    def relative(self, path: str) -> str:
        """The inverse of `path`."""
        prefix = f"{self.base}/" if self.base else ""
        return path[len(prefix) :] if path.startswith(prefix) else path


def fsspec_of(fs: Any) -> Any:
    """The fsspec file system a pyarrow file system wraps (`storage_options`, an fsspec `filesystem`),
    else None. Calls through it are one request each where pyarrow's `FSSpecHandler` first asks
    whether the path is a file or a folder (on S3 a HEAD and, for what is absent, a listing)."""
    from pyarrow import fs as pafs

    if isinstance(fs, pafs.PyFileSystem) and isinstance(fs.handler, pafs.FSSpecHandler):
        return fs.handler.fs
    return None


def list_folder(inner: Any, path: str) -> list[dict[str, Any]]:
    """The entries directly in `path` of the fsspec file system `inner` (files and folders, as
    fsspec's detailed listing gives them; [] when absent), fresh: one listing request.

    Not `ls`: s3fs's `ls` of an empty or absent prefix lists its parent next, to tell an object
    of that name from nothing (the parent of `_spark_metadata/` is the output: every file of it,
    a request per 1,000), and caches listings another process makes stale. s3fs's own one-prefix
    listing (`_lsdir`) is that one request; other file systems are listed by `ls`."""
    try:
        if hasattr(inner, "_lsdir") and getattr(inner, "async_impl", False):
            from fsspec.asyn import sync

            return list(sync(inner.loop, inner._lsdir, path.rstrip("/"), refresh=True))
        return list(inner.ls(path, detail=True, refresh=True))
    except FileNotFoundError:
        return []


def move_file(fs: Any, src: str, dst: str) -> None:
    """`src` to `dst` on `fs`: a rename where the file system has one, else a copy, then the
    delete (never absent from both). Through fsspec, `cp_file` and `rm_file`: fsspec's `mv`, which
    pyarrow's handler calls, expands both paths as folders first (on S3 three listings and three
    HEADs around the one copy and delete)."""
    inner = fsspec_of(fs)
    if inner is None:
        fs.move(src, dst)
        return
    inner.cp_file(src, dst)
    inner.rm_file(src)


def is_remote(uri: str) -> bool:
    """Whether `uri` names a file system other than the local one (`s3://`, `gs://`, ...)."""
    scheme = uri.partition("://")[0] if "://" in uri else ""
    return bool(scheme) and scheme != "file"


def locate(
    uri: str,
    *,
    filesystem: Any = None,
    storage_options: Mapping[str, Any] | None = None,
) -> Location:
    """The folder `uri` on its file system (see the module docstring for which one is used)."""
    from pyarrow import fs as pafs

    if filesystem is not None and storage_options:
        raise ConfigurationError("give 'filesystem' or 'storage_options', not both")
    if not is_remote(uri) and filesystem is None and not storage_options:
        folder = os.path.abspath(uri.removeprefix("file://").removeprefix("file:"))
        return Location(pafs.LocalFileSystem(), folder.rstrip("/"), folder, True)
    scheme, _, rest = uri.partition("://")
    if filesystem is not None:
        fs = _as_pyarrow(filesystem)
        path = rest if "://" in uri else uri
    elif storage_options:
        fs = _fsspec(scheme, storage_options)
        path = rest
    else:
        try:
            fs, path = pafs.FileSystem.from_uri(uri)
        except (OSError, ValueError) as e:  # pyarrow's message may quote the URI: secrets masked
            from pyspark_rmqs.core.redact import redact_text

            query = uri.partition("?")[2]
            hidden = [v for part in query.split("&") if (v := part.partition("=")[2])]
            raise ConfigurationError(
                f"output_path {_shown(uri)!r}: pyarrow has no file system for it "
                f"({redact_text(str(e), hidden)}); give storage_options (fsspec) or a filesystem"
            ) from None
    return Location(fs, path.rstrip("/"), _shown(uri), isinstance(fs, pafs.LocalFileSystem))


def _as_pyarrow(filesystem: Any) -> Any:
    """A pyarrow FileSystem as it is; an fsspec file system wrapped in pyarrow's handler."""
    from pyarrow import fs as pafs

    if isinstance(filesystem, pafs.FileSystem):
        return filesystem
    try:
        import fsspec
    except ImportError:  # pragma: no cover - pyarrow or fsspec is how a file system is given
        fsspec = None
    if fsspec is not None and isinstance(filesystem, fsspec.AbstractFileSystem):
        return pafs.PyFileSystem(pafs.FSSpecHandler(filesystem))
    raise ConfigurationError(
        "filesystem must be a pyarrow.fs.FileSystem or an fsspec file system; "
        f"got {type(filesystem).__name__}"
    )


def _fsspec(scheme: str, storage_options: Mapping[str, Any]) -> Any:
    from pyarrow import fs as pafs

    try:
        import fsspec

        impl = fsspec.get_filesystem_class(scheme)
    except ImportError as e:
        extra = " (pip install 'rmqs[s3]')" if scheme in ("s3", "s3a") else ""
        raise ConfigurationError(
            f"storage_options for '{scheme}://' need fsspec's '{scheme}' file system{extra}: {e.msg}"
        ) from None
    except ValueError:
        raise ConfigurationError(
            f"storage_options: fsspec knows no file system for '{scheme}://'; valid: a scheme fsspec "
            "supports (s3, gcs, abfs, ...)"
        ) from None
    try:
        # A fresh instance: fsspec caches instances by their options, and a cached one outlives a
        # credential rotation the caller made.
        fs = impl(**dict(storage_options), skip_instance_cache=True)
    except TypeError as e:
        bad = re.findall(r"'(\w+)'", str(e))
        raise ConfigurationError(
            f"storage_options for '{scheme}://': {impl.__name__} does not take {bad or 'these options'}; "
            f"given: {sorted(storage_options)}"
        ) from None
    _share_botocore_data(fs)
    return pafs.PyFileSystem(pafs.FSSpecHandler(fs))


_loaders: dict[Any, Any] = {}  # botocore's data loaders, per data path: read-only once loaded


def _share_botocore_data(fs: Any) -> None:
    """Give a fresh s3fs instance a botocore session whose data loader (the S3 API's model and
    endpoint rules, JSON botocore parses per session) is shared with the earlier ones.

    An s3fs instance makes its own session, and its first request creates the client from it: 100
    to 400 ms of parsing on a busy 2-core machine, paid by every `locate` (each run, each
    `committed_files`), more than all of the call's requests on a loopback store. The session
    itself stays new, so credentials are resolved afresh (a rotation is seen), as before; only
    the parsed API data, the same for every session, is reused."""
    if type(fs).__module__.partition(".")[0] != "s3fs" or getattr(fs, "session", True) is not None:
        return  # not s3fs, or a session the caller gave
    try:
        from aiobotocore.session import AioSession
        from botocore.loaders import create_loader
    except ImportError:  # pragma: no cover - s3fs depends on both
        return
    session = AioSession(**getattr(fs, "kwargs", {}))
    path = session.get_config_variable("data_path")
    loader = _loaders.get(path)
    if loader is None:
        loader = _loaders.setdefault(path, create_loader(path))
    session.register_component("data_loader", loader)
    fs.session = session


def _shown(uri: str) -> str:
    """`uri` without user-info (an `s3://KEY:SECRET@bucket` form) and without its query (pyarrow
    takes `?access_key=...&secret_key=...` there): what messages, summaries and file names show."""
    from pyspark_rmqs.core.redact import redact_uri

    uri = uri.split("?", 1)[0]
    return redact_uri(uri) if "://" in uri else uri


def storage_secrets(storage_options: Mapping[str, Any] | None) -> list[str]:
    """The credential values in fsspec storage options (nested `client_kwargs` included): what an
    edge (an Airflow task, a Dagster run) masks in any message it passes on."""
    found: list[str] = []

    def walk(options: Mapping[str, Any]) -> None:
        for k, v in options.items():
            if isinstance(v, Mapping):
                walk(v)
            elif v is not None and _secret_key(str(k)):
                found.append(str(v))

    walk(storage_options or {})
    return [s for s in dict.fromkeys(found) if len(s) >= 4]


def _secret_key(key: str) -> bool:
    k = re.sub(r"[._-]", "", key.lower())
    return any(part in k for part in _SECRET_KEYS)


def without_secrets(storage_options: Mapping[str, Any] | None) -> dict[str, Any]:
    """`storage_options` as they may be shown: credential values masked."""
    out: dict[str, Any] = {}
    for k, v in (storage_options or {}).items():
        if isinstance(v, Mapping):
            out[k] = without_secrets(v)
        else:
            out[k] = "***" if _secret_key(str(k)) else v
    return out


def s3_storage_options(
    *,
    key: str | None = None,
    secret: str | None = None,
    token: str | None = None,
    endpoint_url: str | None = None,
    region_name: str | None = None,
    extra: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """fsspec (s3fs) storage options from S3 credentials and an endpoint, `extra` merged last.

    The one mapping the Airflow connection (`airflow_rmqs.storage`) and the Dagster resource
    (`dagster_rmqs.ObjectStoreResource`) share.
    """
    options: dict[str, Any] = {}
    for name, value in (("key", key), ("secret", secret), ("token", token), ("endpoint_url", endpoint_url)):
        if value:
            options[name] = value
    if region_name:
        options["client_kwargs"] = {"region_name": region_name}
    options.update(extra or {})
    return options


def iceberg_s3_properties(options: Mapping[str, Any]) -> dict[str, str]:
    """pyiceberg FileIO properties (`s3.access-key-id`, ...) for the same S3 credentials and endpoint
    as fsspec storage `options`: an Iceberg warehouse on that store."""
    names = {"key": "s3.access-key-id", "secret": "s3.secret-access-key", "token": "s3.session-token"}
    props = {names[k]: str(v) for k, v in options.items() if k in names and v}
    if options.get("endpoint_url"):
        props["s3.endpoint"] = str(options["endpoint_url"])
    region = (options.get("client_kwargs") or {}).get("region_name")
    if region:
        props["s3.region"] = str(region)
    return props
