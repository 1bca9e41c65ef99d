"""A third-party sink registered through the ``lapidus.plugins`` entry-point group, as an
installed distribution would register it, checked by the real ``lapidus -t`` command."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest


@pytest.fixture
def pager_plugin(tmp_path):
    """A package ``lapidus_pager`` and its dist-info, on a directory put on PYTHONPATH."""
    site = tmp_path / "site"
    (site / "lapidus_pager").mkdir(parents=True)
    (site / "lapidus_pager" / "__init__.py").write_text(textwrap.dedent("""
        from lapidus.sinks.base import Sink

        class PagerSink(Sink):
            @classmethod
            def validate(cls, options):
                if not isinstance(options.get("url"), str):
                    return [("url", "missing: the URL to post to")]
                return []

            async def send(self, records):
                pass
    """))
    info = site / "lapidus_pager-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: lapidus-pager\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(
        "[lapidus.plugins]\npager = lapidus_pager:PagerSink\n")
    return site


def check(tmp_path, site, plugins: dict):
    """``lapidus -t`` on a configuration with ``plugins``: (exit code, standard error)."""
    config = tmp_path / "lapidus.json"
    config.write_text(json.dumps({
        "state_dir": str(tmp_path / "state"),
        "backends": [{"name": "shop", "type": "postgresql", "database": "shop"}],
        "plugins": plugins}))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [str(site), *filter(None, [os.environ.get("PYTHONPATH")])]))
    result = subprocess.run([sys.executable, "-m", "lapidus", "-t", "-c", str(config)],
                            capture_output=True, text=True, timeout=60, env=env)
    return result.returncode, result.stdout + result.stderr


def test_a_third_party_plugin_is_found_and_its_options_checked(tmp_path, pager_plugin):
    code, out = check(tmp_path, pager_plugin, {"pager": {"url": "https://example.test/"}})
    assert code == 0, out
    code, out = check(tmp_path, pager_plugin, {"pager": {}})
    assert code == 2
    assert "plugins.pager.url: missing: the URL to post to" in out


def test_an_unknown_plugin_name_fails_the_check_and_lists_the_installed_ones(tmp_path,
                                                                             pager_plugin):
    code, out = check(tmp_path, pager_plugin, {"pagr": {}, "nats": {"servr": "x"}})
    assert code == 2
    assert 'plugins.pagr: unknown plugin "pagr"' in out and "pager" in out
    assert "plugins.nats.servr: unknown option" in out        # every problem, not the first
