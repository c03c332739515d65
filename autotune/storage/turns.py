"""The worker's connections, handed to its threads in the order they asked.

A worker holds one connection per node group it drives and never more
(:func:`autotune.storage.db.engine_kwargs`); its loop and its lease heartbeats share them.
SQLAlchemy's pool is not fair: a thread that returns the connection and asks again at once
takes it back before a waiting thread wakes up, so a loop of back-to-back transactions (a
repair of many dead trials, a tight test loop) could keep a heartbeat waiting until its
lease ran out, or the pool's 300 s timeout. :class:`Turns` queues the threads first, so the
pool never has a waiter: each transaction or Optuna call takes a turn, first come first
served. A thread that holds a turn and asks again (an Optuna call inside a transaction)
goes on at once.

>>> turns = Turns(1)
>>> with turns.take():
...     with turns.take():  # the same thread again
...         turns.free
0
>>> turns.free
1
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["Turns"]


class Turns:
    """``slots`` turns at a time, granted in the order asked (FIFO), re-entrant per thread."""

    def __init__(self, slots: int) -> None:
        self.free = slots
        self._cond = threading.Condition()
        self._queue: deque[object] = deque()
        self._depth: dict[int, int] = {}

    @contextmanager
    def take(self) -> Iterator[None]:
        me = threading.get_ident()
        with self._cond:
            if me in self._depth:
                self._depth[me] += 1
            else:
                ticket = object()
                self._queue.append(ticket)
                while self._queue[0] is not ticket or self.free == 0:
                    self._cond.wait()
                self._queue.popleft()
                self.free -= 1
                self._depth[me] = 1
                self._cond.notify_all()  # the next in the queue may take another slot
        try:
            yield
        finally:
            with self._cond:
                self._depth[me] -= 1
                if self._depth[me] == 0:
                    del self._depth[me]
                    self.free += 1
                    self._cond.notify_all()
