"""collie's key/value store from Python: StoreServer and Store.

Design notes
- Every request is posted (collie_store_post_*) and waited for on the
  caller's thread, so it is bounded by the store's op timeout (or the
  `timeout` given) and gives up the GIL while it waits. The *_async
  forms return the Work for await or a later wait().
- Keys are str (UTF-8) or bytes; values are bytes-like (str is encoded).
- A Store keeps its Engine alive; a prefix() view keeps its parent alive.
"""

import ctypes
from ctypes import byref, c_char_p, c_int64, c_size_t, c_void_p, sizeof

from . import _lib
from ._engine import Closable, Engine, timeout_ms
from .errors import check

lib = _lib.lib


def _key(k, what="key"):
    if isinstance(k, str):
        k = k.encode()
    if not isinstance(k, (bytes, bytearray)):
        raise TypeError(f"{what}: str or bytes, got {type(k).__name__}")
    if b"\0" in k:
        raise ValueError(f"{what}: contains a NUL byte")
    return bytes(k)


def _val(v, what="value"):
    if isinstance(v, str):
        return v.encode()
    try:
        return bytes(memoryview(v))
    except TypeError:
        raise TypeError(f"{what}: bytes-like or str, got {type(v).__name__}") from None


def _keys(keys):
    ks = [_key(k) for k in keys]
    return (c_char_p * len(ks))(*ks), len(ks), ks


def _value(w):
    ptr, n = c_void_p(), c_size_t()
    check(lib.collie_store_work_value(w._h, byref(ptr), byref(n)))
    return ctypes.string_at(ptr, n.value) if n.value else b""


def _int(w):
    v = c_int64()
    check(lib.collie_store_work_int(w._h, byref(v)))
    return v.value


class StoreServer(Closable):
    """A collie store server on `engine`, listening on host:port (0: any free port).

    Without a token (`token`, else COLLIE_STORE_TOKEN) a host beyond loopback is refused
    unless `insecure` (or COLLIE_INSECURE=1) says anyone who reaches it may use it."""

    def __init__(
        self, engine, host="127.0.0.1", port=0, token=None, max_value_size=0, insecure=False
    ):
        if not isinstance(engine, Engine):
            raise TypeError("engine: a collie.Engine")
        if not 0 <= int(port) <= 65535:
            raise ValueError(f"port: {port} is not 0..65535")
        opts = _lib.StoreServerOpts(
            sizeof(_lib.StoreServerOpts),
            token.encode() if token else None,
            0,
            max_value_size,
            0,
            0,
            1 if insecure else 0,
        )
        h = c_void_p()
        check(
            lib.collie_store_server_create(
                engine.handle, host.encode() if host else None, int(port), byref(opts), byref(h)
            ),
            f"store server on {host}:{port}",
        )
        self._h = h.value
        self._engine = engine
        self.host = host or "127.0.0.1"

    @property
    def port(self):
        return lib.collie_store_server_port(self._h)

    @property
    def address(self):
        host = "127.0.0.1" if self.host in ("0.0.0.0", "") else self.host
        if ":" in host:
            host = f"[{host}]"
        return f"{host}:{self.port}"

    @property
    def num_connections(self):
        return lib.collie_store_server_num_connections(self._h)

    def close(self):
        h, self._h = self._h, None
        if h:
            lib.collie_store_server_destroy(h)


class Store(Closable):
    """A client of a collie store server ("host:port"; None: COLLIE_STORE_ADDR).
    `timeout` is the default for every request (seconds; None: collie's)."""

    def __init__(self, engine, address=None, token=None, timeout=None, _handle=None, _parent=None):
        self._engine = engine
        self._parent = _parent
        if _handle is not None:
            self._h = _handle
            return
        if not isinstance(engine, Engine):
            raise TypeError("engine: a collie.Engine")
        opts = _lib.StoreOpts(
            sizeof(_lib.StoreOpts), token.encode() if token else None, timeout_ms(timeout), 0
        )
        h = c_void_p()
        check(
            lib.collie_store_connect(
                engine.handle, address.encode() if address else None, byref(opts), byref(h)
            ),
            f"store address {address!r}",
        )
        self._h = h.value

    @property
    def handle(self):
        if not self._h:
            raise ValueError("the store handle is closed")
        return self._h

    @property
    def address(self):
        return lib.collie_store_address(self.handle).decode()

    def prefix(self, prefix):
        """A view whose keys all start with `prefix`."""
        h = c_void_p()
        check(lib.collie_store_prefix(self.handle, _key(prefix, "prefix"), byref(h)))
        return Store(self._engine, _handle=h.value, _parent=self)

    def close(self):
        h, self._h = self._h, None
        if h:
            lib.collie_store_destroy(h)

    # ---- requests: each *_async posts and returns the Work --------------------

    def _post(self, what, fn, args, timeout, keep=()):
        return self._engine.post(what, fn, (self.handle,) + tuple(args), keep, timeout, owner=self)

    def set_async(self, key, value, timeout=None):
        v = _val(value)
        return self._post("store.set", lib.collie_store_post_set, (_key(key), v, len(v)), timeout, v)

    def get_async(self, key, timeout=None):
        return self._post("store.get", lib.collie_store_post_get, (_key(key),), timeout)

    def set(self, key, value, timeout=None):
        self.set_async(key, value, timeout).wait()

    def get(self, key, timeout=None):
        """The value (bytes); waits until the key exists, bounded by the timeout."""
        w = self.get_async(key, timeout)
        w.wait()
        return _value(w)

    def add(self, key, delta=1, timeout=None):
        w = self._post("store.add", lib.collie_store_post_add, (_key(key), int(delta)), timeout)
        w.wait()
        return _int(w)

    def compare_set(self, key, expected, desired, timeout=None):
        e, d = _val(expected, "expected"), _val(desired, "desired")
        w = self._post(
            "store.compare_set",
            lib.collie_store_post_compare_set,
            (_key(key), e, len(e), d, len(d)),
            timeout,
            (e, d),
        )
        w.wait()
        return _value(w)

    def check(self, keys, timeout=None):
        arr, n, ks = _keys(keys)
        w = self._post("store.check", lib.collie_store_post_check, (arr, n), timeout, ks)
        w.wait()
        return _int(w) == 1

    def wait(self, keys, timeout=None):
        arr, n, ks = _keys(keys)
        self._post("store.wait", lib.collie_store_post_wait, (arr, n), timeout, ks).wait()

    def delete(self, key, timeout=None):
        w = self._post("store.delete", lib.collie_store_post_delete, (_key(key),), timeout)
        w.wait()
        return _int(w) == 1

    def delete_prefix(self, prefix, timeout=None):
        w = self._post(
            "store.delete_prefix", lib.collie_store_post_delete_prefix, (_key(prefix),), timeout
        )
        w.wait()
        return _int(w)

    def num_keys(self, timeout=None):
        w = self._post("store.num_keys", lib.collie_store_post_num_keys, (), timeout)
        w.wait()
        return _int(w)

    def multi_get(self, keys, timeout=None):
        arr, n, ks = _keys(keys)
        w = self._post("store.multi_get", lib.collie_store_post_multi_get, (arr, n), timeout, ks)
        w.wait()
        out = []
        for i in range(n):
            ptr, ln = c_void_p(), c_size_t()
            check(lib.collie_store_work_value_at(w._h, i, byref(ptr), byref(ln)))
            out.append(ctypes.string_at(ptr, ln.value) if ln.value else b"")
        return out

    def multi_set(self, items, timeout=None):
        """Set every (key, value) of a dict or pair sequence at once."""
        pairs = list(items.items() if hasattr(items, "items") else items)
        ks = [_key(k) for k, _ in pairs]
        vs = [_val(v) for _, v in pairs]
        karr = (c_char_p * len(ks))(*ks)
        varr = (c_void_p * len(vs))(*[ctypes.cast(c_char_p(v), c_void_p) for v in vs])
        larr = (c_size_t * len(vs))(*[len(v) for v in vs])
        self._post(
            "store.multi_set",
            lib.collie_store_post_multi_set,
            (karr, varr, larr, len(ks)),
            timeout,
            (ks, vs),
        ).wait()

    def append(self, key, value, timeout=None):
        v = _val(value)
        self._post(
            "store.append", lib.collie_store_post_append, (_key(key), v, len(v)), timeout, v
        ).wait()

    def barrier(self, key, n, timeout=None):
        """Wait until `n` clients have entered the barrier on `key`."""
        if int(n) <= 0:
            raise ValueError(f"n: {n} participants (must be > 0)")
        self._post("store.barrier", lib.collie_store_post_barrier, (_key(key), int(n)), timeout).wait()
