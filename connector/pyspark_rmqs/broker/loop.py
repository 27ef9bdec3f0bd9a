"""One asyncio loop thread per process: the sync facade's engine.

Spark's Python workers fork; a loop thread does not survive a fork, so the loop is keyed by PID
and rebuilt in a child. The thread is a daemon: nothing that matters waits on it at exit.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

from pyspark_rmqs.core.errors import BrokerTimeoutError

R = TypeVar("R")

_lock = threading.Lock()
_loop: asyncio.AbstractEventLoop | None = None
_pid: int | None = None


def get_loop() -> asyncio.AbstractEventLoop:
    """The process's loop thread, started on first use (and again after a fork)."""
    global _loop, _pid
    with _lock:
        if _loop is None or _pid != os.getpid() or not _loop.is_running():
            loop = asyncio.new_event_loop()
            started = threading.Event()

            def _run() -> None:
                asyncio.set_event_loop(loop)
                loop.call_soon(started.set)
                loop.run_forever()

            threading.Thread(target=_run, name="rmqs-broker-loop", daemon=True).start()
            started.wait()
            _loop, _pid = loop, os.getpid()
        return _loop


def run_sync(coro: Coroutine[Any, Any, R], timeout: float | None = None, what: str = "broker call") -> R:
    """Run `coro` on the loop thread and wait for it; a timeout cancels it there too."""
    loop = get_loop()
    if _in_loop_thread(loop):
        coro.close()
        raise RuntimeError("run_sync called from the broker loop thread: await the coroutine instead")
    fut = asyncio.run_coroutine_threadsafe(coro, loop)
    try:
        return fut.result(timeout)
    except concurrent.futures.TimeoutError as e:
        if fut.done():  # the coroutine's own TimeoutError (a BrokerTimeoutError, say): keep it
            raise
        fut.cancel()
        raise BrokerTimeoutError(f"{what} did not finish within {timeout} s") from e


def _in_loop_thread(loop: asyncio.AbstractEventLoop) -> bool:
    try:
        return asyncio.get_running_loop() is loop
    except RuntimeError:
        return False
