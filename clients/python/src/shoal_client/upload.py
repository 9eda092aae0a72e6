"""`Client.upload`: rows sent over `parallel` concurrent `Ingest` streams,
exactly once, resumable after the process dies at any moment.

The same contract as `shoalctl ingest` (docs/ingest.md): rows are cut into
batches of `batch_size` in order; batch `b` goes to stream `b % parallel`,
which is its own source (`NAME:s/PARALLEL@BATCH_SIZEp`) and sends its
batches with offsets 1, 2, 3... Every shard records each source's offset
in the same transaction as the batch and skips an offset at or below it.
So a run killed and started again with the same arguments asks
`GetOffsets` where each stream stands and sends only what follows. The
plan (parallel, batch size) is in the source names: a run with another
plan, whose batches would not line up with the recorded offsets, is
refused instead of skipping rows it never sent.
"""

from __future__ import annotations

import queue
import re
import threading
import time
from collections import deque
from dataclasses import dataclass
from typing import Any, Callable, Deque, Dict, Iterator, List, Optional, Sequence

import grpc
import numpy as np

from . import _wire
from .errors import InvalidArgument, ShoalError, from_rpc_error
from .types import UploadResult

# Codes that say the batch or the collection is wrong, or the cluster has
# no room for it: sending it again gets the same answer.
_FINAL = {
    grpc.StatusCode.INVALID_ARGUMENT,
    grpc.StatusCode.NOT_FOUND,
    grpc.StatusCode.ALREADY_EXISTS,
    grpc.StatusCode.PERMISSION_DENIED,
    grpc.StatusCode.UNAUTHENTICATED,
    grpc.StatusCode.OUT_OF_RANGE,
    grpc.StatusCode.RESOURCE_EXHAUSTED,
}

_SOURCE = re.compile(r"^(?P<parallel>\d+)@(?P<batch>.+)$")


@dataclass
class Plan:
    source: str
    parallel: int
    batch_size: int

    def stream_source(self, s: int) -> str:
        return f"{self.source}:{s}/{self.parallel}@{self.batch_size}p"

    def batches_of(self, s: int, n_batches: int) -> range:
        """The batches stream `s` sends, in order (offset = position + 1)."""
        return range(s, n_batches, self.parallel)

    def resume_from(self, recorded: Dict[str, int]) -> List[int]:
        """Each stream's acknowledged offset; refuses a source of this job
        recorded with another plan."""
        at = [recorded.get(self.stream_source(s), 0) for s in range(self.parallel)]
        mine = {self.stream_source(s) for s in range(self.parallel)}
        for name in sorted(recorded):
            if name in mine or not name.startswith(self.source + ":"):
                continue
            rest = name[len(self.source) + 1 :]
            plan = _SOURCE.match(rest.split("/", 1)[-1])
            if plan is None:
                continue
            raise InvalidArgument(
                f"source {self.source!r} was uploaded with parallel={plan['parallel']}, batch size {plan['batch']}; "
                f"its batches would not line up with parallel={self.parallel}, batch_size={self.batch_size}: "
                "upload again with those, or name another source"
            )
        return at


@dataclass
class _Batch:
    index: int
    offset: int
    rows: range
    request: bytes


class _Stream:
    """One stream's batches over one `Ingest` call at a time; a call that
    fails with a retryable code is made again (after the server's hint)
    with every batch not yet acknowledged, until `retry_for` passes
    without an acknowledgement."""

    def __init__(
        self,
        call: Callable[..., Any],
        source: str,
        batches: Iterator[_Batch],
        window: int,
        retry_for: float,
        on_ack: Callable[[_Batch, int], None],
        metadata: Sequence[Any],
        stop: threading.Event,
    ):
        self.call = call
        self.source = source
        self.batches = batches
        self.window = max(1, window)
        self.retry_for = retry_for
        self.on_ack = on_ack
        self.metadata = metadata
        self.stop = stop
        self.retries = 0
        self.error: Optional[BaseException] = None

    def run(self) -> None:
        try:
            self._run()
        except BaseException as e:  # reported by the caller's thread
            self.error = e
            self.stop.set()

    def _run(self) -> None:
        pending: Deque[_Batch] = deque()
        exhausted = False
        last_ack = time.monotonic()
        while not self.stop.is_set():
            if exhausted and not pending:
                return
            outgoing: "queue.Queue[Optional[bytes]]" = queue.Queue()

            def requests() -> Iterator[bytes]:
                while True:
                    item = outgoing.get()
                    if item is None:
                        return
                    yield item

            def fill() -> bool:
                nonlocal exhausted
                while not exhausted and len(pending) < self.window:
                    b = next(self.batches, None)
                    if b is None:
                        exhausted = True
                        break
                    pending.append(b)
                    outgoing.put(b.request)
                if exhausted and not pending:
                    outgoing.put(None)
                return bool(pending)

            for b in pending:
                outgoing.put(b.request)
            if not fill():
                return
            responses = self.call(requests(), metadata=self.metadata)
            try:
                for ack in responses:
                    if self.stop.is_set():
                        responses.cancel()
                        return
                    front = pending.popleft()
                    if ack.offset != front.offset:
                        raise ShoalError(
                            f"source {self.source}: acknowledged offset {ack.offset} while batch {front.index} "
                            f"(offset {front.offset}) was the oldest sent"
                        )
                    last_ack = time.monotonic()
                    self.on_ack(front, ack.status)
                    if not fill():
                        outgoing.put(None)
                if pending:
                    raise grpc.RpcError("the server ended the call before acknowledging every batch")
            except grpc.RpcError as raw:
                outgoing.put(None)
                e = from_rpc_error(raw) if hasattr(raw, "code") else ShoalError(str(raw), code=grpc.StatusCode.UNAVAILABLE)
                where = ""
                if pending:
                    p = pending[0]
                    where = f" (batch {p.index}, rows {p.rows.start}..{p.rows.stop}, offset {p.offset} of source {self.source})"
                if e.code in _FINAL:
                    raise type(e)(f"the cluster refused a batch{where}: {e.message}", code=e.code) from None
                if time.monotonic() - last_ack > self.retry_for:
                    raise type(e)(
                        f"no batch acknowledged for {self.retry_for:.0f} s{where}; last error: {e.message}", code=e.code
                    ) from None
                self.retries += 1
                time.sleep(min(max(e.retry_after or 0.2, 0.05), 2.0))


def upload(
    *,
    call: Callable[..., Any],
    offsets: Callable[[str], Dict[str, int]],
    collection: str,
    vectors: np.ndarray,
    ids: np.ndarray,
    payloads: Optional[List[Optional[bytes]]],
    plan: Plan,
    window: int,
    retry_for: float,
    progress: Any,
    metadata: Sequence[Any],
) -> UploadResult:
    """Sends what is not yet acknowledged; see the module's docs."""
    started = time.monotonic()
    n = len(ids)
    n_batches = (n + plan.batch_size - 1) // plan.batch_size
    at = plan.resume_from(offsets(collection))
    lock = threading.Lock()
    counts = {"applied": 0, "skipped": 0, "resumed": 0}

    def make(s: int) -> Iterator[_Batch]:
        for position, b in enumerate(plan.batches_of(s, n_batches)):
            offset = position + 1
            rows = range(b * plan.batch_size, min(n, (b + 1) * plan.batch_size))
            if offset <= at[s]:
                with lock:
                    counts["resumed"] += 1
                if progress is not None:
                    progress.update(len(rows))
                continue
            pl = None if payloads is None else payloads[rows.start : rows.stop]
            request = _wire.ingest_request(
                collection, plan.stream_source(s), offset, ids[rows.start : rows.stop], vectors[rows.start : rows.stop], pl
            )
            yield _Batch(b, offset, rows, request)

    def on_ack(b: _Batch, status: int) -> None:
        with lock:
            counts["applied" if status == 1 else "skipped"] += 1
        if progress is not None:
            progress.update(len(b.rows))

    stop = threading.Event()
    streams = [
        _Stream(call, plan.stream_source(s), make(s), window, retry_for, on_ack, metadata, stop) for s in range(plan.parallel)
    ]
    threads = [threading.Thread(target=st.run, name=f"shoal-upload-{s}", daemon=True) for s, st in enumerate(streams)]
    for t in threads:
        t.start()
    try:
        for t in threads:
            while t.is_alive():
                t.join(0.2)
    except BaseException:
        stop.set()
        raise
    finally:
        if progress is not None:
            progress.close()
    for st in streams:
        if st.error is not None:
            raise st.error
    return UploadResult(
        rows=n,
        batches_applied=counts["applied"],
        batches_resumed=counts["resumed"],
        batches_skipped=counts["skipped"],
        retries=sum(st.retries for st in streams),
        seconds=time.monotonic() - started,
    )
