"""The package's ctypes declarations against collie.h (with its parts
collie_store.h and collie_comm.h) and collie_cuda.h:
every declared function exists in the headers with the same number of
parameters and matching C types, and every option/stats structure has the
header's fields in the header's order."""

import ctypes
import os
import re

import pytest

from collie import _lib

INCLUDE = os.path.join(os.path.dirname(__file__), "..", "..", "include")


def headers():
    text = ""
    for name in ("collie.h", "collie_store.h", "collie_comm.h", "collie_cuda.h"):
        with open(os.path.join(INCLUDE, name)) as f:
            text += f.read()
    text = re.sub(r"/\*.*?\*/", "", text, flags=re.S)
    return re.sub(r"\s+", " ", text)


def declarations():
    out = {}
    for m in re.finditer(r"COLLIE_API ([^;(]*?)\b(collie_\w+)\(([^)]*)\);", headers()):
        ret, name, params = m.group(1).strip(), m.group(2), m.group(3).strip()
        args = [] if params in ("", "void") else [p.strip() for p in params.split(",")]
        out[name] = (ret, args)
    return out


ENUMS = {"collie_dtype", "collie_redop", "collie_error_policy", "collie_log_level"}
INTS = {
    "int": ctypes.c_int,
    "int32_t": ctypes.c_int32,
    "int64_t": ctypes.c_int64,
    "uint16_t": ctypes.c_uint16,
    "uint32_t": ctypes.c_uint32,
    "uint64_t": ctypes.c_uint64,
    "size_t": ctypes.c_size_t,
    "bool": ctypes.c_bool,
}


def c_type_of(decl):
    """The ctypes type a C parameter or return type must be declared as
    (a set when several are right)."""
    t = re.sub(r"\b(const|struct)\b", "", decl)
    # drop the parameter name (the last identifier, unless the type is bare)
    t = re.sub(r"\b[a-z_][a-z_0-9]*$", "", t.strip()) if re.search(r"[\s*]\w+$", t.strip()) else t
    t = re.sub(r"\s+", "", t)
    stars = t.count("*")
    base = t.replace("*", "")
    if stars == 0 and base.startswith("collie_") and base.endswith("_fn"):
        return {ctypes.c_void_p}  # a callback: passed as a C function's address
    if stars == 0:
        if base in ENUMS:
            return {ctypes.c_int}
        if base == "void":
            return {None}
        return {INTS[base]}
    if base == "char" and stars == 1:
        return {ctypes.c_char_p}
    if base == "char" and stars == 2:
        return {ctypes.POINTER(ctypes.c_char_p)}
    if base == "void" and stars == 1:
        return {ctypes.c_void_p}
    if base == "void" and stars == 2:
        return {ctypes.POINTER(ctypes.c_void_p)}
    if base in INTS and stars == 1:
        return {ctypes.POINTER(INTS[base])}
    if base in ENUMS and stars == 1:
        return {ctypes.POINTER(ctypes.c_int)}
    if base.startswith("collie_") and (
        base.endswith(("_opts", "_stats", "_details", "_record"))
        or base in ("collie_fault", "collie_peer_health", "collie_comm_event")
    ):
        struct = {
            "collie_engine_opts": _lib.EngineOpts,
            "collie_post_opts": _lib.PostOpts,
            "collie_work_details": _lib.WorkDetails,
            "collie_store_server_opts": _lib.StoreServerOpts,
            "collie_store_opts": _lib.StoreOpts,
            "collie_comm_opts": _lib.CommOpts,
            "collie_comm_stats": _lib.CommStats,
            "collie_engine_stats": _lib.EngineStats,
            "collie_log_record": _lib.LogRecord,
            "collie_fault": _lib.Fault,
            "collie_peer_health": _lib.PeerHealth,
            "collie_comm_event": _lib.CommEvent,
            "collie_shrink_opts": _lib.ShrinkOpts,
            "collie_grow_opts": _lib.GrowOpts,
        }[base]
        return {ctypes.POINTER(struct)}
    if stars == 1:  # an opaque object (collie_comm *, cudaStream_t is below)
        return {ctypes.c_void_p}
    if stars == 2:
        return {ctypes.POINTER(ctypes.c_void_p)}
    raise AssertionError(f"no ctypes rule for '{decl}'")


def test_every_declared_function_matches_the_header():
    decls = declarations()
    assert len(decls) > 100
    for name, (res, args) in _lib.SIGNATURES.items():
        assert name in decls, f"{name} is declared in _lib.py but not in the headers"
        cret, cargs = decls[name]
        cargs = ["collie_comm *s" if a.startswith("collie_cuda_stream_t") else a for a in cargs]
        assert len(args) == len(cargs), f"{name}: {len(args)} arguments, the header has {len(cargs)}"
        assert res in c_type_of(cret), f"{name}: returns {res}, the header says '{cret}'"
        for i, (a, c) in enumerate(zip(args, cargs)):
            assert a in c_type_of(c), f"{name}: argument {i} is {a}, the header says '{c}'"


def header_struct_fields(name):
    m = re.search(r"typedef struct " + name + r" \{(.*?)\} " + name + ";", headers())
    assert m, name
    fields = []
    for decl in m.group(1).split(";"):
        decl = decl.strip()
        if decl:
            fields.append(re.findall(r"\w+", decl.replace("[", " [").split("[")[0])[-1])
    return [f for fs in [[f] for f in fields] for f in fs]


@pytest.mark.parametrize(
    "cname,struct",
    [
        ("collie_engine_opts", _lib.EngineOpts),
        ("collie_post_opts", _lib.PostOpts),
        ("collie_work_details", _lib.WorkDetails),
        ("collie_store_server_opts", _lib.StoreServerOpts),
        ("collie_store_opts", _lib.StoreOpts),
        ("collie_comm_opts", _lib.CommOpts),
        ("collie_comm_stats", _lib.CommStats),
        ("collie_engine_stats", _lib.EngineStats),
        ("collie_latency_histogram", _lib.LatencyHistogram),
        ("collie_log_record", _lib.LogRecord),
        ("collie_shrink_opts", _lib.ShrinkOpts),
        ("collie_grow_opts", _lib.GrowOpts),
    ],
)
def test_structures_match_the_header(cname, struct):
    want = header_struct_fields(cname)
    have = [f for f, _ in struct._fields_]
    # "int64_t post_ns, start_ns, ..." declares several fields at once
    expanded = []
    text = re.search(r"typedef struct " + cname + r" \{(.*?)\} " + cname, headers()).group(1)
    for decl in text.split(";"):
        decl = decl.strip()
        if not decl:
            continue
        names = [n.strip() for n in decl.split(",")]
        first = re.findall(r"\w+", names[0].split("[")[0])[-1]
        expanded.append(first)
        expanded += [re.findall(r"\w+", n)[-1] for n in names[1:]]
    assert have == expanded, f"{cname}: fields {have}, the header has {expanded} ({want})"


def test_constants_match_the_header():
    h = headers()
    for name, value in (("LATENCY_BUCKETS", _lib.LATENCY_BUCKETS), ("STATS_OPS", _lib.STATS_OPS),
                        ("STATS_STATUSES", _lib.STATS_STATUSES)):
        assert re.search(rf"#define COLLIE_{name} {value}\b", h), name
    from collie._buffers import DTYPES
    from collie.comm import POLICIES, REDOPS

    for c, v in (("INT8", 0), ("UINT8", 1), ("INT32", 2), ("INT64", 3), ("FP16", 4), ("BF16", 5),
                 ("FP32", 6), ("FP64", 7)):
        assert re.search(rf"COLLIE_{c} = {v},", h)
    assert DTYPES["bfloat16"] == 5 and DTYPES["float16"] == 4
    for c, v in (("SUM", "sum"), ("PROD", "prod"), ("MIN", "min"), ("MAX", "max"), ("AVG", "avg")):
        assert re.search(rf"COLLIE_{c} = {REDOPS[v]},", h)
    order = re.search(r"typedef enum collie_error_policy \{(.*?)\}", h).group(1)
    names = re.findall(r"COLLIE_POLICY_(\w+)", order)
    assert [POLICIES[n.lower()] for n in names] == list(range(len(names)))


def test_fault_health_and_event_structs_match_the_header(tmp_path):
    """The ctypes mirrors of collie_fault, collie_peer_health and
    collie_comm_event have the C layout: sizes and every field's offset,
    from a program compiled against the header."""
    import shutil
    import subprocess

    cc = shutil.which("cc")
    assert cc, "no C compiler (the build needs one)"
    mirrors = {"collie_fault": _lib.Fault, "collie_peer_health": _lib.PeerHealth,
               "collie_comm_event": _lib.CommEvent}
    lines = ["#include <stddef.h>", "#include <stdio.h>", "#include <collie.h>", "int main(void) {"]
    for cname, py in mirrors.items():
        lines.append(f'printf("SIZE {cname} %zu\\n", sizeof({cname}));')
        for f, _ in py._fields_:
            lines.append(f'printf("OFF {cname}.{f} %zu\\n", offsetof({cname}, {f}));')
    lines += ["return 0;", "}"]
    src = tmp_path / "layout.c"
    src.write_text("\n".join(lines) + "\n")
    exe = tmp_path / "layout"
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    subprocess.run([cc, "-std=c11", "-I", os.path.join(root, "include"), str(src), "-o", str(exe)],
                   check=True, timeout=120)
    got = subprocess.run([str(exe)], check=True, capture_output=True, text=True, timeout=30).stdout
    seen = 0
    for line in got.splitlines():
        what, name, value = line.split()
        if what == "SIZE":
            actual = ctypes.sizeof(mirrors[name])
        else:
            cname, field = name.split(".")
            actual = getattr(mirrors[cname], field).offset
        assert int(value) == actual, f"{name}: C says {value}, ctypes {actual}"
        seen += 1
    assert seen == sum(1 + len(py._fields_) for py in mirrors.values())
