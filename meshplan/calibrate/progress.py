"""Progress on stderr: a bar on a terminal, one line per step otherwise (logs, CI)."""

from __future__ import annotations

import sys
import time


class Progress:
    def __init__(self, total: int, *, enabled: bool = True, stream=None):
        self.total = max(1, total)
        self.done = 0
        self.enabled = enabled
        self.stream = stream or sys.stderr
        self.t0 = time.perf_counter()
        self.tty = hasattr(self.stream, "isatty") and self.stream.isatty()

    def step(self, message: str) -> None:
        self.done = min(self.total, self.done + 1)
        if not self.enabled:
            return
        frac = self.done / self.total
        elapsed = time.perf_counter() - self.t0
        if self.tty:
            bar = "#" * int(30 * frac) + "-" * (30 - int(30 * frac))
            self.stream.write(f"\r[{bar}] {self.done}/{self.total} {elapsed:5.1f}s {message[:60]:<60}")
            if self.done == self.total:
                self.stream.write("\n")
        else:
            self.stream.write(f"[{self.done:3d}/{self.total}] {elapsed:6.1f}s {message}\n")
        self.stream.flush()

    def drop(self, steps: int) -> None:
        """``steps`` counted in the total will not run (layer rounds stopped by
        ``--time-budget``): the bar ends at its true end."""
        self.total = max(1, self.done, self.total - steps)

    def note(self, message: str) -> None:
        if self.enabled:
            self.stream.write(("\n" if self.tty else "") + message + "\n")
            self.stream.flush()


def _step(progress, message: str) -> None:
    if progress is not None:
        progress.step(message)


def _note(progress, message: str) -> None:
    if progress is not None:
        progress.note(message)
