"""Comm.stats()'s latency percentiles: the estimator against histograms
whose answer is known, and a comm's figures against bounds measured here
(a receive held back by a known delay, post-to-wait times taken in Python)."""

import time

import numpy as np
import pytest

from collie import _lib
from collie.comm import latency_percentile

NB = _lib.LATENCY_BUCKETS


def hist(**counts):
    b = [0] * NB
    for k, v in counts.items():
        b[int(k[1:])] = v
    return b


def test_percentile_of_known_histograms():
    assert latency_percentile([0] * NB, 50) is None
    # ten in [16, 32) us: interpolated by rank inside the bucket
    h = hist(b5=10)
    assert latency_percentile(h, 50) == pytest.approx(24.0)
    assert latency_percentile(h, 90) == pytest.approx(30.4)
    assert latency_percentile(h, 0) == pytest.approx(16.0)
    assert latency_percentile(h, 100) == pytest.approx(32.0)
    # 90 in [4, 8) us, 10 in [512, 1024) us
    h = hist(b3=90, b10=10)
    assert latency_percentile(h, 50) == pytest.approx(4 + 4 * 50 / 90)
    assert latency_percentile(h, 90) == pytest.approx(8.0)
    assert latency_percentile(h, 99) == pytest.approx(512 + 512 * 0.9)
    # under 1 us, and the open last bucket (its lower bound, 2^29 us)
    assert latency_percentile(hist(b0=4), 50) == pytest.approx(0.5)
    assert latency_percentile(hist(b30=3), 99) == float(1 << 29)
    with pytest.raises(ValueError, match="percentile"):
        latency_percentile(h, 101)


@pytest.mark.parametrize("seed", range(5))
def test_estimate_lies_in_the_true_percentiles_bucket(seed):
    """Random latencies bucketed as collie does (floor us, bit length): each
    estimate is within the bucket of the nearest-rank sample."""
    rng = np.random.default_rng(seed)
    us = np.floor(rng.lognormal(4, 1.5, 1000)).astype(np.int64)
    b = [0] * NB
    for u in us:
        b[min(int(u).bit_length(), NB - 1)] += 1
    s = np.sort(us)
    for q in (50, 90, 99):
        true = int(s[int(np.ceil(q / 100 * len(s))) - 1])
        lo = 0 if true == 0 else 1 << (true.bit_length() - 1)
        hi = 1 if true == 0 else 2 * lo
        est = latency_percentile(b, q)
        assert lo <= est <= hi, (q, true, est)


def test_comm_stats_percentiles_bounded_by_measured_latencies(world2):
    delay, rounds = 0.03, 5

    def body(r, c):
        py = []
        for _ in range(rounds):
            if r == 0:
                buf = bytearray(8)
                t0 = time.monotonic()
                w = c.recv(buf, 1, timeout=10)
                w.wait(10)
                py.append(time.monotonic() - t0)
            else:
                time.sleep(delay)  # the receive waits at least this long
                c.send(bytearray(8), 0, timeout=10).wait(10)
        for _ in range(200):
            t0 = time.monotonic()
            c.allreduce(np.ones(4, np.float32)).wait(10)
            py.append(time.monotonic() - t0)
        return py, c.stats()["latency"]

    (py0, lat0), (py1, lat1) = world2.each(body)
    rec = lat0["recv"]
    assert rec["count"] == rounds
    for q in ("p50_us", "p90_us", "p99_us"):
        # every receive took >= 30 ms: its bucket starts at 16384 us or later
        assert 16384 <= rec[q] <= 2 * max(py0[:rounds]) * 1e6, rec
    for lat, py in ((lat0, py0), (lat1, py1)):
        ar = lat["allreduce"]
        assert ar["count"] == 200
        assert ar["p50_us"] <= ar["p90_us"] <= ar["p99_us"]
        # collie's post-to-completion is inside Python's post-to-wait-return:
        # the estimate is under twice the same percentile of the Python times
        times = sorted(py[-200:])
        for q in (50, 90, 99):
            assert ar[f"p{q}_us"] <= 2 * times[q * 2 - 1] * 1e6 + 1, (q, ar, times[q * 2 - 1])


def test_comm_stats_fault_fields(world2):
    """Failure as data in the stats: the root fault's kind, failed works by
    kind, peers by health state (rank 1 destroys its comm: rank 0 counts it
    left)."""
    c0, c1 = world2.comms
    s = c0.stats()
    assert s["fault_kind"] == "none" and s["failed_by_kind"] == {}, s
    assert (s["peers_dead"], s["peers_suspected"], s["peers_left"]) == (0, 0, 0), s
    c0.allreduce(np.ones(4, np.float32))  # rank 1 never posts it
    pending = c1.allreduce(np.ones(4, np.float32))
    # rank 1's work is left pending until rank 0 aborts
    c0.abort("operator")
    with pytest.raises(Exception):
        pending.wait(10)
    deadline = time.monotonic() + 10
    while c1.stats()["fault_kind"] == "none" and time.monotonic() < deadline:
        time.sleep(0.01)
    s0, s1 = c0.stats(), c1.stats()
    assert s0["fault_kind"] == "app_abort", s0
    assert s1["fault_kind"] == "peer_abort", s1
    assert s1["failed_by_kind"] == {"peer_abort": 1}, s1
    assert sum(s0["failed_by_kind"].values()) == s0["failed"], s0
    c1.destroy()
    world2.comms[1] = None
    deadline = time.monotonic() + 10
    while c0.stats()["peers_left"] == 0 and time.monotonic() < deadline:
        time.sleep(0.01)
    # an aborted comm may or may not hear the leave; never dead or suspected
    assert c0.stats()["peers_dead"] == 0, c0.stats()
