"""The installed package (pip install .) as a user gets it: one version everywhere, the kvflash
program on PATH beside the module, ml_dtypes among its requirements."""
import importlib.metadata
import os
import shutil
import subprocess
import sys

import pytest

import kvflash

# tests/python/gpu_run.sh assembles the package on PYTHONPATH without installing it (the GPU machine
# has no network for pip's build dependencies) and says so: the installed-package checks below do
# not apply there. Everywhere else (CI, a user's pip install) they run.
installed_only = pytest.mark.skipif(os.environ.get("KVFLASH_PACKAGE_NOT_INSTALLED") == "1",
                                    reason="the package is assembled on PYTHONPATH, not installed (gpu_run.sh)")


@installed_only
def test_module_and_metadata_have_the_same_version():
    assert kvflash.__version__ == importlib.metadata.version("kvflash")
    assert kvflash.__version__.count(".") == 2


@installed_only
def test_kvflash_program_is_installed_with_the_module():
    # The wheel's script lands beside the interpreter (venv bin/, or the user/system scripts dir).
    program = shutil.which("kvflash", path=os.path.dirname(sys.executable) + os.pathsep + os.environ["PATH"])
    assert program is not None, "the kvflash program was not installed with the package"
    version = subprocess.run([program, "--version"], check=True, capture_output=True, text=True).stdout
    assert version.startswith(f"kvflash {kvflash.__version__} ")


@installed_only
def test_ml_dtypes_is_a_requirement():
    requirements = importlib.metadata.requires("kvflash") or []
    assert any(r.split(">")[0].split("=")[0].strip() == "ml_dtypes" and "extra" not in r for r in requirements)


@pytest.mark.skipif(not sys.platform.startswith("linux") or shutil.which("nm") is None, reason="needs ELF and nm")
def test_extension_exports_only_its_init():
    # The static archives linked into the module (kvflash's library, the CUDA runtime, libstdc++
    # where the toolchain links it statically) must not leak into the process's symbol space: an
    # exported static libstdc++ broke ml_dtypes imported after kvflash (python/CMakeLists.txt).
    from kvflash import _kvflash

    listing = subprocess.run(["nm", "-D", "--defined-only", _kvflash.__file__], check=True,
                             capture_output=True, text=True).stdout
    names = [line.split()[-1] for line in listing.splitlines() if line.strip()]
    assert "PyInit__kvflash" in names
    leaked = [n for n in names if n != "PyInit__kvflash" and
              ("kvflash" in n or n.startswith(("cuda", "__cuda", "_ZN4cuda")) or "St6locale" in n)]
    assert not leaked, f"{len(leaked)} symbols of the linked archives exported, e.g. {leaked[:3]}"
