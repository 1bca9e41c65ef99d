"""The walkthroughs in examples/ run as their READMEs are written.

Each example folder is copied to a fresh directory and its README's ``sh`` blocks run there in
order, in one shell session (what a block exports is there for the next ones), with the venv's
commands first on PATH.  A block that begins with ``# in a second terminal`` (Lapidus itself)
runs in the background until the last block, the clean-up, which comes after the page's
Ctrl-C.  A ``text`` block is the output the page promises for the ``sh`` block before it: that
block runs again until its output is exactly that (Lapidus applies changes asynchronously), with
a deadline.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.integration.test_quickstarts import BLOCK

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
SECOND_TERMINAL = "# in a second terminal"


def run_example(name: str, workdir: Path) -> None:
    folder = workdir / name
    shutil.copytree(ROOT / "examples" / name, folder)
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}:{os.environ['PATH']}")
    steps = BLOCK.findall((folder / "README.md").read_text())
    last_sh = max(i for i, (lang, _) in enumerate(steps) if lang == "sh")
    log = folder / "lapidus.log"
    lapidus = None
    previous = None

    def shell(code: str) -> subprocess.CompletedProcess:
        script = f". ./.exports 2>/dev/null || true\n{code}\nexport -p > .exports\n"
        return subprocess.run(["bash", "-euo", "pipefail", "-c", script], cwd=folder, env=env,
                              capture_output=True, text=True, timeout=120)

    try:
        for index, (lang, code) in enumerate(steps):
            if lang == "text":
                deadline = time.monotonic() + 60
                while True:
                    result = shell(previous)
                    if result.returncode == 0 and result.stdout.strip() == code.strip():
                        break
                    if time.monotonic() > deadline:
                        pytest.fail(f"{name}: block {index} promises\n{code}\nbut the block "
                                    f"before it gives\n{result.stdout}{result.stderr}\nlog: "
                                    f"{log.read_text()[-3000:] if log.exists() else ''}")
                    time.sleep(0.2)
                continue
            if lang != "sh":
                continue
            if index == last_sh and lapidus is not None:
                lapidus.send_signal(signal.SIGINT)          # the page's Ctrl-C
                assert lapidus.wait(30) == 0, log.read_text()[-3000:]
                lapidus = None
            if code.startswith(SECOND_TERMINAL):
                with open(log, "wb") as out:
                    script = f". ./.exports 2>/dev/null || true\nexec {code.split(chr(10), 1)[1]}"
                    lapidus = subprocess.Popen(["bash", "-c", script], cwd=folder, env=env,
                                               stdout=out, stderr=subprocess.STDOUT,
                                               stdin=subprocess.DEVNULL)
                deadline = time.monotonic() + 60
                while "streaming" not in log.read_text():
                    if time.monotonic() > deadline or lapidus.poll() is not None:
                        pytest.fail(f"{name}: lapidus not streaming; log: {log.read_text()}")
                    time.sleep(0.1)
                continue
            result = shell(code)
            assert result.returncode == 0, f"{name}, block {index}:\n{code}\n{result.stderr}"
            previous = code
    finally:
        if lapidus is not None:
            lapidus.kill()
            lapidus.wait(10)


def _clean(mariadb: str, *psql: str) -> None:
    subprocess.run(["mariadb", "-e", mariadb], capture_output=True, timeout=60)
    for statement in psql:
        subprocess.run(["runuser", "-u", "postgres", "--", "psql", "-q", "-c", statement],
                       capture_output=True, timeout=60)


def test_mysql_to_postgres(tmp_path):
    def clean():
        _clean("DROP DATABASE IF EXISTS example_shop; "
               "DROP USER IF EXISTS 'lapidus_example'@'127.0.0.1';",
               "DROP DATABASE IF EXISTS example_replica WITH (FORCE)",
               "DROP ROLE IF EXISTS lapidus_example")
    clean()
    try:
        run_example("mysql-to-postgres", tmp_path)
    finally:
        clean()


def test_materialized_view(tmp_path):
    def clean():
        _clean("DROP DATABASE IF EXISTS example_mv; "
               "DROP USER IF EXISTS 'lapidus_mv'@'127.0.0.1';",
               "DROP DATABASE IF EXISTS example_mv WITH (FORCE)",
               "DROP ROLE IF EXISTS lapidus_mv")
    clean()
    try:
        run_example("materialized-view", tmp_path)
    finally:
        clean()
    log = (tmp_path / "materialized-view" / "lapidus.log").read_text()
    # debounced: the burst of four changes (three transactions) made one refresh
    assert log.count("refreshed customer_totals") == 1, log[-3000:]
