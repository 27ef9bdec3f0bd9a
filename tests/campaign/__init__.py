"""The protocol campaign: generated sequences of user operations and faults against the real broker.

Three rounds of manual review each found new silent data losses in the watermark run protocol
(`pyspark_rmqs.runs`); this package generates the sequences a reviewer would have to imagine. A
`hypothesis.stateful` machine (`machine.py`) publishes, runs consumers through the public Airflow
operator, injects sink failures and crashes, deletes and re-creates streams and binds partitions,
while a reference model (`model.py`) says what every consumer's output must hold; the invariants
(`invariants.py`) are checked after every step. README.md says how to run it.
"""
