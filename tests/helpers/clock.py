"""The clock shim (tests/clockshim.c): an LD_PRELOAD library that moves a server's wall clock by
the offset written in a file, built once per test process with the machine's gcc."""

import shutil
import subprocess
from pathlib import Path

SHIM_SOURCE = Path(__file__).resolve().parent.parent / "clockshim.c"


def build_shim(directory):
    """Builds the shim into `directory`; its path."""
    gcc = shutil.which("gcc") or shutil.which("cc")
    assert gcc, "a moved clock needs gcc to build tests/clockshim.c"
    out = Path(directory) / "clockshim.so"
    done = subprocess.run([gcc, "-shared", "-fPIC", "-O2", "-o", str(out), str(SHIM_SOURCE)],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, f"cannot build the clock shim:\n{done.stderr}"
    return out
