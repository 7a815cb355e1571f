"""Rank 0's progress rendering (pycyxwiz/_progress.py): a live bar on a terminal, plain lines in a
log. The events are those DistributedTrainer.fit reports; here they are built by hand."""

import io
from types import SimpleNamespace

from pycyxwiz._core.distributed import _ProgressEvent
from pycyxwiz._progress import ProgressPrinter

K = _ProgressEvent.Kind


class Terminal(io.StringIO):
    def isatty(self):
        return True


def batch(i, n=4, acc=0.5):
    return SimpleNamespace(kind=K.BATCH, epoch=1, epochs=2, batch=i, batches=n, loss=1.0 / i, accuracy=acc,
                           has_accuracy=True, samples_per_second=12345.0, seconds=0.1 * i)


END = SimpleNamespace(kind=K.EPOCH_END, epoch=1, epochs=2, batch=4, batches=4, loss=0.25, accuracy=0.75,
                      has_accuracy=True, has_validation=True, val_loss=0.5, val_accuracy=0.625,
                      samples_per_second=2000.0, seconds=1.5)


def test_terminal_gets_one_live_bar_per_epoch():
    out = Terminal()
    printer = ProgressPrinter(out)
    for i in range(1, 5):
        printer(batch(i))
    printer(END)
    text = out.getvalue()
    lines = text.split("\n")
    assert text.count("\r") == 4, repr(text)  # every batch redraws the same line
    assert "[" + "=" * 24 + "] 4/4" in lines[0], repr(lines[0])
    assert lines[1] == ("Epoch 1/2 - loss 0.2500 - acc 0.7500 - val_loss 0.5000 - val_acc 0.6250"
                        " - 2,000 samples/s - 1.5s"), lines[1]


def test_log_gets_plain_lines_and_no_control_characters():
    out = io.StringIO()
    printer = ProgressPrinter(out)
    printer(batch(2))
    printer(SimpleNamespace(kind=K.MESSAGE, text="checkpoint saved: ckpt/checkpoint_epoch_0001.ckpt"))
    printer(END)
    text = out.getvalue()
    assert "\r" not in text and "\033" not in text, repr(text)
    assert text.splitlines() == [
        "Epoch 1/2 batch 2/4 - loss 0.5000 - acc 0.5000 - 12,345 samples/s",
        "checkpoint saved: ckpt/checkpoint_epoch_0001.ckpt",
        "Epoch 1/2 - loss 0.2500 - acc 0.7500 - val_loss 0.5000 - val_acc 0.6250 - 2,000 samples/s - 1.5s",
    ]


def test_regression_losses_print_no_accuracy():
    out = io.StringIO()
    ProgressPrinter(out)(SimpleNamespace(**{**vars(END), "has_accuracy": False, "has_validation": False,
                                            "accuracy": float("nan")}))
    assert out.getvalue() == "Epoch 1/2 - loss 0.2500 - 2,000 samples/s - 1.5s\n"
