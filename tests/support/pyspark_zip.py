"""The suite's venv: Spark's Python processes import its compiled pyspark, not `pyspark.zip`'s sources.

Every Python process a Spark session starts compiles the pyspark modules it imports from
`pyspark.zip` anew (0.8-0.9 s of CPU each; `pyspark_rmqs.spark.pythonpath` says why), and the suite's
~45 sessions start some 350 of them: a run spent ~210 s less machine CPU in them with the `.pth`
that `rmqs spark-archive --compiled-pyspark` installs, which `make setup` installs into the suite's
venv with this module (`python -m tests.support.pyspark_zip`). A venv without it (a pytest run by
hand in a venv made otherwise) is slower and otherwise the same.
"""

from __future__ import annotations

from pyspark_rmqs.spark import pythonpath

if __name__ == "__main__":
    print(pythonpath.install())
