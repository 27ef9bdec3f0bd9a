"""A call run on a thread of its own, its exception kept: how tests run a task they will kill."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any


def start_capturing(fn: Callable[[], Any]) -> tuple[threading.Thread, list[BaseException]]:
    """Start `fn()` on a daemon thread; the list receives what it raised (empty if it returned)."""
    failure: list[BaseException] = []

    def run() -> None:
        try:
            fn()
        except BaseException as e:
            failure.append(e)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, failure
