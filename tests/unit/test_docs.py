"""The documentation's checks that need no server: configuration blocks pass ``lapidus -t``'s
validation, and the site builds with no broken link or anchor (``mkdocs build --strict``)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from lapidus.config import ConfigError
from lapidus.config.validate import parse_config
from lapidus.sinks import registry

ROOT = Path(__file__).resolve().parents[2]
BLOCK = re.compile(r"^```(toml|json)\n(.*?)^```", re.S | re.M)
PAGES = sorted((ROOT / "docs").glob("*.md")) + [ROOT / "README.md", ROOT / "systemd/README.md"]


def configuration_blocks():
    """(page, block) for every TOML block (but a pyproject.toml) and every JSON block that
    is a configuration (has ``backends`` or ``plugins``; the others are events)."""
    for page in PAGES:
        for lang, code in BLOCK.findall(page.read_text()):
            if lang == "toml":
                if "pyproject.toml" in code.splitlines()[0]:
                    continue
                yield page, tomllib.loads(code)
                continue
            try:
                data = json.loads(code)
            except ValueError:
                continue                    # JSON lines of events
            if isinstance(data, dict) and ("backends" in data or "plugins" in data):
                yield page, data


def test_every_configuration_block_of_the_docs_is_valid():
    blocks = list(configuration_blocks())
    assert len(blocks) > 5
    problems = []
    for page, data in blocks:
        if "backends" not in data:
            # a fragment of another section ([http], [plugins.nats] ...): checked beside a
            # minimal backend
            data = {**data, "backends": [{"type": "postgresql", "database": "placeholder"}]}
        try:
            parse_config(data, source=str(page), env={},
                         plugin_validators=registry.validators(), secrets_optional=True)
        except ConfigError as exc:
            # files the examples name (a CA bundle in /etc/lapidus) are not on this machine
            real = [p for p in exc.problems if "no such file" not in p]
            if real:
                problems.append(f"{page.relative_to(ROOT)}: {real}")
    assert problems == []


@pytest.mark.skipif(shutil.which("mkdocs", path=str(Path(sys.executable).parent)) is None,
                    reason="mkdocs is in the dev extra")
def test_the_site_builds_with_no_broken_link(tmp_path):
    result = subprocess.run(
        [str(Path(sys.executable).parent / "mkdocs"), "build", "--strict", "--site-dir",
         str(tmp_path / "site")], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]


def test_monitoring_lists_every_metric_and_only_those():
    source = (ROOT / "lapidus" / "supervisor" / "metrics.py").read_text()
    exported = set(re.findall(r'\("(lapidus_[a-z_]+)", "(?:counter|gauge)"', source))
    documented = set(re.findall(r"^\| `(lapidus_[a-z_]+)` \|",
                                (ROOT / "docs" / "monitoring.md").read_text(), re.M))
    assert len(exported) > 20
    assert documented == exported


def test_every_message_troubleshooting_quotes_is_one_lapidus_prints():
    source = "\n".join(path.read_text() for path in (ROOT / "lapidus").rglob("*.py"))
    quoted = re.findall(r"^\| `([^`]+)` \|", (ROOT / "docs" / "troubleshooting.md").read_text(),
                        re.M)
    assert len(quoted) >= 30
    assert [q for q in quoted if q not in source] == []
