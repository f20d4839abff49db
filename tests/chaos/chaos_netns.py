"""chaos_netns.py - two "hosts": two network namespaces joined by veth.

Design notes
 - Two namespaces A and B (names carry the driver's pid and a counter, so
   parallel drivers never meet) and two veth pairs between them, each made
   inside a namespace, never in the root one:
     control: A 192.0.2.1/30 <-> B 192.0.2.2/30  (collie-run's store)
     data:    A 192.0.2.5/30 <-> B 192.0.2.6/30  (the ranks' TCP)
   The ranks listen on the data address (COLLIE_SOCKET_ADDR); node 0's
   collie-run serves the store on 0.0.0.0, which node 1 reaches over the
   control pair. So `link down` (the data pair, set down in A) cuts the
   ranks of one host off from the other's, as a network partition between
   two machines does, while both keep the store: the rank program's round
   barrier and abort keys still work. 192.0.2.0/24 is TEST-NET-1; inside
   namespaces of our own it clashes with nothing.
 - Same-host identity includes the network namespace
   (transports/cpu/shm/host_id.c), so ranks of A and B never use shared memory
   between them even though they share /dev/shm and the boot id.
 - Cleanup: `ip netns del` takes the veth ends along (the namespace goes
   when its last process does: the driver kills the run's processes first).
   Every `ip` call is bounded (IP_TIMEOUT_S).
"""

import os
import subprocess

IP_TIMEOUT_S = 10
STORE_PORT = 29517
CONTROL_ADDR = ("192.0.2.1", "192.0.2.2")
DATA_ADDR = ("192.0.2.5", "192.0.2.6")
DATA_IF = ("vcda", "vcdb")
CONTROL_IF = ("vcca", "vccb")

_counter = [0]


def ip(*args):
    """Run `ip args`; (returncode, stderr text). Bounded."""
    try:
        p = subprocess.run(["ip"] + list(args), stdin=subprocess.DEVNULL,
                           stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                           timeout=IP_TIMEOUT_S)
        return p.returncode, p.stderr.decode(errors="replace").strip()
    except FileNotFoundError:
        return 127, "'ip' (iproute2) is not installed"
    except subprocess.TimeoutExpired:
        return 124, "'ip %s' took more than %d s" % (" ".join(args), IP_TIMEOUT_S)


def unavailable():
    """Why two namespaces cannot be made here, or None."""
    if os.geteuid() != 0:
        return "not root (network namespaces need CAP_SYS_ADMIN)"
    rc, err = ip("netns", "list")
    if rc != 0:
        return "'ip netns' is not available: %s" % err
    return None


class Hosts:
    """The two namespaces of one run; use as a context manager."""

    def __init__(self):
        _counter[0] += 1
        base = "clchaos%d_%d" % (os.getpid(), _counter[0])
        self.ns = (base + "a", base + "b")
        self.made = []

    def store_addr(self):
        return "%s:%d" % (CONTROL_ADDR[0], STORE_PORT)

    def setup(self):
        """Make both namespaces and links; raises RuntimeError saying why."""
        for n in self.ns:
            rc, err = ip("netns", "add", n)
            if rc != 0:
                self.cleanup()
                raise RuntimeError("'ip netns add %s' failed: %s" % (n, err))
            self.made.append(n)
        a, b = self.ns
        steps = []
        for (ifa, ifb), (ipa, ipb) in ((CONTROL_IF, CONTROL_ADDR), (DATA_IF, DATA_ADDR)):
            steps += [("-n", a, "link", "add", ifa, "type", "veth", "peer", "name", ifb,
                       "netns", b),
                      ("-n", a, "addr", "add", ipa + "/30", "dev", ifa),
                      ("-n", b, "addr", "add", ipb + "/30", "dev", ifb),
                      ("-n", a, "link", "set", ifa, "up"),
                      ("-n", b, "link", "set", ifb, "up")]
        steps += [("-n", a, "link", "set", "lo", "up"), ("-n", b, "link", "set", "lo", "up")]
        for s in steps:
            rc, err = ip(*s)
            if rc != 0:
                self.cleanup()
                raise RuntimeError("'ip %s' failed: %s" % (" ".join(s), err))

    def data_link(self, up):
        """Set the data link (A's end) up or down; (ok, why)."""
        rc, err = ip("-n", self.ns[0], "link", "set", DATA_IF[0], "up" if up else "down")
        return rc == 0, err

    def exec_prefix(self, node):
        return ["ip", "netns", "exec", self.ns[node]]

    def cleanup(self):
        for n in self.made:
            ip("netns", "del", n)
        self.made = []

    def __enter__(self):
        self.setup()
        return self

    def __exit__(self, *exc):
        self.cleanup()
        return False
