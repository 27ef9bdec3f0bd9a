"""Hash routing agrees with the Java stream client: the same murmur3 (Apache Commons Codec's
`MurmurHash3.hash32x86`, seed 104729, UTF-8 key, unsigned remainder), computed by Spark's JVM."""

from __future__ import annotations

import pytest
from pyspark.sql import SparkSession

from pyspark_rmqs.broker.writer import HASH_SEED, hash_partition

pytestmark = pytest.mark.spark


def test_hash_partition_matches_the_java_client_for_1000_keys(spark: SparkSession) -> None:
    jvm = spark.sparkContext._jvm  # type: ignore[attr-defined]
    murmur = jvm.org.apache.commons.codec.digest.MurmurHash3
    keys = [f"customer-{i}" for i in range(990)] + [
        "",
        "é",
        "日本",
        "k" * 300,
        "a b",
        "0",
        "1",
        "2",
        "x/y",
        "🙂",
    ]
    for key in keys:
        raw = key.encode("utf-8")
        java_hash = murmur.hash32x86(bytearray(raw), 0, len(raw), HASH_SEED)
        for partitions in (2, 3, 7):
            assert hash_partition(key, partitions) == (java_hash & 0xFFFFFFFF) % partitions, key
