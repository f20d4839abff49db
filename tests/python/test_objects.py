"""Python objects over a comm: broadcast_object, send_object, recv_object
(and their _async forms), checked against the objects sent; their errors:
an object that cannot be pickled, a size no rank can hold, a peer that dies
between header and payload (the collie error, never a partial object)."""

import asyncio
import os
import pickle
import struct
import subprocess
import sys
import threading
import time

import pytest

import collie
from collie import _objects
from conftest import ROOT

BIG = {"blob": bytes(range(256)) * 4096, "nested": [{"i": i, "s": "x" * i} for i in range(300)]}


def posted(c):
    return c.stats()["posted"]


def test_broadcast_object_every_root_one_collective_when_small(world3):
    def body(r, c):
        out = []
        for root in range(3):
            want = {"root": root, "vals": list(range(50)), "s": "é" * 100}
            before = posted(c)
            got = c.broadcast_object(want if r == root else None, root=root, timeout=10)
            out.append((got == want, posted(c) - before))
        return out

    for res in world3.each(body):
        assert res == [(True, 1)] * 3  # the right object, one broadcast each


@pytest.mark.parametrize("first_bytes", [17, 64, _objects.FIRST_BYTES])
def test_broadcast_object_large_takes_two_broadcasts(world3, first_bytes):
    def body(r, c):
        before = posted(c)
        got = c.broadcast_object(BIG if r == 2 else None, root=2, first_bytes=first_bytes, timeout=10)
        return got == BIG, posted(c) - before

    assert world3.each(body) == [(True, 2)] * 3


def test_broadcast_object_unpicklable_raises_on_every_rank_and_comm_goes_on(world3):
    def body(r, c):
        with pytest.raises(pickle.PicklingError) as e:
            c.broadcast_object(threading.Lock() if r == 1 else None, root=1, timeout=10)
        msg = str(e.value)
        again = c.broadcast_object("after" if r == 0 else None, timeout=10)
        return msg, again

    for r, (msg, again) in enumerate(world3.each(body)):
        assert "lock" in msg, msg
        if r != 1:
            assert "root (rank 1) could not pickle" in msg, msg
        assert again == "after"


def test_broadcast_object_bad_arguments(world2):
    c = world2.comms[0]
    with pytest.raises(ValueError, match="root 5 is not a rank"):
        c.broadcast_object(1, root=5)
    with pytest.raises(TypeError, match="root must be an int"):
        c.broadcast_object(1, root="0")
    with pytest.raises(ValueError, match="first_bytes"):
        c.broadcast_object(1, first_bytes=8)
    # over the bound (2^30): a ValueError naming it, before any allocation
    # (was a bare MemoryError on every rank)
    for fb in (1 << 50, _objects.FIRST_BYTES_MAX + 1, True):
        with pytest.raises(ValueError, match="first_bytes"):
            c.broadcast_object(1, root=0, timeout=5, first_bytes=fb)
    assert posted(c) == 0


def test_send_recv_object_named_and_any_source(world3):
    def body(r, c):
        if r == 0:
            named = c.recv_object(src=2, tag=7, timeout=10)
            anys = sorted((c.recv_object(timeout=10) for _ in range(2)), key=lambda x: x[1])
            return named, anys
        c.send_object({"to": 0, "from": r, "tag": 0}, 0, timeout=10)
        if r == 2:
            c.send_object(("tag7", BIG), 0, tag=7, timeout=10)
        return None

    named, anys = world3.each(body)[0]
    assert named == (("tag7", BIG), 2)
    assert anys == [({"to": 0, "from": 1, "tag": 0}, 1), ({"to": 0, "from": 2, "tag": 0}, 2)]


def test_recv_object_src_minus_one_is_any_source_and_returns_the_real_sender(world2):
    """src=-1 (COLLIE_ANY_SOURCE's value, as Comm.recv takes peer=-1) is any
    source, like None (it returned ('hello', -1))."""

    def body(r, c):
        if r == 0:
            c.send_object("hello", 1, timeout=10)
            c.send_object("again", 1, timeout=10)
            return None
        return c.recv_object(src=-1, timeout=10), c.recv_object(src=None, timeout=10)

    assert world2.each(body)[1] == (("hello", 0), ("again", 0))


def test_recv_object_any_source_never_takes_another_senders_payload(world3):
    """Rank 2's header (seq 5) arrives, its payload never; rank 1's payload
    with the same seq and tag (rank 1's process counts its own seqs) is
    there. recv_object (src -1 or None) must not return rank 1's object (it
    did for src=-1: ('from 1', -1)): the payload's receive names rank 2."""
    a, b = pickle.dumps("from 2", 5), pickle.dumps("from 1", 5)
    assert len(a) == len(b)
    seq = 5
    ptag = _objects.OBJ_TAG | _objects.PAYLOAD_TAG | (seq << 32)

    def body(r, c):
        if r == 2:
            hdr = bytearray(_objects._PHDR.pack(_objects.MAGIC, 0, len(a), seq))
            c.send(hdr, 0, tag=_objects.OBJ_TAG, timeout=10).wait(10)
            return None
        if r == 1:
            c.send(bytearray(b), 0, tag=ptag, timeout=10).wait(10)
            return None
        time.sleep(0.5)  # both messages are at rank 0
        try:
            return c.recv_object(src=-1, timeout=2)
        except collie.CollieTimeout:
            return "timeout"  # rank 2's payload never came: right

    got = world3.each(body)[0]
    assert got == "timeout", got


def test_concurrent_any_source_receives_never_mix_payloads(world3):
    """Several receivers posting headers before any payload (threads): each
    gets a whole object from the sender its header named."""
    per_sender = 6

    def body(r, c):
        if r == 0:
            got, errs = [], []

            def rx():
                try:
                    for _ in range(per_sender):
                        got.append(c.recv_object(timeout=20))
                except Exception as e:  # noqa: BLE001 - reported below
                    errs.append(e)

            ts = [threading.Thread(target=rx) for _ in range(2)]
            for t in ts:
                t.start()
            for t in ts:
                t.join(40)
            assert not errs and not any(t.is_alive() for t in ts), errs
            return got
        for k in range(per_sender):
            obj = {"from": r, "k": k, "pad": bytes([r]) * (1000 * (k + 1) * (r + 1))}
            c.send_object(obj, 0, timeout=20)
        return None

    got = world3.each(body)[0]
    assert len(got) == 2 * per_sender
    for obj, src in got:
        assert obj["from"] == src and obj["pad"] == bytes([src]) * (1000 * (obj["k"] + 1) * (src + 1))
    for src in (1, 2):  # one sender's objects arrive in its order on one receiver's view
        assert sorted(o["k"] for o, s in got if s == src) == list(range(per_sender))


def test_async_forms(world3):
    async def main(r, c):
        b = await c.broadcast_object_async(BIG if r == 0 else None, root=0, timeout=10)
        if r == 1:
            await c.send_object_async({"hi": r}, 2, tag=3, timeout=10)
            return b, None
        if r == 2:
            return b, await c.recv_object_async(tag=3, timeout=10)
        return b, None

    res = world3.each(lambda r, c: asyncio.run(asyncio.wait_for(main(r, c), 30)))
    assert all(b == BIG for b, _ in res)
    assert res[2][1] == ({"hi": 1}, 1)


def test_send_object_unpicklable_sends_nothing(world2):
    def body(r, c):
        if r == 0:
            with pytest.raises(pickle.PicklingError, match="cannot be pickled"):
                c.send_object(lambda: 0, 1, timeout=10)
            c.send_object("second", 1, timeout=10)
            return None
        return c.recv_object(src=0, timeout=10)

    assert world2.each(body)[1] == ("second", 0)


def test_send_recv_object_bad_tags(world2):
    c = world2.comms[0]
    for tag in (-1, 1 << 32, "x"):
        with pytest.raises(ValueError, match="object tags are ints"):
            c.send_object(1, 1, tag=tag)
        with pytest.raises(ValueError, match="object tags are ints"):
            c.recv_object(tag=tag)


def test_send_recv_object_bad_peers_name_the_argument(world2):
    """dst/src of a wrong type or out of range: TypeError/ValueError naming
    the argument, before anything is posted (were ctypes' 'ArgumentError:
    argument 5: wrong type' and int()'s 'invalid literal')."""
    c = world2.comms[0]
    for dst, exc in ((None, TypeError), ("1", TypeError), (1.0, TypeError), (True, TypeError),
                     (2, ValueError), (-1, ValueError)):
        with pytest.raises(exc, match="send_object: dst"):
            c.send_object("a", dst, timeout=1)
    for src, exc in (("x", TypeError), (1.5, TypeError), (False, TypeError),
                     (2, ValueError), (-2, ValueError)):
        with pytest.raises(exc, match="recv_object: src"):
            c.recv_object(src=src, timeout=1)
    assert posted(c) == 0


def test_plain_recv_never_takes_an_object_message(world2):
    def body(r, c):
        if r == 0:
            c.send_object(b"obj", 1, timeout=10)
            c.send(bytearray(b"raw!"), 1, tag=0, timeout=10).wait(10)
            return None
        raw = bytearray(4)
        c.recv(raw, None, tag=0, timeout=10).wait(10)
        return bytes(raw), c.recv_object(timeout=10)

    assert world2.each(body)[1] == (b"raw!", (b"obj", 0))


def test_recv_object_size_no_rank_can_hold(world2):
    """A header announcing 2^62 bytes: CollieNoMemory naming both ranks; the
    comm goes on (the payload stays unreceived under its own tag)."""

    def body(r, c):
        if r == 0:
            hdr = bytearray(_objects._PHDR.pack(_objects.MAGIC, 0, 1 << 62, 5))
            c.send(hdr, 1, tag=_objects.OBJ_TAG, timeout=10).wait(10)
            c.send_object("next", 1, timeout=10)
            return None
        with pytest.raises(collie.CollieNoMemory) as e:
            c.recv_object(timeout=10)
        return str(e.value), c.recv_object(timeout=10)

    msg, nxt = world2.each(body)[1]
    assert f"rank 0 sends a {1 << 62}-byte object, which rank 1 cannot hold" in msg
    assert nxt == ("next", 0)


def test_broadcast_object_size_no_rank_can_hold_aborts_the_comm(world2):
    def body(r, c):
        if r == 0:
            first = bytearray(_objects.FIRST_BYTES)
            struct.pack_into("<4sIQ", first, 0, _objects.MAGIC, 0, 1 << 62)
            c.broadcast(first, 0, timeout=10).wait(10)
            return None
        with pytest.raises(collie.CollieNoMemory, match="rank 1 cannot hold"):
            c.broadcast_object(None, root=0, timeout=10)
        return c.error()

    err = world2.each(body)[1]
    assert isinstance(err, collie.CollieAborted) and "cannot hold" in str(err), err


SENDER = r"""
import os, sys
sys.path.insert(0, os.path.join(sys.argv[1], "python"))
import collie
from collie import _objects
eng = collie.Engine()
comm = collie.Comm.from_env(eng, timeout=30)
if comm.rank == 1:
    comm.send_object("whole", 0, timeout=10)
    hdr = bytearray(_objects._PHDR.pack(_objects.MAGIC, 0, 1 << 20, 9))
    comm.send(hdr, 0, tag=_objects.OBJ_TAG, timeout=10).wait(10)
    print("header sent", flush=True)
    os._exit(0)  # dies between the header and the payload
print(comm.recv_object(src=1, timeout=20), flush=True)
try:
    print("returned", comm.recv_object(src=1, timeout=20), flush=True)
except collie.CollieError as e:
    print("error", type(e).__name__, e, flush=True)
"""


def test_peer_dies_between_header_and_payload():
    with collie.Engine() as eng, collie.StoreServer(eng) as srv:
        procs = []
        for r in range(2):
            env = dict(os.environ, COLLIE_STORE_ADDR=srv.address, COLLIE_RANK=str(r),
                       COLLIE_WORLD_SIZE="2")
            procs.append(subprocess.Popen([sys.executable, "-c", SENDER, ROOT], env=env,
                                          stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                          text=True))
        try:
            outs = [p.communicate(timeout=60)[0] for p in procs]
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
                    p.wait(10)
    lines = outs[0].splitlines()
    assert lines[0] == "('whole', 1)", outs
    # the payload's receive fails on the peer's death (ColliePeerError), or is
    # refused because the comm already failed from it (CollieAborted): either
    # names rank 1, and never returns a partial object
    assert lines[1].startswith(("error ColliePeerError", "error CollieAborted")), outs
    assert "rank 1" in lines[1], outs
    assert "header sent" in outs[1]


def test_cancelled_recv_object_async_loses_nothing(world2):
    """asyncio.wait_for(recv_object_async(...), t) timing out (a server
    polling for a request) left its header receive posted, which swallowed
    the sender's next object (an outside breaker's find). Now the next
    recv_object gets it; and a cancel that races a match (the sender waits
    already) parks the object for the next call instead of dropping it."""
    import asyncio
    import threading
    c0, c1 = world2.comms
    go = [threading.Event(), threading.Event()]
    sent = []

    def sender():
        for i in range(2):
            go[i].wait(10)
            c1.send_object({"req": 7 + i}, dst=0, tag=5, timeout=5)
            sent.append(i)

    async def receiver():
        got = []
        for i in range(2):
            if i == 0:  # cancelled while nothing was sent
                with pytest.raises(asyncio.TimeoutError):
                    await asyncio.wait_for(c0.recv_object_async(src=1, tag=5), 0.3)
                go[i].set()
            else:  # cancelled as it matches the sender waiting for it
                go[i].set()
                await asyncio.sleep(0.3)
                try:
                    got.append(await asyncio.wait_for(c0.recv_object_async(src=1, tag=5), 0.0002))
                    continue
                except asyncio.TimeoutError:
                    await asyncio.sleep(0.2)
            got.append(await asyncio.wait_for(c0.recv_object_async(src=1, tag=5, timeout=3), 5))
        return got

    t = threading.Thread(target=sender, daemon=True)
    t.start()
    try:
        got = asyncio.run(receiver())
    finally:
        t.join(10)
    assert got == [({"req": 7}, 1), ({"req": 8}, 1)], got
    assert sent == [0, 1]
