"""The run protocol's own state: one record per run, a lease per consumer name, stream identities.

A run's state used to be scattered (per-partition stored offsets, a companion plan, output-side
commit records, a token that knew neither the stream's incarnation nor the partition set). This
package keeps it in one place in the broker (docs/failure-semantics.md, "The run record"):

- `lease`: a run holds its consumer name while it runs (the broker's single-active-consumer
  group on the records stream); a second run fails before it reads, not after its sink ran.
- `record`: the run record, written before reading and moved through its states
  (planned -> delivered -> committed -> stored); a retry resumes the whole record.
- `incarnation`: an identity per partition stream that a deleted and re-created stream cannot share.
- `producer`: a produce run with a producer name holds the name's lease while it sends, and numbers
  its messages from its identity's record, so a retry adds only what its failed try did not store.

Metadata only: nothing here reads user messages or imports pyspark.
"""
