"""Consumer lag from a streaming query's progress (Python sources cannot report custom metrics)."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any


def _offsets(v: Any) -> dict[str, int]:
    if v is None:
        return {}
    if isinstance(v, str):
        v = json.loads(v) if v.strip() else {}
    if not isinstance(v, Mapping):
        return {}
    return {str(k): int(x) for k, x in v.items() if isinstance(x, int) and not isinstance(x, bool)}


def lag_from_progress(progress: Mapping[str, Any] | Any) -> list[dict[str, Any]]:
    """Per source of `query.lastProgress`: min / max / avg offsets behind latest, and per partition.

    Lag of a partition stream = `latestOffset - endOffset` (messages published but not yet in a
    micro-batch). Sources that report no latest offset are skipped.
    """
    if progress is None:
        return []
    if not isinstance(progress, Mapping):
        progress = json.loads(progress.json) if hasattr(progress, "json") else dict(progress)
    out: list[dict[str, Any]] = []
    for src in progress.get("sources", []):
        latest = _offsets(src.get("latestOffset"))
        end = _offsets(src.get("endOffset"))
        if not latest:
            continue
        behind = {s: max(0, latest[s] - end.get(s, 0)) for s in latest}
        values = list(behind.values())
        out.append(
            {
                "description": src.get("description"),
                "minOffsetsBehindLatest": min(values),
                "maxOffsetsBehindLatest": max(values),
                "avgOffsetsBehindLatest": sum(values) / len(values),
                "offsetsBehindLatest": behind,
            }
        )
    return out
