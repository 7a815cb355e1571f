"""Rank 0's training progress: a live bar on a terminal, plain lines in a log file or pipe.

Batch lines show rank 0's running loss and accuracy (no collective per batch); the epoch line shows
the values reduced over all ranks, which is what the history records.

DistributedTrainer.fit (C++) reports events; this module only renders them.
"""

from __future__ import annotations

import math
import sys
from typing import TextIO


def _metrics(loss: float, accuracy: float, has_accuracy: bool, prefix: str = "") -> str:
    text = f"{prefix}loss {loss:.4f}"
    if has_accuracy and not math.isnan(accuracy):
        text += f" - {prefix}acc {accuracy:.4f}"
    return text


class ProgressPrinter:
    """Called with each progress event of fit(); writes to `stream` (default sys.stdout)."""

    def __init__(self, stream: TextIO | None = None, width: int = 24):
        self._stream = stream
        self._width = width
        self._bar_open = False

    @property
    def stream(self) -> TextIO:
        return self._stream if self._stream is not None else sys.stdout

    def _live(self) -> bool:
        try:
            return self.stream.isatty()
        except (AttributeError, ValueError):
            return False

    def _write(self, text: str) -> None:
        self.stream.write(text)
        self.stream.flush()

    def _end_bar(self) -> None:
        if self._bar_open:
            self._write("\n")
            self._bar_open = False

    def __call__(self, event) -> None:
        from ._core.distributed import _ProgressEvent

        kind = _ProgressEvent.Kind
        if event.kind == kind.MESSAGE:
            self._end_bar()
            self._write(f"{event.text}\n")
        elif event.kind == kind.BATCH:
            metrics = _metrics(event.loss, event.accuracy, event.has_accuracy)
            speed = f"{event.samples_per_second:,.0f} samples/s"
            if self._live():
                done = int(self._width * event.batch / max(event.batches, 1))
                bar = "=" * done + ">" * (done < self._width) + "." * (self._width - done - 1)
                self._write(f"\rEpoch {event.epoch}/{event.epochs} [{bar[:self._width]}] "
                            f"{event.batch}/{event.batches} - {metrics} - {speed}\033[K")
                self._bar_open = True
            else:
                self._write(f"Epoch {event.epoch}/{event.epochs} batch {event.batch}/{event.batches} - "
                            f"{metrics} - {speed}\n")
        elif event.kind == kind.EPOCH_END:
            self._end_bar()
            line = (f"Epoch {event.epoch}/{event.epochs} - "
                    f"{_metrics(event.loss, event.accuracy, event.has_accuracy)}")
            if event.has_validation:
                line += " - " + _metrics(event.val_loss, event.val_accuracy, event.has_accuracy, "val_")
            line += f" - {event.samples_per_second:,.0f} samples/s - {event.seconds:.3g}s"
            self._write(line + "\n")
