"""What the supervisor imports before it starts children (each import is resident in every
process forked from it): asyncio deferred past structlog's import of it, only the configured
sink plugins loaded by the configuration check.  Each case runs in a fresh interpreter."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap


def fresh(code: str) -> dict:
    """Run ``code`` in a new interpreter; it prints one JSON object, returned."""
    out = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_the_lapidus_command_loads_neither_asyncio_nor_ssl():
    seen = fresh("""
        import json, sys
        import lapidus.cli, lapidus.supervisor.arbiter
        print(json.dumps({"asyncio": type(sys.modules.get("asyncio")).__name__,
                          "loaded": [m for m in ("asyncio.base_events", "ssl", "_asyncio")
                                     if m in sys.modules]}))
    """)
    assert seen == {"asyncio": "DeferredModule", "loaded": []}


def test_a_deferred_asyncio_loads_on_first_use_and_serves_every_holder():
    seen = fresh("""
        import json, sys
        import lapidus.logs                     # defers asyncio, then imports structlog
        import asyncio                          # the stand-in
        import structlog.stdlib

        async def answer():
            return structlog.stdlib.asyncio.get_running_loop() is not None

        ran = asyncio.run(answer())             # the first attribute loads the real module
        import asyncio.subprocess               # a submodule, through the real package
        print(json.dumps({"ran": ran, "real": type(sys.modules["asyncio"]).__name__,
                          "same_run": asyncio.run is sys.modules["asyncio"].run,
                          "queue": asyncio.Queue.__module__}))
    """)
    assert seen == {"ran": True, "real": "module", "same_run": True,
                    "queue": "asyncio.queues"}


def test_the_configuration_check_loads_only_the_plugins_it_names():
    seen = fresh("""
        import json, sys
        from lapidus.config import parse_config
        from lapidus.sinks import registry
        config = {"backends": [{"name": "pg", "type": "postgresql", "database": "d",
                                "user": "u", "slot": "s"}],
                  "plugins": {"stdout": {}, "redis": {"url": "redis://127.0.0.1"}}}
        parse_config(config, plugin_validators=registry.validators())
        print(json.dumps(sorted(m for m in ("lapidus.sinks.stdout", "lapidus.sinks.redis",
                                            "lapidus.sinks.sync", "lapidus.sinks.nats",
                                            "psycopg2") if m in sys.modules)))
    """)
    assert seen == ["lapidus.sinks.redis", "lapidus.sinks.stdout"]


def test_an_unknown_plugin_still_lists_every_known_one():
    seen = fresh("""
        import json
        from lapidus.config import ConfigError, parse_config
        from lapidus.sinks import registry
        try:
            parse_config({"backends": [{"name": "pg", "type": "postgresql", "database": "d",
                                        "user": "u", "slot": "s"}],
                          "plugins": {"redsi": {}}}, plugin_validators=registry.validators())
        except ConfigError as exc:
            print(json.dumps(str(exc)))
    """)
    assert 'unknown plugin "redsi"' in seen and 'did you mean "redis"' in seen
    assert "webhook" in seen and "stdout" in seen
