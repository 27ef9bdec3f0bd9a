"""Apache Iceberg as a Spark-free sink (pyiceberg): one atomic append per run, keyed by its token.

A run appends every range's rows in one transaction whose snapshots carry the run's token in their
summary (`rmqs.token`, with the consumer and ranges). Before writing, the sink looks for that token
in the table's snapshots, and in the table property `rmqs.last-run.<consumer hash>` the same commit
sets (it outlives `expire_snapshots`): a replayed range (the run died after the commit, before the
watermark store) is recognised from the table itself and not appended again. Data files written by a run that
died before its commit are never referenced by a snapshot, so readers never see them (Iceberg's
orphan-file cleanup removes them).

Committed ranges are recognised per partition range too (`committed_spans`), not only by the exact
token, as the Parquet commits are: a run that committed and then died before its record said
`delivered`, whose record cannot be resumed (a partition deleted and created again meanwhile: its
marker no longer matches), is followed by a run planned anew from the old watermark whose ranges
overlap what the table holds. Only the rest is appended (the campaign found 15 messages appended
twice). Each snapshot names its consumer and the streams' incarnations for that; snapshots written
before they did are recognised by their exact token only.

The table is created from the source schema on first use. Memory stays bounded: rows are buffered
up to `flush_rows` and appended to the open transaction, never collected per range.
`pip install "rmqs[iceberg]"` brings pyiceberg with its SQL catalog; any pyiceberg catalog works.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from pyspark_rmqs.core.errors import ConfigurationError
from pyspark_rmqs.runs.incarnation import UNMARKED
from pyspark_rmqs.runs.incarnation import same as same_incarnation
from pyspark_rmqs.runs.outputs.delivery import RunToken, merged_spans

if TYPE_CHECKING:
    import pyarrow as pa

log = logging.getLogger(__name__)

TOKEN_PROPERTY = "rmqs.token"
RANGES_PROPERTY = "rmqs.ranges"
CONSUMER_PROPERTY = "rmqs.consumer"
INCARNATIONS_PROPERTY = "rmqs.incarnations"


def last_run_property(consumer: str | None) -> str:
    """The table property holding the token of `consumer`'s last committed run."""
    digest = hashlib.sha256((consumer or "").encode()).hexdigest()[:16]
    return f"rmqs.last-run.{digest}"


class IcebergSink:
    """Appends a run's batches to an Iceberg table in one transaction tagged with the run's token."""

    def __init__(
        self,
        table: str,
        catalog: Mapping[str, str] | None = None,
        *,
        catalog_name: str = "rmqs",
        flush_rows: int = 200_000,
    ) -> None:
        try:
            from pyiceberg.catalog import load_catalog
        except ImportError as e:  # pragma: no cover - the extra is installed in the tests
            raise ConfigurationError(
                "output_format='iceberg' needs pyiceberg: pip install 'rmqs[iceberg]'"
            ) from e
        if "." not in table:
            raise ConfigurationError(f"output table must be '<namespace>.<table>'; got {table!r}")
        self.identifier = table
        props = dict(catalog or {})
        # A SQL catalog keys its tables by the catalog's name: the name is part of its configuration.
        self.catalog = load_catalog(props.pop("name", catalog_name), **props)
        self.flush_rows = flush_rows
        self.uri = f"iceberg:{table}"
        self.outputs: list[str] = []
        self._table: Any = None
        self._tx: Any = None
        self._buffer: list[pa.RecordBatch] = []
        self._buffered = 0
        self._token: RunToken | None = None

    # -- the run: checked before reading, committed after every range -------------------------

    def committed(self, token: RunToken) -> bool:
        """Whether the table already holds `token`'s run (a replayed, committed range): a snapshot
        carries it, or the table property of its consumer's last run names it (which outlives
        `expire_snapshots`)."""
        table = self._load(create=False)
        if table is None:
            return False
        if table.metadata.properties.get(last_run_property(token.consumer)) == token.value:
            return True
        return any(
            (s.summary is not None and s.summary.additional_properties.get(TOKEN_PROPERTY) == token.value)
            for s in table.metadata.snapshots
        )

    def committed_spans(self, token: RunToken) -> dict[str, list[tuple[int, int]]]:
        """Per stream, the spans of `token`'s ranges that committed runs of its consumer appended to
        the table (on the same stream incarnation), merged."""
        table = self._load(create=False)
        if table is None:
            return {}
        found: dict[str, list[tuple[int, int]]] = {}
        for snap in table.metadata.snapshots:
            props = snap.summary.additional_properties if snap.summary is not None else {}
            if CONSUMER_PROPERTY not in props or props[CONSUMER_PROPERTY] != (token.consumer or ""):
                continue
            incarnations = json.loads(props.get(INCARNATIONS_PROPERTY) or "{}")
            for stream, (a, b) in json.loads(props.get(RANGES_PROPERTY) or "{}").items():
                if stream not in token.ranges:
                    continue
                ours = int(token.incarnations.get(stream) or UNMARKED)
                if not same_incarnation(int(incarnations.get(stream) or UNMARKED), ours):
                    continue
                lo, hi = token.ranges[stream]
                if max(lo, a) < min(hi, b):
                    found.setdefault(stream, []).append((max(lo, a), min(hi, b)))
        return {stream: merged_spans(spans) for stream, spans in found.items()}

    def begin_run(self, token: RunToken) -> None:
        self._token = token

    def commit_run(self) -> None:
        """Commit the run's transaction (every range at once); nothing to do for an empty run."""
        if self._tx is not None:
            self._flush()
            assert self._token is not None
            # In the same commit as the data: the consumer's last run, kept in the table's metadata.
            self._tx.set_properties({last_run_property(self._token.consumer): self._token.value})
            self._tx.commit_transaction()
            self._tx = None
            self.outputs.append(self.identifier)

    # -- the ranges ------------------------------------------------------------------------------

    def open(self, stream: str, start: int, end: int, schema: pa.Schema) -> None:
        if self._tx is None:
            table = self._load(create=True, schema=schema)
            self._tx = table.transaction()

    def write(self, batch: pa.RecordBatch) -> None:
        self._buffer.append(batch)
        self._buffered += batch.num_rows
        if self._buffered >= self.flush_rows:
            self._flush()

    def close(self) -> None:
        self._flush()

    def abort(self) -> None:
        self._buffer, self._buffered, self._tx = [], 0, None  # nothing committed: no snapshot refers to it

    def _flush(self) -> None:
        import pyarrow as pa

        if not self._buffer:
            return
        assert self._tx is not None and self._token is not None
        props = {
            TOKEN_PROPERTY: self._token.value,
            RANGES_PROPERTY: json.dumps(self._token.to_dict()["ranges"], sort_keys=True),
            CONSUMER_PROPERTY: self._token.consumer or "",
            INCARNATIONS_PROPERTY: json.dumps(dict(self._token.incarnations), sort_keys=True),
        }
        self._tx.append(pa.Table.from_batches(self._buffer), snapshot_properties=props)
        self._buffer, self._buffered = [], 0

    def _load(self, *, create: bool, schema: pa.Schema | None = None) -> Any:
        from pyiceberg.exceptions import NamespaceAlreadyExistsError, NoSuchTableError

        if self._table is not None:
            self._table.refresh()
            return self._table
        try:
            self._table = self.catalog.load_table(self.identifier)
        except NoSuchTableError:
            if not create:
                return None
            namespace = self.identifier.rsplit(".", 1)[0]
            try:
                self.catalog.create_namespace(namespace)
            except NamespaceAlreadyExistsError:
                pass
            log.info("creating Iceberg table %s from the source schema", self.identifier)
            self._table = self.catalog.create_table(self.identifier, schema=schema)
        return self._table
