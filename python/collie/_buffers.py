"""Turning Python objects into (pointer, element count, collie dtype).

Design notes
- Host buffers: numpy arrays, torch CPU tensors, and anything with the
  buffer protocol (bytearray, memoryview, array.array, mmap). Each must be
  C-contiguous, and writable where collie writes; its element type must be
  one of collie's dtypes (or be named by dtype= for untyped bytes). Any
  mismatch is a TypeError / ValueError naming the argument, before collie
  sees anything.
- torch and numpy are never imported here: an object is recognised by its
  type's module, so the package works without either installed.
- Device buffers (collie_cuda.h): an int pointer with count and dtype, or
  an object with __cuda_array_interface__ (torch CUDA tensors, CuPy).
- The Buffer keeps the Python object alive; the works hold their Buffers
  until their completion is observed (see _engine.py).
"""

import ctypes

# collie_dtype values (collie.h)
DTYPES = {
    "int8": 0,
    "uint8": 1,
    "int32": 2,
    "int64": 3,
    "float16": 4,
    "bfloat16": 5,
    "float32": 6,
    "float64": 7,
}
DTYPE_NAMES = {v: k for k, v in DTYPES.items()}
ITEMSIZE = {0: 1, 1: 1, 2: 4, 3: 8, 4: 2, 5: 2, 6: 4, 7: 8}
_ALIASES = {
    "fp16": "float16",
    "half": "float16",
    "bf16": "bfloat16",
    "fp32": "float32",
    "float": "float32",
    "fp64": "float64",
    "double": "float64",
    "int": "int32",
    "long": "int64",
}
# buffer-protocol format characters (struct module) -> dtype name
_FORMATS = {
    "b": "int8",
    "B": "uint8",
    "c": "uint8",
    "e": "float16",
    "f": "float32",
    "d": "float64",
}
_INT_FORMATS = {"h", "H", "i", "I", "l", "L", "q", "Q", "n", "N"}


class Buffer:
    __slots__ = ("obj", "ptr", "count", "dtype", "keep")

    def __init__(self, obj, ptr, count, dtype, keep=None):
        self.obj = obj
        self.ptr = ptr
        self.count = count
        self.dtype = dtype
        self.keep = keep  # e.g. the memoryview / ctypes array pinning obj

    @property
    def nbytes(self):
        return self.count * ITEMSIZE[self.dtype]


def dtype_code(dtype, what="dtype"):
    """collie's dtype code for a name, numpy dtype or torch dtype."""
    if dtype is None:
        return None
    if isinstance(dtype, int) and not isinstance(dtype, bool):
        if dtype in DTYPE_NAMES:
            return dtype
        raise ValueError(f"{what}: {dtype} is not a collie dtype code (0..7)")
    name = str(dtype)
    if name.startswith("torch."):
        name = name[len("torch.") :]
    name = _ALIASES.get(name, name)
    if name in DTYPES:
        return DTYPES[name]
    raise TypeError(
        f"{what}: {dtype} is not a type collie reduces or moves "
        f"(use one of {', '.join(DTYPES)})"
    )


def _kind(obj):
    mod = type(obj).__module__ or ""
    if mod.startswith("torch"):
        return "torch"
    if mod.startswith("numpy"):
        return "numpy"
    return "buffer"


def host_buffer(obj, what, writable, dtype=None):
    """A Buffer for a host object; `what` names the argument in errors."""
    if obj is None:
        raise TypeError(f"{what}: a buffer is required, got None")
    kind = _kind(obj)
    want = dtype_code(dtype, what) if dtype is not None else None
    if kind == "torch":
        if not hasattr(obj, "data_ptr"):
            raise TypeError(f"{what}: {type(obj).__name__} is not a tensor")
        if obj.device.type != "cpu":
            raise TypeError(
                f"{what}: a {obj.device.type} tensor; the host collectives take CPU "
                "tensors (CUDA buffers go through comm.cuda_*)"
            )
        if not obj.is_contiguous():
            raise ValueError(f"{what}: the tensor is not contiguous (call .contiguous())")
        code = dtype_code(obj.dtype, what)
        if want is not None and want != code:
            raise TypeError(f"{what}: the tensor is {obj.dtype}, dtype= says {DTYPE_NAMES[want]}")
        return Buffer(obj, obj.data_ptr(), obj.numel(), code)
    if kind == "numpy":
        if not hasattr(obj, "ctypes") or not hasattr(obj, "flags"):
            raise TypeError(f"{what}: {type(obj).__name__} is not an array")
        if not obj.flags.c_contiguous:
            raise ValueError(f"{what}: the array is not C-contiguous (numpy.ascontiguousarray)")
        if writable and not obj.flags.writeable:
            raise ValueError(f"{what}: the array is read-only and collie writes into it")
        code = dtype_code(obj.dtype.name, what)
        if want is not None and want != code:
            raise TypeError(f"{what}: the array is {obj.dtype}, dtype= says {DTYPE_NAMES[want]}")
        return Buffer(obj, obj.ctypes.data, obj.size, code)
    try:
        mv = memoryview(obj)
    except TypeError:
        raise TypeError(
            f"{what}: {type(obj).__name__} is not a buffer "
            "(pass a numpy array, a CPU tensor or a bytes-like object)"
        ) from None
    if not mv.c_contiguous:
        raise ValueError(f"{what}: the buffer is not C-contiguous")
    if writable and mv.readonly:
        raise ValueError(f"{what}: the buffer is read-only and collie writes into it")
    fmt = mv.format.lstrip("@=<")
    if fmt in _FORMATS:
        code = DTYPES[_FORMATS[fmt]]
    elif fmt in _INT_FORMATS and mv.itemsize in (4, 8) and fmt.islower():
        code = DTYPES["int32" if mv.itemsize == 4 else "int64"]
    else:
        code = None
    if want is not None:
        if code is not None and code != want and fmt not in ("B", "c"):
            raise TypeError(
                f"{what}: the buffer holds '{mv.format}' items, dtype= says {DTYPE_NAMES[want]}"
            )
        code = want
    if code is None:
        raise TypeError(
            f"{what}: buffer format '{mv.format}' is no collie dtype (name one with dtype=)"
        )
    if mv.nbytes % ITEMSIZE[code]:
        raise ValueError(f"{what}: {mv.nbytes} bytes is not a whole number of {DTYPE_NAMES[code]}")
    if mv.nbytes == 0:
        return Buffer(obj, None, 0, code, mv)
    if mv.readonly:
        # a read-only send buffer: only bytes gives its address without a copy
        if not isinstance(obj, bytes):
            raise TypeError(f"{what}: read-only {type(obj).__name__}; pass bytes or a bytearray")
        addr = ctypes.cast(ctypes.c_char_p(obj), ctypes.c_void_p).value
        return Buffer(obj, addr, mv.nbytes // ITEMSIZE[code], code, mv)
    cbuf = (ctypes.c_char * mv.nbytes).from_buffer(mv)
    return Buffer(obj, ctypes.addressof(cbuf), mv.nbytes // ITEMSIZE[code], code, (mv, cbuf))


def device_buffer(obj, what, count=None, dtype=None):
    """A Buffer for a CUDA buffer: an int device pointer (count and dtype
    required) or an object with __cuda_array_interface__."""
    if isinstance(obj, int) and not isinstance(obj, bool):
        if count is None or dtype is None:
            raise TypeError(f"{what}: a raw device pointer needs count= and dtype=")
        if count < 0:
            raise ValueError(f"{what}: count {count} < 0")
        return Buffer(obj, obj or None, int(count), dtype_code(dtype, what))
    cai = getattr(obj, "__cuda_array_interface__", None)
    if cai is None:
        raise TypeError(
            f"{what}: {type(obj).__name__} is no CUDA buffer "
            "(pass a device pointer with count= and dtype=, or a CUDA tensor)"
        )
    shape = tuple(cai["shape"])
    n = 1
    for s in shape:
        n *= s
    typestr = cai["typestr"]
    by_typestr = {
        "|i1": "int8",
        "|u1": "uint8",
        "<i4": "int32",
        "<i8": "int64",
        "<f2": "float16",
        "<f4": "float32",
        "<f8": "float64",
    }
    if typestr in by_typestr:
        code = DTYPES[by_typestr[typestr]]
    elif typestr == "<V2" and dtype is not None:
        code = dtype_code(dtype, what)  # bfloat16 has no typestr of its own
    else:
        raise TypeError(f"{what}: CUDA array type '{typestr}' is no collie dtype")
    strides = cai.get("strides")
    if strides is not None:
        expect, step = [], ITEMSIZE[code]
        for s in reversed(shape):
            expect.append(step)
            step *= s
        if tuple(reversed(expect)) != tuple(strides) and n > 1:
            raise ValueError(f"{what}: the CUDA array is not contiguous")
    if count is not None and count != n:
        raise ValueError(f"{what}: count={count} but the array holds {n} elements")
    return Buffer(obj, cai["data"][0] or None, n, code)


def stream_handle(stream):
    """A cudaStream_t as an int (None: the default stream) from an int or an
    object with .cuda_stream (torch.cuda.Stream)."""
    if stream is None:
        return None
    if isinstance(stream, int) and not isinstance(stream, bool):
        return stream or None
    s = getattr(stream, "cuda_stream", None)
    if isinstance(s, int):
        return s or None
    raise TypeError(
        f"stream: an int cudaStream_t or a CUDA stream object, got {type(stream).__name__}"
    )
