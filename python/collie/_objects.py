"""Python objects over a Comm: broadcast_object, send_object, recv_object.

Design notes
- Objects travel pickled (highest protocol). Unpickling runs code the
  sender chose, so these calls are exactly as trusted as the comm's other
  ranks: collie only takes messages from members of the comm (a job under
  collie-run proves its secret on every connection; docs/security.md), and
  nothing else is ever unpickled. Do not use them on a comm whose peers you
  would not let run code in this process.
- broadcast_object: one broadcast of a fixed first block of `first_bytes`
  (default FIRST_BYTES, the same on every rank) carrying a 16-byte header
  (magic, flags, payload length) and as much of the payload as fits; only a
  larger object takes a second broadcast of the rest, which the other ranks
  post once the header told them its length. So a small object costs one
  collective, and there is no cap on the size. first_bytes is at most
  FIRST_BYTES_MAX (1 GiB): every rank allocates that block before anything
  is sent, so a larger one is a ValueError naming it, not a MemoryError.
- A root whose object cannot be pickled still sends the first block, with
  the error flag and pickle's message: every rank raises PicklingError
  naming the root instead of waiting for its timeout.
- A rank that cannot allocate the announced length has fallen out of the
  collective order (the root's second broadcast has no partner here): it
  aborts the comm naming itself and raises CollieNoMemory, so the peers see
  CollieAborted/ColliePeerError at once instead of a mismatched collective.
- send_object/recv_object: a 24-byte header message (magic, flags, length,
  sequence number) on tag OBJ_TAG | tag, then the payload on a tag made
  unique by the sender's sequence number (OBJ_TAG | PAYLOAD_TAG | seq << 32
  | tag). The receiver
  posts the payload's receive from the header's actual sender (never from
  any source) and that exact tag, so concurrent recv_object calls (threads,
  asyncio, any source) can never take each other's payload, whatever order
  they post in, nor another sender's payload with the same sequence number.
  src None or -1 (COLLIE_ANY_SOURCE, as Comm.recv takes peer=-1) is any
  source; dst/src are checked (type, range) before anything is posted.
  Object tags have bit 63 set (user tags are < 2^32): a plain recv with a
  tag below 2^62 never takes an object message.
- An object is returned only once every message of it arrived whole: a
  failure of any of them (peer died, timeout, abort) raises that collie
  error, never a partial object.
- Each operation is a generator yielding the works it waits for; _run waits
  for them on this thread (Work.wait: bounded by each work's deadline) and
  _arun awaits them on the running asyncio loop.
- A cancelled recv_object_async (asyncio.wait_for polling for a request)
  never loses an object: the await ends at once, its header receive is
  cancelled (a receive cancel is clean: it either ends unmatched or had
  matched first), and the operation runs on in the background; an object
  it still receives whole (or the error that ended it once its payload
  was coming) is parked on the comm, and the next recv_object that
  matches its sender and tag returns it (or raises it) first (arecv,
  recv). A recv_object_async of that tag first waits for such background
  receives to end (their works' deadlines bound it), so objects keep
  their order; a blocking recv_object does not wait for them.
"""

import asyncio
import itertools
import operator
import pickle
import struct
import threading
from ctypes import c_char_p, c_void_p, cast

from . import _lib
from ._buffers import DTYPES, Buffer, host_buffer
from .errors import CollieNoMemory, CollieProtocolError

lib = _lib.lib

FIRST_BYTES = 16384  # broadcast_object's first block: header + the start of the payload
FIRST_BYTES_MAX = 1 << 30  # first_bytes' bound: every rank allocates that block up front
MAGIC = b"CLOB"
_BHDR = struct.Struct("<4sIQ")  # magic, flags, payload length
_PHDR = struct.Struct("<4sIQQ")  # magic, flags, payload length, sender's sequence number
_F_PICKLE_ERROR = 1  # the payload is the root's pickle error message (utf-8)
_U8 = DTYPES["uint8"]
OBJ_TAG = 1 << 63
PAYLOAD_TAG = 1 << 62
TAG_LIMIT = 1 << 32
_SEQ_MASK = (1 << 30) - 1
_seq = itertools.count()  # next() is atomic under the GIL


def _dumps(obj, what):
    try:
        return pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    except Exception as e:  # pickle raises PicklingError, TypeError, AttributeError, ...
        raise pickle.PicklingError(f"{what}: a {type(obj).__name__} cannot be pickled: {e}") from e


def _loads(view, what, src):
    try:
        return pickle.loads(view)
    except Exception as e:
        raise pickle.UnpicklingError(
            f"{what}: the object from rank {src} cannot be unpickled here: {e}"
        ) from e


def _alloc(n, comm, what, src):
    try:
        return bytearray(n)
    except (MemoryError, OverflowError):
        raise CollieNoMemory(
            -2, f"{what}: rank {src} sends a {n}-byte object, which rank {comm.rank} cannot hold"
        ) from None


def _bytes_buffer(data, offset):
    """A read-only Buffer on bytes `data` from `offset` (no copy)."""
    base = cast(c_char_p(data), c_void_p).value
    return Buffer(data, base + offset, len(data) - offset, _U8)


def _check_peer(comm, peer, name, what, any_ok):
    """root/dst/src as a rank of the comm; for src (any_ok) None or -1
    (COLLIE_ANY_SOURCE, as Comm.recv takes it) is any source: returns -1."""
    if any_ok and peer is None:
        return -1
    kind = "an int" + (" or None (any source)" if any_ok else "")
    if isinstance(peer, bool):
        raise TypeError(f"{what}: {name} must be {kind}, got bool")
    try:
        peer = operator.index(peer)  # ints, numpy integers
    except TypeError:
        raise TypeError(f"{what}: {name} must be {kind}, got {type(peer).__name__}") from None
    if any_ok and peer == -1:
        return -1
    if not 0 <= peer < comm.size:
        also = " (or None / -1: any source)" if any_ok else ""
        raise ValueError(f"{what}: {name} {peer} is not a rank of this {comm.size}-rank comm{also}")
    return peer


def _check_tag(tag, what):
    if not isinstance(tag, int) or isinstance(tag, bool) or not 0 <= tag < TAG_LIMIT:
        raise ValueError(f"{what}: tag {tag!r} (object tags are ints in [0, 2^32))")


def _bcast(comm, buf, root, timeout):
    return comm._engine.post(
        "broadcast_object", lib.collie_broadcast,
        (comm.handle, buf.ptr, buf.count, _U8, root), (buf,), timeout, owner=comm,
    )


def broadcast_steps(comm, obj, root, timeout, first_bytes):
    what = "broadcast_object"
    root = _check_peer(comm, root, "root", what, False)
    if (not isinstance(first_bytes, int) or isinstance(first_bytes, bool)
            or not _BHDR.size < first_bytes <= FIRST_BYTES_MAX):
        raise ValueError(f"{what}: first_bytes {first_bytes!r} (an int in "
                         f"[{_BHDR.size + 1}, 2^30]: every rank allocates it)")
    room = first_bytes - _BHDR.size
    first = bytearray(first_bytes)
    if comm.rank == root:
        flags = 0
        try:
            data = _dumps(obj, what)
        except pickle.PicklingError as e:
            flags, data, err = _F_PICKLE_ERROR, str(e).encode()[:room], e
        _BHDR.pack_into(first, 0, MAGIC, flags, len(data))
        first[_BHDR.size : _BHDR.size + min(room, len(data))] = data[:room]
        works = [_bcast(comm, host_buffer(first, "first", True, _U8), root, timeout)]
        if len(data) > room:
            works.append(_bcast(comm, _bytes_buffer(data, room), root, timeout))
        yield works
        if flags:
            raise err
        return obj
    yield [_bcast(comm, host_buffer(first, "first", True, _U8), root, timeout)]
    magic, flags, n = _BHDR.unpack_from(first, 0)
    if magic != MAGIC:
        raise CollieProtocolError(
            -10, f"{what}: rank {root}'s broadcast is no collie object (did every rank call "
            "broadcast_object with the same root and first_bytes?)"
        )
    if flags & _F_PICKLE_ERROR:
        msg = bytes(first[_BHDR.size : _BHDR.size + min(n, room)]).decode(errors="replace")
        raise pickle.PicklingError(f"{what}: the root (rank {root}) could not pickle its object: {msg}")
    if n <= room:
        return _loads(memoryview(first)[_BHDR.size : _BHDR.size + n], what, root)
    try:
        payload = _alloc(n, comm, what, root)
    except CollieNoMemory as e:
        comm.abort(str(e))  # out of the collective order: fail the peers now
        raise
    payload[:room] = memoryview(first)[_BHDR.size :]
    rest = host_buffer(memoryview(payload)[room:], "payload", True, _U8)
    yield [_bcast(comm, rest, root, timeout)]
    return _loads(payload, what, root)


def send_steps(comm, obj, dst, tag, timeout):
    what = "send_object"
    dst = _check_peer(comm, dst, "dst", what, False)
    _check_tag(tag, what)
    data = _dumps(obj, what)
    seq = next(_seq) & _SEQ_MASK
    hdr = _PHDR.pack(MAGIC, 0, len(data), seq)
    post = comm._engine.post
    works = []
    for buf, t in ((hdr, OBJ_TAG | tag), (data, OBJ_TAG | PAYLOAD_TAG | (seq << 32) | tag)):
        b = host_buffer(buf, "obj", False, _U8)
        works.append(post(what, lib.collie_send, (comm.handle, b.ptr, b.count, _U8, dst, t), (b,),
                          timeout, owner=comm))
    yield works


def recv_steps(comm, src, tag, timeout):
    what = "recv_object"
    peer = _check_peer(comm, src, "src", what, True)
    _check_tag(tag, what)
    hdr = bytearray(_PHDR.size)
    hb = host_buffer(hdr, "header", True, _U8)
    post = comm._engine.post
    w = post(what, lib.collie_recv, (comm.handle, hb.ptr, hb.count, _U8, peer, OBJ_TAG | tag), (hb,),
             timeout, owner=comm, output=hdr)
    yield [w]
    # the payload's receive names the header's actual sender, never any
    # source: another sender's payload with the same seq and tag must not match
    sender = w.source if peer == -1 else peer
    if not 0 <= sender < comm.size:
        raise CollieProtocolError(-10, f"{what}: the header's sender is rank {sender}, not a rank")
    magic, flags, n, seq = _PHDR.unpack(hdr)
    if magic != MAGIC:
        raise CollieProtocolError(-10, f"{what}: rank {sender}'s header is no collie object header")
    payload = _alloc(n, comm, what, sender)
    pb = host_buffer(payload, "payload", True, _U8)
    ptag = OBJ_TAG | PAYLOAD_TAG | (seq << 32) | tag
    yield [post(what, lib.collie_recv, (comm.handle, pb.ptr, pb.count, _U8, sender, ptag), (pb,),
                timeout, owner=comm)]
    return _loads(payload, what, sender), sender


def run(gen):
    """Drive an operation on this thread."""
    try:
        works = next(gen)
        while True:
            for w in works:
                w.wait()
            works = gen.send(None)
    except StopIteration as stop:
        return stop.value


_park_lock = threading.Lock()  # guards every comm's parked list


def _parked_take(comm, src, tag):
    """What a cancelled recv_object_async received, if it matches: the
    object and its sender, or the error that ended it once its payload was
    coming (raised here)."""
    with _park_lock:
        parked = comm.__dict__.get("_parked_objects") or []
        for i, (ptag, sender, got) in enumerate(parked):
            if ptag == tag and src in (None, -1, sender):
                del parked[i]
                break
        else:
            return None
    if isinstance(got, BaseException):
        raise got
    return got


def recv(comm, src, tag, timeout):
    """recv_object on this thread."""
    got = _parked_take(comm, src, tag)
    return got if got is not None else run(recv_steps(comm, src, tag, timeout))


async def arecv(comm, src, tag, timeout):
    """recv_object on the running loop; cancelling the await loses nothing
    (the design notes)."""
    # a cancelled receive of this tag still running in the background comes
    # first (bounded by its works' deadlines): objects keep their order
    behind = [t for t in comm.__dict__.get("_recv_behind", ()) if t[0] == tag and not t[1].done()]
    if behind:
        await asyncio.wait([t[1] for t in behind])
    got = _parked_take(comm, src, tag)
    if got is not None:
        return got
    gen = recv_steps(comm, src, tag, timeout)
    works = next(gen)  # the header's receive, posted before a cancel can land
    stage = {"works": works}

    async def drive(works):
        try:
            while True:
                stage["works"] = works
                for w in works:
                    await w
                stage["payload"] = True
                works = gen.send(None)
        except StopIteration as stop:
            return stop.value

    inner = asyncio.ensure_future(drive(works))
    try:
        return await asyncio.shield(inner)
    except asyncio.CancelledError:
        if not stage.get("payload"):
            for w in stage["works"]:
                w.cancel()

        def park(t):
            if t.cancelled():
                return
            exc = t.exception()
            if exc is not None and not stage.get("payload"):
                return  # cancelled unmatched, or failed before anything was taken
            got = exc if exc is not None else t.result()
            sender = got[1] if exc is None else src
            with _park_lock:
                comm.__dict__.setdefault("_parked_objects", []).append((tag, sender, got))

        inner.add_done_callback(park)
        with _park_lock:
            live = [t for t in comm.__dict__.get("_recv_behind", ()) if not t[1].done()]
            comm.__dict__["_recv_behind"] = live + [(tag, inner)]
        raise


async def arun(gen):
    """Drive an operation on the running asyncio loop."""
    try:
        works = next(gen)
        while True:
            for w in works:
                await w
            works = gen.send(None)
    except StopIteration as stop:
        return stop.value
