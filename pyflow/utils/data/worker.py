"""DataLoader workers as threads: ``num_workers > 0`` makes batches ahead of the training loop.

Why threads, where PyTorch uses processes:

* the data is numpy arrays and pyflow tensors in **one** process; a thread hands a batch
  over by reference, a process would have to pickle it (or put it in shared memory);
* numpy releases the GIL in its copies and arithmetic, and a pyflow op only *issues* a VM
  instruction (the VM's own threads run it), so threads overlap loading with training;
* processes need a start method (fork is unsafe once the VM's threads run, spawn must
  re-import pyflow and pickle the dataset) and separate RNGs; threads need neither.
The price: Python code in ``__getitem__`` still takes turns on the GIL, and the dataset is
*shared*, so its ``__getitem__`` must be safe to call from several threads at once.

How one iterator works (``ThreadedIter``; the main thread is the one running the ``for``):

1. It starts ``num_workers`` threads named ``pyflow-dataloader-worker-<id>``, each bound to
   the caller's rank context (its VM), each with its own task queue.
2. The main thread draws batch ``b``'s indices from the batch sampler and sends ``(b, indices)``
   to worker ``b % num_workers``; at most ``prefetch_factor * num_workers`` batches are sent and
   not yet returned (bounded memory: back pressure on the workers).
3. A worker fetches ``dataset[i]`` for the indices, collates, and puts ``(b, batch)`` on the one
   result queue, or ``(b, failure)`` if anything raised: it never dies silently.
4. The main thread returns batches in order ``0, 1, 2, ...`` (a dict holds early arrivals),
   so the batches and their order are those of ``num_workers=0``.  A failure is raised when
   its batch's turn comes, as the same exception type (PyTorch's rule), naming the worker,
   the batch index and the sample indices, with the original as ``__cause__``.
5. ``close()`` (also on exhaustion, on an error, on ``del`` / garbage collection, and so
   when a ``for`` loop breaks) tells the workers to stop and joins them: each finishes the
   batch in hand.  After a ``timeout`` or Ctrl-C it does not wait (a worker may be stuck).

While waiting, the main thread wakes every ``POLL_S`` seconds to check its workers live (a
worker that vanished without a word is reported, not waited for forever).

``get_worker_info()`` inside a worker returns its ``WorkerInfo`` (id, num_workers, a seed,
the dataset), ``None`` on the main thread, as in PyTorch.  Worker threads share the rank's
global random generator, so random draws in ``__getitem__`` interleave in thread order: seed
a private ``numpy.random.default_rng((info.seed, index))`` per sample for reproducible
augmentation.
"""

from __future__ import annotations

import dataclasses
import queue
import threading
import time

from pyflow import env
from pyflow.errors import PyflowError

__all__ = ["WorkerInfo", "get_worker_info", "ThreadedIter", "DataLoaderTimeoutError", "POLL_S", "THREAD_NAME"]

POLL_S = 0.5                                 # how often a waiting main thread checks that its workers live
THREAD_NAME = "pyflow-dataloader-worker-{}"

_local = threading.local()   # .info: the WorkerInfo of the worker running on this thread


class DataLoaderTimeoutError(PyflowError, RuntimeError):
    """No batch came from the workers within the loader's ``timeout`` (PyTorch raises a RuntimeError)."""


@dataclasses.dataclass(frozen=True)
class WorkerInfo:
    """What a worker knows about itself (``torch.utils.data.get_worker_info()``)."""

    id: int            # 0 .. num_workers - 1
    num_workers: int
    seed: int          # the iterator's base seed + id (the base seed is drawn once per epoch)
    dataset: object


def get_worker_info() -> WorkerInfo | None:
    """The calling worker thread's ``WorkerInfo``, or ``None`` outside a DataLoader worker."""
    return getattr(_local, "info", None)


@dataclasses.dataclass
class _Failure:
    """An exception a worker caught, with where it happened (batch_index None: in ``worker_init_fn``)."""

    worker_id: int
    batch_index: int | None
    indices: object
    error: BaseException


class _KeyErrorMessage(str):
    """A KeyError prints ``repr`` of its message; this message prints as written (PyTorch does the same)."""

    def __repr__(self) -> str:
        return str(self)


def _worker_loop(info: WorkerInfo, fetch, init_fn, ctx, tasks: queue.SimpleQueue, results: queue.SimpleQueue,
                 done: threading.Event) -> None:
    """One worker thread: run tasks until ``None`` or ``done``.  Holds no reference to the iterator, so the
    iterator can be garbage collected (and so close its workers) while they run."""
    with env.bound(ctx):
        _local.info = info
        try:
            if init_fn is not None:
                try:
                    init_fn(info.id)
                except BaseException as error:   # noqa: BLE001 - reported to the main thread, never lost
                    results.put((None, _Failure(info.id, None, None, error)))
                    return
            while not done.is_set():
                task = tasks.get()
                if task is None or done.is_set():
                    return
                batch_index, indices = task
                try:
                    result = fetch(indices)
                except BaseException as error:   # noqa: BLE001 - reported to the main thread, never lost
                    result = _Failure(info.id, batch_index, indices, error)
                results.put((batch_index, result))
                del task, indices, result   # hold no batch while waiting for the next task
        finally:
            _local.info = None


def _exception_for(failure: _Failure) -> BaseException:
    """The exception the main thread raises for a worker's ``failure``: the same type when it can be built
    from one message (so ``except KeyError`` still works), else ``RuntimeError``."""
    error = failure.error
    name = THREAD_NAME.format(failure.worker_id)
    where = ("in worker_init_fn" if failure.batch_index is None
             else f"while making batch {failure.batch_index} (sample indices {failure.indices})")
    message = (f"Caught {type(error).__name__} in DataLoader worker {failure.worker_id} (thread {name}) {where}: "
               f"{error}")
    exc = None
    if isinstance(error, Exception):
        try:
            exc = type(error)(_KeyErrorMessage(message) if isinstance(error, KeyError) else message)
        except Exception:   # noqa: BLE001 - a constructor that wants other arguments
            exc = None
    if exc is None:
        exc = RuntimeError(message)
    try:
        exc.worker_id, exc.batch_index = failure.worker_id, failure.batch_index
    except AttributeError:   # an exception type without a __dict__: the message says it all
        pass
    exc.__cause__ = error
    return exc


class ThreadedIter:
    """One epoch of a DataLoader with ``num_workers`` worker threads (the plan in this module's docstring).

    ``fetch(indices)`` makes one batch (dataset reads + collate); ``index_sampler`` yields each batch's
    indices.  ``len(iterator)`` is ``length`` (the loader's ``len``).
    """

    def __init__(self, fetch, index_sampler, dataset, *, num_workers: int, prefetch_factor: int,
                 timeout: float, worker_init_fn, base_seed: int, length=None):
        self._length = length
        self._num_workers = num_workers
        self._max_outstanding = prefetch_factor * num_workers
        self._timeout = timeout
        self._sampler_iter = iter(index_sampler)
        self._sampler_done = False
        self._sent = 0           # batches sent to workers so far (the next batch index to send)
        self._next_index = 0     # the batch the user gets next
        self._reorder: dict = {}   # batch index -> batch (or _Failure) that arrived early
        self._closed = False
        self._done = threading.Event()
        self._results: queue.SimpleQueue = queue.SimpleQueue()
        self._tasks = [queue.SimpleQueue() for _ in range(num_workers)]
        ctx = env.current()
        self._workers = [
            threading.Thread(target=_worker_loop, name=THREAD_NAME.format(i), daemon=True,
                             args=(WorkerInfo(i, num_workers, base_seed + i, dataset), fetch, worker_init_fn,
                                   ctx, self._tasks[i], self._results, self._done))
            for i in range(num_workers)]
        for worker in self._workers:
            worker.start()
        try:
            self._send_tasks()
        except BaseException:
            self.close()
            raise

    def __iter__(self) -> "ThreadedIter":
        return self

    def __len__(self) -> int:
        if self._length is None:
            raise TypeError("this DataLoader iterator has no len()")
        return self._length

    def _send_tasks(self) -> None:
        """Send batches until ``max_outstanding`` are in flight or the sampler is exhausted."""
        while not self._sampler_done and self._sent - self._next_index < self._max_outstanding:
            try:
                indices = next(self._sampler_iter)
            except StopIteration:
                self._sampler_done = True
                return
            self._tasks[self._sent % self._num_workers].put((self._sent, indices))
            self._sent += 1

    def __next__(self):
        if self._closed:
            raise StopIteration
        try:
            self._send_tasks()
            while self._next_index not in self._reorder:
                if self._next_index >= self._sent:   # nothing in flight and the sampler is exhausted
                    self.close()
                    raise StopIteration
                batch_index, result = self._receive()
                if batch_index is None:   # worker_init_fn failed: that worker will make nothing
                    raise _exception_for(result)
                self._reorder[batch_index] = result
            result = self._reorder.pop(self._next_index)
            self._next_index += 1
            if isinstance(result, _Failure):
                raise _exception_for(result)
            self._send_tasks()
            return result
        except StopIteration:
            raise
        except (KeyboardInterrupt, DataLoaderTimeoutError):
            self.close(join=False)   # a worker may be stuck: do not wait for it
            raise
        except BaseException:
            self.close()
            raise

    def _receive(self) -> tuple:
        """The next ``(batch_index, result)`` from any worker; raises if one vanished or ``timeout`` passed."""
        deadline = time.monotonic() + self._timeout if self._timeout > 0 else None
        while True:
            wait = POLL_S if deadline is None else max(0.0, min(POLL_S, deadline - time.monotonic()))
            try:
                return self._results.get(timeout=wait)
            except queue.Empty:
                pass
            dead = [w.name for w in self._workers if not w.is_alive()]
            if dead:
                try:
                    return self._results.get_nowait()   # a worker's last words, put before it ended
                except queue.Empty:
                    raise RuntimeError(f"DataLoader worker thread(s) {', '.join(dead)} exited unexpectedly "
                                       f"while batch {self._next_index} was awaited") from None
            if deadline is not None and time.monotonic() >= deadline:
                worker = self._next_index % self._num_workers
                raise DataLoaderTimeoutError(f"DataLoader timed out after {self._timeout} seconds waiting for batch "
                                   f"{self._next_index} from worker {worker} (thread {THREAD_NAME.format(worker)})")

    def close(self, join: bool = True) -> None:
        """Stop the workers (each finishes the batch in hand) and, with ``join``, wait until they have ended.
        Batches made but not taken are dropped.  Idempotent; the iterator then yields nothing more."""
        if self._closed:
            return
        self._closed = True
        self._done.set()
        for tasks in self._tasks:
            tasks.put(None)
        if join:
            me = threading.current_thread()
            for worker in self._workers:
                if worker is not me:
                    worker.join()
        self._reorder.clear()

    def __del__(self):
        if getattr(self, "_workers", None) is not None:   # (a failed __init__ may leave nothing to close)
            try:
                self.close()
            except Exception:   # noqa: BLE001 - at interpreter exit the modules may be gone
                pass
