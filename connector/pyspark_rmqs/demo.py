"""`python -m pyspark_rmqs.demo`: the end-to-end demo, kept at the path `make demo` used to run.

The code is `pyspark_rmqs.cli.demo` (`rmqs demo` and `make demo` run it there). Run through runpy,
not imported, so importing this module does nothing and nothing in rmqs depends on it.
"""

from __future__ import annotations

import runpy

if __name__ == "__main__":
    runpy.run_module("pyspark_rmqs.cli.demo", run_name="__main__", alter_sys=True)
