#!/usr/bin/env python3
"""gen_shm_seeds.py — seed inputs for the shared-memory fuzz targets
(tests/fuzz/fuzz_shm_{ring,link,loan}.c): valid programs in each target's
input encoding (see the target's decoder), written to
tests/fuzz/corpus/shm_<target>/seed-<name>. The committed corpus is these
plus what the fuzzer found, minimised with -merge=1.

    python3 tests/fuzz/gen_shm_seeds.py [corpus dir, default tests/fuzz/corpus]
"""
import os
import struct
import sys


def u16(v):
    return struct.pack("<H", v & 0xFFFF)


def u64(v):
    return struct.pack("<Q", v & 0xFFFFFFFFFFFFFFFF)


# ---- fuzz_shm_ring: cfg, then ops (low nibble: the step; 0x80: the tx ring) ----
R_HEAD, R_TAIL, R_POKE, R_PRODUCE, R_CONSUME, R_READ, R_WRITE = 0, 1, 2, 3, 4, 5, 6
R_ASK, R_RPARK, R_WPARK, R_WAKEW, R_WAKER = 7, 8, 9, 10, 11


def ring_seeds():
    s = {}
    # an honest stream across the wrap, read in uneven pieces
    p = bytes([0])
    for n, m in [(1000, 600), (3000, 3400), (4096, 100), (50, 4096), (4000, 4000)]:
        p += bytes([R_PRODUCE]) + u16(n) + bytes([R_READ]) + u16(m) + bytes([R_ASK])
    s["stream-across-the-wrap"] = p
    # this side writes 1-3 iovecs, the peer consumes; full, then room again
    p = bytes([1])
    for niov, lens, take in [(1, [5000], 3000), (3, [0, 7000, 9], 8192), (2, [4096, 4096], 100)]:
        p += bytes([R_WRITE, niov - 1]) + b"".join(u16(x) for x in lens)
        p += bytes([R_CONSUME]) + u16(take) + bytes([R_ASK | 0x80])
    s["writes-and-consumes"] = p
    # parking on both sides, the wake-ups
    p = bytes([0, R_RPARK, R_PRODUCE]) + u16(10) + bytes([R_WAKEW, R_READ]) + u16(10)
    p += bytes([R_WRITE, 0]) + u16(4096) + bytes([R_WPARK]) + u16(1)
    p += bytes([R_CONSUME]) + u16(4096) + bytes([R_WAKER, R_WPARK]) + u16(1)
    s["park-and-wake"] = p
    # rx laid out by the peer (attach): an honest capacity with data in it
    p = bytes([4 | 16, 0]) + bytes([1]) + u16(100) + bytes([1]) + u16(0)
    p += bytes([R_READ]) + u16(50) + bytes([R_READ]) + u16(50)
    s["attach-with-data"] = p
    # 16 KiB rings, a corrupt head after some traffic (read fails, for good)
    p = bytes([2, R_PRODUCE]) + u16(2000) + bytes([R_READ]) + u16(1000)
    p += bytes([R_HEAD, 6, R_READ]) + u16(10) + bytes([R_ASK, R_RPARK, R_READ]) + u16(10)
    s["corrupt-head-after-traffic"] = p
    return s


# ---- fuzz_shm_link: cfg, [hand-made file], header edits, then the program (low
# nibble: the step; high bits: its flags) ----
L_POKE, L_COUNTER, L_PEERW, L_RECV, L_SEND, L_PEERR, L_READABLE, L_BELL, L_HANGUP = range(9)


def link_prog():
    p = bytes([L_PEERW]) + u16(3000) + bytes([L_BELL, L_RECV | 0x10]) + u16(1000)
    p += bytes([L_RECV]) + u16(5000) + bytes([L_READABLE, L_RECV | 0x10]) + u16(10)
    p += bytes([L_SEND]) + u16(2000) + bytes([L_PEERR, L_SEND]) + u16(9000)
    p += bytes([L_PEERW]) + u16(7) + bytes([L_HANGUP, L_RECV]) + u16(100) + bytes([L_RECV]) + u16(100)
    p += bytes([L_SEND]) + u16(1)
    return p


def link_seeds():
    s = {}
    s["honest-4k"] = bytes([0, 0]) + link_prog()
    s["honest-32k"] = bytes([3, 0]) + link_prog()
    # a file made by hand of the right size, sealed, honest layout
    s["hand-made-sealed"] = bytes([4, 0]) + u16(0) + bytes([0]) + link_prog()
    # header edits that are refused: another generation, other ranks, a ring size
    s["other-generation"] = bytes([0, 1, 3, 1])
    s["other-ranks"] = bytes([0, 1, 4 | 8, 3])
    s["ring-cap-changed"] = bytes([1, 1, 5, 13])
    # an unsealed file
    s["hand-made-unsealed"] = bytes([4, 0x80]) + u16(0) + bytes([0])
    return s


# ---- fuzz_shm_loan: ops (low nibble: the step; high bits: its flags) ----
(N_POKE, N_STORE, N_PROBE, N_PEERLEND, N_FORGED, N_BORROW, N_LIVE, N_READ, N_RETURN,
 N_PWITHDRAW, N_LEND, N_PARK, N_WITHDRAW, N_PROBEWORD) = range(14)
RET_USED = N_RETURN | 0x10


def loan_seeds():
    s = {}
    # probe, the peer lends three, this side borrows, reads, returns them in order
    p = bytes([N_PROBE])
    for _ in range(3):
        p += bytes([N_PEERLEND, N_BORROW, N_LIVE, 0, N_READ, 0]) + u16(100) + u16(1000)
    p += bytes([RET_USED, RET_USED, N_RETURN])
    s["borrow-read-return"] = p
    # the peer withdraws before the claim: the return says WITHDRAWN
    p = bytes([N_PROBE, N_PEERLEND, N_BORROW, N_PWITHDRAW, 0, RET_USED])
    s["withdrawn-before-claim"] = p
    # this side lends (the peer says it may), parks, collects, withdraws
    p = bytes([N_STORE | 0x40, 2, 1])  # returned = next - 2 + 2 = 0 (nothing back), readable = 1
    p += bytes([N_LEND, N_LEND, N_PARK, N_STORE, 3, N_LEND, N_PARK, N_WITHDRAW, 0])
    s["lend-park-withdraw"] = p
    # forged descriptors: a ticket that does not go up, then one that does
    p = bytes([N_PROBE, N_FORGED, 0, 0, N_BORROW, N_FORGED, 0, 5, 0, 0, N_BORROW, N_READ, 0])
    p += u16(0) + u16(64) + bytes([RET_USED])
    s["forged-descriptors"] = p
    return s


def main():
    root = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "corpus")
    for target, seeds in [("shm_ring", ring_seeds()), ("shm_link", link_seeds()),
                          ("shm_loan", loan_seeds())]:
        d = os.path.join(root, target)
        os.makedirs(d, exist_ok=True)
        for name, data in seeds.items():
            with open(os.path.join(d, "seed-" + name), "wb") as f:
                f.write(data)


if __name__ == "__main__":
    main()
