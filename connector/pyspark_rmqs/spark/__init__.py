"""The Spark Data Source classes: the only modules here that import pyspark at module level.

Never imports the run protocol (`runs/`), which sits above it (the layers contract).

A PySpark older than rmqs supports fails here, on import of any of them, naming the version it
needs and why (`pyspark_rmqs.core.versions`); `pyspark_rmqs.DefaultSource` turns that into a data
source that says so when used, so that PySpark's lookup of every `pyspark_*` module still loads
the session's other Python data sources. The version is read from the installed distribution's
metadata, not by importing pyspark: `jvm` and `pythonpath` import none.
"""

from pyspark_rmqs.core.versions import PYSPARK, require

require(PYSPARK)
