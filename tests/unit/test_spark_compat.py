"""The PySpark internals `pyspark_rmqs.spark.compat` relies on are still there (fails on a PySpark rename)."""

from __future__ import annotations

import ast
import importlib
import inspect

from pyspark_rmqs.spark import compat


def test_pyspark_planning_worker_keeps_the_pushdown_setting_in_the_local_rmqs_reads() -> None:
    module = importlib.import_module(compat.PLANNING_WORKER_MODULE)
    name = next((n for n in compat.PLANNING_FUNCTIONS if hasattr(module, n)), compat.PLANNING_FUNCTION)
    func = getattr(module, name)
    tree = ast.parse(inspect.getsource(func))
    assigned = {
        t.id
        for node in ast.walk(tree)
        if isinstance(node, ast.Assign)
        for t in node.targets
        if isinstance(t, ast.Name)
    }
    assert compat.PUSHDOWN_LOCAL in assigned, (
        f"PySpark's {compat.PLANNING_WORKER_MODULE}.{name} no longer assigns "
        f"'{compat.PUSHDOWN_LOCAL}': update pyspark_rmqs/spark/compat.py"
    )


def test_pushdown_is_read_from_the_planning_frame_and_off_elsewhere() -> None:
    assert compat.pushdown_enabled() is False

    def _main() -> bool:  # stands in for PySpark's planning function
        enable_pushdown = True  # noqa: F841 - read through the frame
        return compat.pushdown_enabled()

    assert _main() is True


def test_pyspark_still_rebuilds_accumulators_by_id_as_run_metrics_expect() -> None:
    from pyspark import accumulators

    fn = getattr(accumulators, "_deserialize_accumulator", None)
    assert fn is not None, "pyspark.accumulators._deserialize_accumulator is gone: update spark/compat.py"
    assert list(inspect.signature(fn).parameters) == ["aid", "zero_value", "accum_param"]
    acc = compat.task_accumulator(987_654, 0, accumulators.INT_ACCUMULATOR_PARAM)
    acc.add(3)
    assert accumulators._accumulatorRegistry[987_654]._value == 3
    del accumulators._accumulatorRegistry[987_654]
