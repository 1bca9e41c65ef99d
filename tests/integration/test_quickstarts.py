"""The quickstarts run as they are written (docs/quickstart-*.md).

Every ``sh`` block of a page runs in order, in a fresh directory, with the venv's commands
first on PATH; blocks that begin with ``# once per machine`` (installing packages, server
settings that need a restart) are what scripts/setup-local already did here, and are left out.
The block that runs ``lapidus ... --stdout`` runs in the background, as in a second terminal;
each ``json`` block after it lists events the page promises, and they must arrive in that
order with those field values. Lapidus is stopped (the page's Ctrl-C) before the last block,
which cleans up.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path


from tests.conftest import wait_until

ROOT = Path(__file__).resolve().parents[2]
BLOCK = re.compile(r"^```(\w+)\n(.*?)^```", re.S | re.M)


def blocks(page: str):
    return BLOCK.findall((ROOT / "docs" / page).read_text())


def promised(events, expected):
    """``events`` start with ``expected``: each expected field has the same value."""
    return len(events) >= len(expected) and all(
        all(event.get(key) == value for key, value in want.items())
        for event, want in zip(events, expected))


def run_page(page: str, workdir: Path) -> None:
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}:{os.environ['PATH']}")
    steps = [(lang, code) for lang, code in blocks(page)
             if not (lang == "sh" and code.startswith("# once per machine"))]
    last_sh = max(i for i, (lang, _) in enumerate(steps) if lang == "sh")
    out_path, err_path = workdir / "stdout.jsonl", workdir / "stderr.log"
    lapidus = None
    seen = 0

    def events():
        data = out_path.read_bytes() if out_path.exists() else b""
        return [json.loads(line) for line in data[:data.rfind(b"\n") + 1].splitlines()]

    try:
        for index, (lang, code) in enumerate(steps):
            if lang == "json" and lapidus is not None:
                expected = [json.loads(line) for line in code.splitlines() if line.strip()]
                wait_until(lambda: promised(events()[seen:], expected), 60,
                           message=f"{page}: the events of block {index}:\n{code}\n"
                                   f"got: {events()[seen:]}\nlog: {err_path.read_text()[-2000:]}")
                seen += len(expected)
                continue
            if lang != "sh":
                continue
            if index == last_sh and lapidus is not None:
                lapidus.send_signal(signal.SIGINT)          # the page's Ctrl-C
                assert lapidus.wait(30) == 0, err_path.read_text()[-2000:]
                lapidus = None
            # one terminal: what a block exports is there for the next ones
            script = f". ./.exports 2>/dev/null || true\n{code}\nexport -p > .exports\n"
            if "--stdout" in code:
                with open(out_path, "wb") as out, open(err_path, "wb") as err:
                    lapidus = subprocess.Popen(
                        ["bash", "-c", script.replace("\nlapidus ", "\nexec lapidus ")],
                        cwd=workdir, env=env, stdout=out, stderr=err, stdin=subprocess.DEVNULL)
                # the page's reader sees the log say so before going on
                wait_until(lambda: "streaming" in err_path.read_text(), 60,
                           message=f"{page}: lapidus streaming; log: {err_path.read_text()}")
                continue
            result = subprocess.run(["bash", "-euo", "pipefail", "-c", script], cwd=workdir,
                                    env=env, capture_output=True, text=True, timeout=120)
            assert result.returncode == 0, f"{page}, block {index}:\n{code}\n{result.stderr}"
    finally:
        if lapidus is not None:
            lapidus.kill()
            lapidus.wait(10)


def _psql(*statements: str) -> None:
    for statement in statements:
        subprocess.run(["runuser", "-u", "postgres", "--", "psql", "-q", "-c", statement],
                       capture_output=True, timeout=60)


def _pg_clean() -> None:
    _psql("SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots "
          "WHERE slot_name = 'lapidus_quickstart'",
          "DROP DATABASE IF EXISTS quickstart", "DROP ROLE IF EXISTS lapidus")


def test_the_postgresql_quickstart(tmp_path):
    _pg_clean()
    try:
        run_page("quickstart-postgresql.md", tmp_path)
    finally:
        _pg_clean()


def _maria_clean() -> None:
    subprocess.run(["mariadb", "-e", "DROP DATABASE IF EXISTS quickstart; "
                    "DROP USER IF EXISTS 'lapidus'@'127.0.0.1';"],
                   capture_output=True, timeout=60)


def test_the_mysql_quickstart(tmp_path):
    _maria_clean()
    try:
        run_page("quickstart-mysql.md", tmp_path)
    finally:
        _maria_clean()
