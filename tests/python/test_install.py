"""`make install` puts the package beside the library: the installed package
loads the installed libcollie (not the build tree's), and its torch backend
loads from there too; `make uninstall` removes it."""

import os
import subprocess
import sys

from conftest import ROOT


def test_installed_package_loads_the_installed_library(tmp_path):
    dest = tmp_path / "root"
    subprocess.run(["make", "-s", "-C", ROOT, "install", f"DESTDIR={dest}", "PREFIX=/usr/local"],
                   check=True, capture_output=True, timeout=600)
    site = dest / "usr/local/lib/python3/dist-packages"
    code = ("import collie, os; print(os.path.realpath(collie.library_path)); "
            "print(collie.Engine().stats()['residents'])")
    env = dict(os.environ, PYTHONPATH=str(site))
    env.pop("COLLIE_LIB", None)
    out = subprocess.run([sys.executable, "-c", code], env=env, cwd=str(tmp_path),
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    path, residents = out.stdout.split()
    assert path.startswith(str(dest / "usr/local/lib/libcollie.so")), path
    assert residents == "0"
    # each torch's extension, installed beside the package: 1.13's as _C.so,
    # a torch 2.x's (make torch2) as _C_torch2.so, picked by the importing torch
    code = ("import collie.torch, torch.distributed as d; "
            "print('COLLIE' in d.Backend._plugins, collie.torch._C.__file__)")
    torch2 = os.path.join(ROOT, "build", "torch2-venv", "bin", "python")
    for ext, python in (("_C.so", sys.executable), ("_C_torch2.so", torch2)):
        if not (site / "collie/torch" / ext).exists() or not os.path.exists(python):
            continue
        out = subprocess.run([python, "-c", code], env=env, cwd=str(tmp_path),
                             capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stderr
        assert out.stdout.split() == ["True", str(site / "collie/torch" / ext)], out.stdout
    subprocess.run(["make", "-s", "-C", ROOT, "uninstall", f"DESTDIR={dest}", "PREFIX=/usr/local"],
                   check=True, capture_output=True, timeout=600)
    assert not (site / "collie").exists()
