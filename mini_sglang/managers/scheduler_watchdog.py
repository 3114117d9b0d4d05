"""--watchdog-timeout: SGLang's scheduler watchdog. A daemon thread in each scheduler process
watches the forward counter; if a batch is in progress and no forward has started for
watchdog_timeout seconds (a hung kernel, a collective waiting on a dead rank, a deadlock),
it logs "Watchdog timeout", dumps every thread's stack and signals the server (SIGQUIT to
the parent), which tears everything down, instead of leaving clients waiting forever.
"""

from __future__ import annotations

import faulthandler
import logging
import os
import signal
import sys
import threading
import time
from typing import Any

logger = logging.getLogger("mini_sglang")


def start_watchdog(scheduler: Any, timeout: float, parent_pid: int) -> threading.Thread:
    """Watch `scheduler` (its cur_batch and its profiler's forward_ct) from a daemon thread."""
    profiler = scheduler.profiler

    def watch() -> None:
        last_ct, last_time = profiler.forward_ct, time.perf_counter()
        while True:
            time.sleep(timeout / 2)
            now = time.perf_counter()
            if scheduler.cur_batch is None or profiler.forward_ct != last_ct:
                last_ct, last_time = profiler.forward_ct, now
            elif now - last_time > timeout:
                break
        logger.error("Watchdog timeout (self.watchdog_timeout=%s)", timeout)
        faulthandler.dump_traceback(file=sys.stderr, all_threads=True)
        sys.stderr.flush()
        os.kill(parent_pid, signal.SIGQUIT)

    thread = threading.Thread(target=watch, name="scheduler-watchdog", daemon=True)
    thread.start()
    return thread
