"""The Spark Data Source classes: the only modules here that import pyspark at module level."""
