"""The core: messages, Arrow and offsets as values. No I/O: never talks to the broker, never imports pyspark.

errors (the taxonomy), schema (source and sink columns), codec (AMQP 1.0 <-> values), chunks (chunk
entries both ways), batches (Arrow <-> messages), offsets (offset math), target (a stream or a
super stream), redact (secrets out of text), extensions (the Protocols users implement), progress
(lag from a streaming query's progress).
"""
