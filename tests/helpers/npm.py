"""Node.js packages the tests run (pinned in a package.json beside the script that uses them):
taken from the script's own folder when `npm install` was run there, otherwise installed once
per test run into a folder that every test process of the run shares (pytest-xdist workers
included), under a lock so that one process installs while the others wait.
"""

import fcntl
import json
import shutil
import subprocess
from pathlib import Path

TIMEOUT = 300


def installed_version(directory, package):
    try:
        meta = json.loads((Path(directory) / "node_modules" / package / "package.json").read_text())
        return meta.get("version")
    except (OSError, ValueError):
        return None


def npm_folder(tmp_path_factory, source, files, package, version):
    """A folder with `files` (copied from `source`) and `package` at `version` in its
    node_modules: `source` itself when it has that version installed."""
    source = Path(source)
    if installed_version(source, package) == version:
        return source
    assert shutil.which("npm"), f"npm is needed to install {package} {version}"
    # The base temporary folder of this process; under xdist its parent is the run's, shared.
    base = tmp_path_factory.getbasetemp()
    shared = base.parent if base.name.startswith("popen-gw") else base
    directory = shared / f"npm-{package}-{version}"
    directory.mkdir(exist_ok=True)
    with open(shared / f"npm-{package}-{version}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if installed_version(directory, package) != version:
            for f in files:
                shutil.copy(source / f, directory / f)
            done = subprocess.run(["npm", "install", "--no-audit", "--no-fund",
                                   "--no-package-lock", "--loglevel=error"],
                                  cwd=directory, capture_output=True, timeout=TIMEOUT)
            assert done.returncode == 0, \
                f"npm install failed:\n{done.stderr.decode(errors='replace')}"
            assert installed_version(directory, package) == version
    return directory
