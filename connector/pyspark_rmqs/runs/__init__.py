"""The run protocol: watermark runs for Airflow, Dagster and the CLI, and their state in the broker.

The order a run follows is in one module, `steps`: plan_read -> run_read (read -> sink -> commit)
-> finish_run (record delivered -> store the watermarks -> record stored). Beside it, how each step
is done: `plan` (a run's range: positions now, or the unfinished record resumed whole, which is how
a retry finds its range), `spark_io` (Spark's side), `summary` (RunSummary), `drain` (AvailableNow),
`consume` and `produce` (without Spark), `watermarks`, and `outputs/` (exactly-once files, Iceberg,
object stores, reading committed files).

A run's state used to be scattered (per-partition stored offsets, a companion plan, output-side
commit records, a token that knew neither the stream's incarnation nor the partition set). It is
kept in one place in the broker (docs/failure-semantics.md, "The run record"):

- `lease`: a run holds its consumer name while it runs (the broker's single-active-consumer
  group on the records stream); a second run fails before it reads, not after its sink ran.
- `record`: the run record, written before reading and moved through its states
  (planned -> delivered -> committed -> stored); a retry resumes the whole record.
- `incarnation`: an identity per partition stream that a deleted and re-created stream cannot share.
- `producer`: a produce run with a producer name holds the name's lease while it sends, and numbers
  its messages from its identity's record, so a retry adds only what its failed try did not store.

pyspark is imported only inside the Spark-running functions (`spark_io`, `drain`, `steps.run_read`).
"""
