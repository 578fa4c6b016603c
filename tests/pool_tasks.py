"""Top-level (picklable) task functions for the pool tests."""

import os
import signal
import time


def add(a: int, b: int) -> int:
    return a + b


def sleep_then(seconds: float, value: str) -> str:
    time.sleep(seconds)
    return value


def busy_c_loop() -> int:
    # A big-int power runs inside one C call: signals (SIGALRM) are not handled until it
    # returns, which is exactly why the pool kills workers instead.
    return len(str(7 ** 30_000_000))


def allocate(mb: int) -> int:
    return len(bytearray(mb * 1024 * 1024))


def die() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def raise_value_error() -> None:
    raise ValueError("bad thing")


def pid() -> int:
    return os.getpid()
