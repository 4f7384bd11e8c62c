"""The tools' child processes (daemons under benchmark or attack, capture taps): how one
is stopped, so that none outlives the tool that started it."""

from __future__ import annotations

import signal
import subprocess
from typing import Any

__all__ = ["stop_process"]


def stop_process(proc: subprocess.Popen[Any], timeout: float) -> None:
    """SIGTERM, wait up to ``timeout`` seconds, then SIGKILL: the child is gone when this
    returns, and its stdout pipe, if it has one, is closed."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    if proc.stdout is not None:
        proc.stdout.close()
