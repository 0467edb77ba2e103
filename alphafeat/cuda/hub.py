"""The GPU hub: worker processes hand their blocks to the parent's GPU owners through shared memory.

``precompute --device cuda`` runs its segments on the CPU path's workers (this process or
joblib's processes): each decodes and builds its book in blocks, stores the book columns and
computes the labels and the write, as on the CPU; only the features go to the GPU. The GPU
owners (:class:`alphafeat.cuda.owner.Owners`, one thread per device holding its CUDA context)
live in the parent, in a :class:`Hub`, which serves the workers over a Unix socket
(:mod:`multiprocessing.connection`, an authentication key per run):

* a worker's :class:`HubStream` opens a stream for its segment (``open``: the feature
  parameters, the result rows it wants, the book's levels, the segment's name); the hub gives it
  :data:`SLOTS` *slots*, shared memory (:mod:`alphafeat.cuda.slots`: a block's input
  columns and its result rows) made by the hub and page-locked once in the owner's context, so
  the device copies from and to them directly;
* the worker fills a slot with the feature inputs of its next rows (the halo row first, as to
  :meth:`alphafeat.cuda.owner.OwnerStream.push`) and sends ``push`` (slot, rows, halo); it fills
  the next slot meanwhile; the hub answers ``done`` (or one error line) when the slot's results
  are in it; the worker copies out the stored features and reuses the slot.

Slots are pooled by shape and per owner (a closed stream's are the next one's): host and device
memory are bounded by the streams open at once, not by the number of segments. Blocks on the GPU
side are :data:`HUB_ROWS` rows, larger than the workers' book blocks (fewer launches, fuller grids).
This module imports no CUDA at import time: the workers import only :class:`HubStream`.
Slots are anonymous shared memory (``memfd_create``) whose descriptors go to the workers over
the socket: nothing is left behind, however the run ends.
Measured: docs/performance.md, "--device cuda", the GPU hub.
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
import threading
from collections.abc import Callable, Sequence
from multiprocessing.connection import Client, Listener
from multiprocessing.reduction import recv_handle, send_handle

import numpy as np

from alphafeat.cuda import slots as sl
from alphafeat.errors import AlphafeatError
from alphafeat.validation import env_count

__all__ = ["HUB_ROWS", "SLOTS", "Hub", "HubStream"]

log = logging.getLogger(__name__)

#: New rows of one block on the GPU side (a slot's capacity: 23 MB at ten levels); 64 Ki ran
#: 16 sessions faster than 128 Ki with a third less slot and GPU memory (docs/performance.md,
#: "--device cuda", 2026-12-07); ``ALPHAFEAT_GPU_ROWS`` (read by the hub, in the parent)
#: overrides it for measurements.
HUB_ROWS = 1 << 16
#: Slots per stream: the worker fills one while the device computes the other;
#: ``ALPHAFEAT_GPU_SLOTS`` (read by the hub) overrides it for measurements.
SLOTS = 2


def hub_rows() -> int:
    """:data:`HUB_ROWS`, or ``ALPHAFEAT_GPU_ROWS`` where set (a positive integer)."""
    return env_count("ALPHAFEAT_GPU_ROWS", HUB_ROWS)


def hub_slots() -> int:
    """:data:`SLOTS`, or ``ALPHAFEAT_GPU_SLOTS`` where set (a positive integer)."""
    return env_count("ALPHAFEAT_GPU_SLOTS", SLOTS)


class _Slot:
    """One slot made by the hub: its file, mapping, numpy views and page lock."""

    def __init__(self, levels: int, k: int, rows: int, pin: Callable[[np.ndarray], object]) -> None:
        _, nbytes = sl.layout(levels, k, rows)
        self.nbytes, self.rows = nbytes, rows
        self.fd, self.mm = sl.create("alphafeat-gpu-slot", nbytes)
        self.buf = np.frombuffer(self.mm, np.uint8)
        self.cols, self.out = sl.views(self.mm, levels, k, rows)
        self.lock = pin(self.buf)  # page-locked while the slot lives

    def close(self) -> None:
        """Unlocked and its descriptor closed (the memory goes with the last mapping)."""
        self.lock = None
        os.close(self.fd)


class Hub:
    """The parent's side: the GPU owners of ``devices`` and the socket the workers connect to.

    Parameters
    ----------
    devices : sequence of int
        CUDA device ids (:func:`alphafeat.cuda.owner.parse_devices`): one owner each.
    rows : int
        New rows of one block on the GPU (:func:`hub_rows` by default).

    :attr:`address` (picklable: socket path and key) is what a worker's :class:`HubStream`
    needs. :meth:`close` (or the ``with`` block's end) stops the server and the owners and
    removes the slot files. :attr:`slots_made` counts the slots made so far.
    """

    def __init__(self, devices: Sequence[int], rows: int | None = None, warm: tuple | None = None) -> None:
        from alphafeat.cuda.owner import Owners

        self.rows = hub_rows() if rows is None else max(1, int(rows))
        self.n_slots = hub_slots()
        self.owners = Owners(devices, self.rows)
        self._key = os.urandom(16)
        # the socket in a folder of its own, removed by close (multiprocessing's default folder
        # is removed only by its exit handler, which a command's quick end skips)
        self._dir = tempfile.mkdtemp(prefix="alphafeat-hub-")
        self._listener = Listener(os.path.join(self._dir, "socket"), family="AF_UNIX", authkey=self._key)
        self.address = (self._listener.address, self._key)
        self._free: dict[tuple, list[_Slot]] = {}
        self._all: list[_Slot] = []
        self._plans: dict[str, object] = {}
        self._lock = threading.Lock()
        self._closing = False
        self._conns: list[threading.Thread] = []
        self._thread = threading.Thread(target=self._accept, name="gpu-hub", daemon=True)
        self._thread.start()
        self._warming = threading.Thread(target=self._warm, args=warm or (), name="gpu-hub-warm", daemon=True)
        self._warming.start()

    def _warm(self, params: object = None, levels: int = 0, k: int = 0, streams: int = 0) -> None:
        """Beside the caller's work (the run's plan): each owner's CUDA context, its kernels
        loaded and its buffers made by a block of two rows, and ``streams`` streams' slots for
        books of ``levels`` levels and ``k`` result rows made and page-locked, spread over the
        owners as streams are. Nothing without ``params``; a failure here is left to the streams."""
        if params is None:
            return
        try:
            plan = self._plan(params)
            for o in self.owners.owners:
                o.warm(plan, levels, list(range(k)))
            owners = self.owners.owners
            made = [self._slot(owners[i % len(owners)], levels, k)
                    for i in range(streams) for _ in range(self.n_slots)]  # fmt: skip
            with self._lock:
                for i, s in enumerate(made):
                    self._free.setdefault((id(owners[i // self.n_slots % len(owners)]), levels, k), []).append(s)
        except Exception as e:  # noqa: BLE001  (the streams meet it again, and report it)
            log.debug("gpu hub: warm-up failed (%s)", e)

    @property
    def slots_made(self) -> int:
        return len(self._all)

    def __enter__(self) -> Hub:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Stop accepting, wait for the open streams' threads, stop the owners, remove the socket
        and the slots."""
        if self._closing:
            return
        self._closing = True
        self._warming.join()
        try:  # wake the accepting thread
            Client(self._listener.address, family="AF_UNIX", authkey=self._key).close()
        except OSError:
            pass
        self._thread.join()
        self._listener.close()
        shutil.rmtree(self._dir, ignore_errors=True)
        for t in list(self._conns):
            t.join()
        self.owners.close()
        self._report()
        for s in self._all:
            s.close()
        self._all.clear()
        self._free.clear()

    def _report(self) -> None:
        """The owners' :attr:`~alphafeat.cuda.owner.Owner.stats` (and the slots made) as a debug
        log line, and appended as a JSON line to the file ``ALPHAFEAT_GPU_STATS`` names, if set
        (for the benches)."""
        stats = {"rows_per_block": self.rows, "slots": len(self._all),
                 "owners": [{k: round(v, 3) for k, v in o.stats.items()} for o in self.owners.owners]}  # fmt: skip
        log.debug("gpu hub: %s", stats)
        path = os.environ.get("ALPHAFEAT_GPU_STATS")
        if path:
            import json

            with open(path, "a") as fh:
                fh.write(json.dumps(stats) + "\n")

    # -- server threads ----------------------------------------------------------------------

    def _accept(self) -> None:
        while True:
            try:
                conn = self._listener.accept()
            except (OSError, EOFError) as e:  # a client that failed the key, or the listener closed
                if self._closing:
                    return
                log.debug("gpu hub: a connection refused (%s)", e)
                continue
            if self._closing:
                conn.close()
                return
            t = threading.Thread(target=self._serve, args=(conn,), name="gpu-hub-conn", daemon=True)
            self._conns.append(t)
            t.start()

    def _plan(self, params: object) -> object:
        """One plan per distinct feature parameters (the owners' buffers are made per plan)."""
        from alphafeat.features.registry import make_plan

        key = repr(params)
        with self._lock:
            if key not in self._plans:
                self._plans[key] = make_plan(params)
            return self._plans[key]

    def _slot(self, owner: object, levels: int, k: int) -> _Slot:
        key = (id(owner), levels, k)
        with self._lock:
            free = self._free.setdefault(key, [])
            if free:
                return free.pop()
        s = _Slot(levels, k, self.rows, lambda buf: owner.call(owner.pin, buf))
        with self._lock:
            self._all.append(s)
        return s

    def _serve(self, conn: object) -> None:
        """One stream: ``open``, then ``push`` and ``close`` messages (see the module docstring)."""
        from alphafeat.cuda.owner import oom_line

        send_lock = threading.Lock()

        def send(msg: tuple) -> None:
            with send_lock:
                try:
                    conn.send(msg)
                except (OSError, ValueError):  # the worker is gone
                    pass

        stream, got, key = None, [], None
        try:
            _, params, select, levels, where = conn.recv()
            self._warming.join()  # its slots are in the pool
            try:
                stream = self.owners.open(self._plan(params), where, select)
                key = (stream.owner, int(levels), len(select))
                got = [self._slot(stream.owner, int(levels), len(select)) for _ in range(self.n_slots)]
            except Exception as e:  # noqa: BLE001  (one line to the worker)
                send(("error", _picklable(oom_line(e, where, self.rows))))
                return
            with send_lock:  # each slot's descriptor after the message (SCM_RIGHTS on the socket)
                conn.send(("slots", [s.nbytes for s in got], self.rows))
                for s in got:
                    send_handle(conn, s.fd, 0)
            while True:
                msg = conn.recv()
                if msg[0] != "push":
                    break
                _, i, n, halo = msg
                try:
                    fut = stream.submit(got[i].cols, got[i].out, n, halo)
                except Exception as e:  # noqa: BLE001
                    send(("error", _picklable(e)))
                    continue

                def done(f: object, i: int = i, m: int = n - halo) -> None:
                    e = f.exception()
                    send(("done", i) if e is None else ("error", _picklable(oom_line(e, where, m))))

                fut.add_done_callback(done)
        except (EOFError, OSError):
            pass
        finally:
            if stream is not None:
                stream.close()  # after its blocks: the owner's call waits for those in flight
            if got:
                with self._lock:
                    self._free.setdefault((id(key[0]), *key[1:]), []).extend(got)
            conn.close()


def _picklable(e: BaseException) -> BaseException:
    """``e`` where the worker can unpickle it (the project's errors), else an AlphafeatError line."""
    return e if isinstance(e, AlphafeatError) else AlphafeatError(f"--device cuda: {type(e).__name__}: {e}")


class HubStream:
    """A worker's side of one segment's stream through a :class:`Hub` (``address``: its
    :attr:`Hub.address`).

    :meth:`add` takes the segment's feature-input rows in order (columns of
    :func:`alphafeat.features.inputs.prepare`, any number of rows a call), fills the slots and
    sends each full one; ``store(out, k0, k1)`` is called (on the calling thread, from
    :meth:`add` or :meth:`finish`) with the results of rows ``[k0, k1)`` of the segment
    (``out``: float64 ``(len(select), k1 - k0)``, valid during the call), in row order.
    :meth:`finish` sends the last rows and waits for every result; :meth:`close` ends the stream.
    ``AlphafeatError`` as the hub sends it (a GPU out of memory: one line naming ``where``).
    """

    def __init__(self, address: tuple[str, bytes], params: object, select: Sequence[int], where: str,
                 store: Callable[[np.ndarray, int, int], None]) -> None:  # fmt: skip
        self.address, self.params, self.select, self.where = address, params, tuple(select), where
        self.store = store
        self.conn = None
        self.slots: list[tuple[object, dict[str, np.ndarray], np.ndarray]] = []
        self.rows = 0  # new rows per slot
        self.cur, self.fill, self.halo = 0, 0, False
        self.sent = 0  # rows sent so far
        self.halo_row: dict[str, np.ndarray] | None = None  # the last input row sent (the next block's halo)
        self.pending: dict[int, tuple[int, int]] = {}  # slot -> (k0, k1) in flight

    def _open(self, levels: int) -> None:
        self.conn = Client(self.address[0], family="AF_UNIX", authkey=self.address[1])
        self.conn.send(("open", self.params, self.select, levels, self.where))
        msg = self.conn.recv()
        if msg[0] == "error":
            raise msg[1]
        _, sizes, self.rows = msg
        for nbytes in sizes:
            mm = sl.attach(recv_handle(self.conn), nbytes)
            self.slots.append((mm, *sl.views(mm, levels, len(self.select), self.rows)))

    def add(self, cols: dict[str, np.ndarray], lo: int = 0) -> None:
        """The segment's next rows: ``cols``'s rows from ``lo`` on."""
        n = int(cols["ts_recv"].shape[0])
        if self.conn is None:
            self._open(int(cols["bid_px"].shape[1]))
        i = lo
        while i < n:
            if self.fill == 0:
                self._start_slot()
            dst = self.slots[self.cur][1]
            take = min(n - i, self.rows + self.halo - self.fill)
            for k in sl.IN_COLS:
                dst[k][self.fill : self.fill + take] = cols[k][i : i + take]
            self.fill += take
            i += take
            if self.fill == self.rows + self.halo:
                self._send()

    def _start_slot(self) -> None:
        """The current slot free (its last results stored) and, after the first block, led by
        the last row sent (the halo)."""
        self._wait(self.cur)
        self.halo = self.halo_row is not None
        if self.halo:
            dst = self.slots[self.cur][1]
            for k in sl.IN_COLS:
                dst[k][0] = self.halo_row[k]
            self.fill = 1

    def _send(self) -> None:
        m = self.fill - self.halo
        src = self.slots[self.cur][1]  # kept: the results come back over the slot's inputs
        self.halo_row = {k: src[k][self.fill - 1].copy() for k in sl.IN_COLS}
        self.conn.send(("push", self.cur, self.fill, self.halo))
        self.pending[self.cur] = (self.sent, self.sent + m)
        self.sent += m
        self.cur, self.fill = (self.cur + 1) % len(self.slots), 0

    def _wait(self, slot: int) -> None:
        """Until ``slot`` has no block in flight, storing the results that come back."""
        while slot in self.pending:
            msg = self.conn.recv()
            if msg[0] == "error":
                raise msg[1]
            j = msg[1]
            k0, k1 = self.pending.pop(j)
            self.store(self.slots[j][2][:, : k1 - k0], k0, k1)

    def finish(self) -> None:
        """Send the rows still in a slot and store every result."""
        if self.conn is None:
            return
        if self.fill > self.halo:
            self._send()
        for j in range(len(self.slots)):
            self._wait(j)

    def close(self) -> None:
        """End the stream (the hub takes its slots back); idempotent."""
        if self.conn is not None:
            try:
                self.conn.send(("close",))
            except OSError:
                pass
            self.conn.close()
            self.conn = None
        self.slots = []  # unmapped with their last view
        self.store = None  # its closure holds the segment's columns
