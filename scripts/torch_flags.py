"""Print the compiler and linker flags for collie's torch extension
(python/collie/torch/process_group_collie.cpp), as torch.utils.cpp_extension
would use them, for the Makefile. Run with the Python of the torch it builds
against: Debian's /usr/bin/python3 for torch 1.13 (make python), the venv's
for torch 2.x (make torch2)."""

import sys
import sysconfig

import torch
import torch.utils.cpp_extension as ce

flags = [
    f"-D_GLIBCXX_USE_CXX11_ABI={int(torch._C._GLIBCXX_USE_CXX11_ABI)}",
    "-DTORCH_EXTENSION_NAME=_C",
    "-DTORCH_API_INCLUDE_EXTENSION_H",
]
for name in ("COMPILER_TYPE", "STDLIB", "BUILD_ABI"):
    value = getattr(torch._C, f"_PYBIND11_{name}", None)
    if value is not None:
        flags.append(f'-DPYBIND11_{name}="{value}"')
flags += [f"-isystem {p}" for p in ce.include_paths()]
flags.append(f"-isystem {sysconfig.get_paths()['include']}")
flags += [f"-L{p} -Wl,-rpath,{p}" for p in ce.library_paths()]
flags += ["-lc10", "-ltorch", "-ltorch_cpu", "-ltorch_python"]
sys.stdout.write(" ".join(flags) + "\n")
