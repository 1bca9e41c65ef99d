"""`lapidus demo`: the newcomer's first minute."""

from __future__ import annotations

import json
import signal
import subprocess
import sys

from tests.conftest import wait_until
from tests.integration.conftest import pg_connect


def test_demo_streams_rows_and_removes_its_slot_on_ctrl_c(tmp_path):
    out_path, err_path = tmp_path / "out.jsonl", tmp_path / "err.log"
    with open(out_path, "wb") as out, open(err_path, "wb") as err:
        proc = subprocess.Popen([sys.executable, "-m", "lapidus", "demo"], stdout=out,
                                stderr=err, start_new_session=True)
    try:
        def events():
            lines = out_path.read_bytes().splitlines()
            return [json.loads(line) for line in lines] if len(lines) >= 5 else None

        got = wait_until(events, 60, message="the demo's five events")
        assert [e["type"] for e in got[:5]] == ["insert", "insert", "insert", "update", "delete"]
        assert {e["table"] for e in got} == {"demo_items"}
        assert got[0]["item"]["price"] == "1.50"
        proc.send_signal(signal.SIGINT)     # what Ctrl-C sends
        assert proc.wait(20) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
    assert "Traceback" not in err_path.read_text()
    conn = pg_connect()
    with conn.cursor() as cur:
        cur.execute("SELECT count(*) FROM pg_replication_slots WHERE slot_name = 'lapidus_demo'")
        assert cur.fetchone()[0] == 0
    conn.close()
    demo_db = pg_connect("lapidus_demo")
    with demo_db.cursor() as cur:
        cur.execute("SELECT count(*) FROM pg_publication")
        assert cur.fetchone()[0] == 0, "the demo left its publication behind"
    demo_db.close()
