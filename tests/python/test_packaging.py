"""The installed package (pip install .) as a user gets it: one version everywhere, the kvflash
program on PATH beside the module, ml_dtypes among its requirements."""
import importlib.metadata
import os
import shutil
import subprocess
import sys

import kvflash


def test_module_and_metadata_have_the_same_version():
    assert kvflash.__version__ == importlib.metadata.version("kvflash")
    assert kvflash.__version__.count(".") == 2


def test_kvflash_program_is_installed_with_the_module():
    # The wheel's script lands beside the interpreter (venv bin/, or the user/system scripts dir).
    program = shutil.which("kvflash", path=os.path.dirname(sys.executable) + os.pathsep + os.environ["PATH"])
    assert program is not None, "the kvflash program was not installed with the package"
    version = subprocess.run([program, "--version"], check=True, capture_output=True, text=True).stdout
    assert version.startswith(f"kvflash {kvflash.__version__} ")


def test_ml_dtypes_is_a_requirement():
    requirements = importlib.metadata.requires("kvflash") or []
    assert any(r.split(">")[0].split("=")[0].strip() == "ml_dtypes" and "extra" not in r for r in requirements)
