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
def webhook_plugin(tmp_path):
    """A package ``lapidus_webhook`` and its dist-info, on a directory put on PYTHONPATH."""
    site = tmp_path / "site"
    (site / "lapidus_webhook").mkdir(parents=True)
    (site / "lapidus_webhook" / "__init__.py").write_text(textwrap.dedent("""
        from lapidus.sinks.base import Sink

        class WebhookSink(Sink):
            @classmethod
            def validate(cls, options):
                if not isinstance(options.get("url"), str):
                    return [("url", "missing: the URL to post to")]
                return []

            async def send(self, records):
                pass
    """))
    info = site / "lapidus_webhook-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: lapidus-webhook\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(
        "[lapidus.plugins]\nwebhook = lapidus_webhook:WebhookSink\n")
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


def test_a_third_party_plugin_is_found_and_its_options_checked(tmp_path, webhook_plugin):
    code, out = check(tmp_path, webhook_plugin, {"webhook": {"url": "https://example.test/"}})
    assert code == 0, out
    code, out = check(tmp_path, webhook_plugin, {"webhook": {}})
    assert code == 2
    assert "plugins.webhook.url: missing: the URL to post to" in out


def test_an_unknown_plugin_name_fails_the_check_and_lists_the_installed_ones(tmp_path,
                                                                             webhook_plugin):
    code, out = check(tmp_path, webhook_plugin, {"webhok": {}, "nats": {"servr": "x"}})
    assert code == 2
    assert 'plugins.webhok: unknown plugin "webhok"' in out and "webhook" in out
    assert "plugins.nats.servr: unknown option" in out        # every problem, not the first
