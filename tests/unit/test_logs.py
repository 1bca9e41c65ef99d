"""Log lines of several processes sharing one standard error stay whole.

The supervisor and its children all write JSON lines to the same standard error.  Each line
must reach it in one write: with ``PYTHONUNBUFFERED=1`` (usual in containers) a ``print`` writes
the text and its newline separately, and another process's line could land between the two.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

WRITER = """
import sys
from lapidus import logs
logs.configure("json", "info", process=sys.argv[1])
log = logs.get_logger()
for i in range(int(sys.argv[2])):
    log.info("a record", i=i, pad="x" * 40)
"""


def test_json_lines_of_concurrent_processes_are_never_torn(tmp_path):
    path = tmp_path / "shared.log"
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    with open(path, "ab") as err:
        procs = [subprocess.Popen([sys.executable, "-c", WRITER, f"p{n}", "3000"], stderr=err,
                                  env=env) for n in range(3)]
        for proc in procs:
            assert proc.wait(60) == 0
    lines = path.read_text().splitlines()
    records = [json.loads(line) for line in lines]       # a torn line would not parse
    assert len(records) == 9000
    for n in range(3):
        assert sorted(r["i"] for r in records if r["process"] == f"p{n}") == list(range(3000))
