"""The Spark Data Source classes: the only modules here that import pyspark at module level.

Never imports the run protocol (`runs/`), which sits above it (the layers contract).
"""
