"""Live capture (``jetdump -i IFACE``): dumpcap or tcpdump writes a capture to a pipe that
jetdump reads as it grows.

dumpcap (Wireshark's capture engine) is preferred, tcpdump is the fallback. SIGINT and
SIGTERM stop the capture program, which flushes and closes the pipe, so the frames seen
so far are decoded and the statistics printed before jetdump exits.
"""

from __future__ import annotations

import shutil
import signal
import subprocess
import threading
from types import FrameType
from typing import IO
from typing import Any
from typing import Optional

from .events import InputError

DEFAULT_CAPTURE_FILTER = "tcp"


def capture_command(interface: str, capture_filter: str, count: Optional[int]) -> list[str]:
    """The dumpcap (or tcpdump) command writing a capture of ``interface`` to stdout.

    Raises:
        InputError: if neither dumpcap nor tcpdump is installed.
    """
    dumpcap = shutil.which("dumpcap")
    if dumpcap is not None:
        command = [dumpcap, "-i", interface, "-w", "-", "-f", capture_filter]
        return command + (["-c", str(count)] if count is not None else [])
    tcpdump = shutil.which("tcpdump")
    if tcpdump is not None:
        command = [tcpdump, "-i", interface, "-U", "-w", "-", "-s", "0"]
        return command + (["-c", str(count)] if count is not None else []) + [capture_filter]
    raise InputError("-i: live capture needs dumpcap (Debian package wireshark-common or tshark) "
                     "or tcpdump; neither is installed")


class LiveCapture:
    """A running capture program; :attr:`stdout` is its capture stream.

    Its stderr lines are passed on to ``stderr`` prefixed with the program's name
    (dumpcap says "Capturing on 'lo'" once it is ready, and its counts at the end).
    """

    def __init__(self, interface: str, capture_filter: str, count: Optional[int], stderr: IO[str]) -> None:
        command = capture_command(interface, capture_filter, count)
        self.name = command[0].rsplit("/", 1)[-1]
        self.stderr = stderr
        self.messages: list[str] = []
        try:
            self.process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                            stdin=subprocess.DEVNULL)
        except OSError as exc:
            raise InputError(f"-i: cannot run {command[0]}: {exc.strerror or exc}") from None
        assert self.process.stdout is not None
        self.stdout: IO[bytes] = self.process.stdout
        self._relay = threading.Thread(target=self._relay_stderr, daemon=True)
        self._relay.start()
        self._previous: dict[int, Any] = {}

    def _relay_stderr(self) -> None:
        assert self.process.stderr is not None
        for raw in self.process.stderr:
            line = raw.decode("utf-8", "replace").rstrip().rsplit("\r", 1)[-1]  # progress counters
            if line:
                self.messages.append(line)
                self.stderr.write(f"{self.name}: {line}\n")
                self.stderr.flush()

    def stop(self, signum: int = 0, frame: Optional[FrameType] = None) -> None:
        """Ask the capture program to finish (it flushes and closes the pipe)."""
        if self.process.poll() is None:
            self.process.terminate()

    def install_signals(self) -> None:
        for sig in (signal.SIGINT, signal.SIGTERM):
            self._previous[sig] = signal.signal(sig, self.stop)

    def close(self) -> Optional[str]:
        """Wait for the program; an error message if it failed before capturing."""
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self.stop()
        try:
            code = self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            code = self.process.wait()
        self._relay.join(timeout=2)
        self.stdout.close()
        if code not in (0, -signal.SIGTERM, -signal.SIGINT) and code != 128 + signal.SIGTERM:
            detail = self.messages[-1] if self.messages else f"exit status {code}"
            return f"-i: {self.name} failed: {detail}"
        return None
