"""Configuration loading and validation (lapidus.config, lapidus.settings).  No servers needed."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from lapidus import config as config_module
from lapidus import settings as S
from lapidus.config import (
    BackendConfig, Config, ConfigError, load_config, mask_uri, parse_config,
)

ROOT = Path(__file__).resolve().parents[2]
CONF = ROOT / "conf"
SAMPLE_PASSWORD = "2PQM9aiKMJX5chv76gYdFJNi"
EXAMPLE_ENV = {"SHOP_PG_PASSWORD": "pg-Secret-1", "CRM_MYSQL_PASSWORD": "my-Secret-2",
               "CMS_MONGO_PASSWORD": "mongo-Secret-3"}

# The TOML example of the design notes (CONFIG.md), one over-long comment shortened.
DESIGN_TOML = '''
state_dir = "/var/lib/lapidus"          # checkpoints and spool files

[log]
format = "json"                         # "console" when attached to a terminal
level = "info"

[control]
socket = "/run/lapidus/lapidus.sock"    # lapidusctl talks here; mode 0600

[http]
listen = "127.0.0.1:9187"               # /metrics (Prometheus) and /healthz; off when absent

[[backends]]
name = "shop"                           # default: derived from type and database
type = "postgresql"                     # postgresql | mysql | mongo
host = "127.0.0.1"
port = 5432
user = "lapidus"
password = "${SHOP_PG_PASSWORD}"        # ${VAR} reads the environment
database = "shop"
slot = "lapidus_shop"
exclude_tables = ["sessions", "audit_*"]   # globs on "table" or "schema.table"
include_tables = []                        # empty: everything not excluded

[backends.plugins.nats]                 # per-backend plugins replace the global ones
server = "nats://127.0.0.1:4222"

[plugins.nats]
servers = ["nats://127.0.0.1:4222"]
jetstream = true
subject_prefix = ""

[plugins.stdout]
'''


@pytest.fixture(autouse=True)
def not_root(monkeypatch):
    """Tests run as root here; default paths must not depend on who runs the suite."""
    monkeypatch.setattr(config_module, "_running_as_root", lambda: False)


def pg(**extra):
    return {"type": "postgresql", "database": "shop", **extra}


def parse(*backends, env=None, **top):
    return parse_config({"backends": list(backends), **top}, source="/etc/lapidus/lapidus.toml",
                        env={} if env is None else env)


def problems(*backends, env=None, plugin_validators=None, **top):
    with pytest.raises(ConfigError) as info:
        parse_config({"backends": list(backends), **top}, source="/etc/lapidus/lapidus.toml",
                     env={} if env is None else env, plugin_validators=plugin_validators)
    err = info.value
    assert str(err) == "\n".join(err.problems)
    return err.problems


def write(tmp_path, name, text):
    path = tmp_path / name
    path.write_text(text)
    return path


# --------------------------------------------------------------------------------------------
# The original Lapidus sample and the shipped examples


def test_original_sample_validates_unchanged():
    cfg = load_config(CONF / "original-sample.json", env={})
    assert [b.name for b in cfg.backends] == [
        "mysql_jacob", "mysql_sawyer", "postgresql_lapidus", "postgresql_hurley", "mongo_lapidus"]
    jacob, sawyer, lapidus_pg, hurley, mongo = cfg.backends
    assert jacob.type == "mysql"
    assert jacob.options["host"] == "127.0.0.1"           # from "hostname"
    assert jacob.options["user"] == "jacob"               # from "username"
    assert jacob.options["server_id"] == 1                # from "serverId"
    assert jacob.options["password"] == SAMPLE_PASSWORD
    assert jacob.exclude_tables == ("sessions",)          # from "excludeTables"
    assert sawyer.options["server_id"] == 2 and sawyer.exclude_tables == ()
    assert lapidus_pg.options["slot"] == "lapidus_slot" and hurley.options["slot"] == "hurley_slot"
    assert mongo.type == "mongo" and mongo.options["replica_set"] == "rs0"
    assert mongo.options["user"] == "lapidus"
    assert cfg.plugins == {"nats": {"server": "nats://localhost:4222"}}
    assert all(cfg.plugins_for(b) == cfg.plugins for b in cfg.backends)
    assert cfg.source == str((CONF / "original-sample.json").absolute())


def test_original_sample_is_the_design_sample_verbatim():
    design = Path("/work/shared/design/CONFIG.md")
    if not design.exists():
        pytest.skip("design notes not available here")
    block = design.read_text().split("```json\n", 1)[1].split("```", 1)[0]
    assert (CONF / "original-sample.json").read_text() == block


@pytest.mark.parametrize("name", ["lapidus.toml", "lapidus.json"])
def test_shipped_examples_load(name):
    cfg = load_config(CONF / name, env=EXAMPLE_ENV)
    assert {b.type for b in cfg.backends} == {"postgresql", "mysql", "mongo"}
    assert [b.name for b in cfg.backends] == ["shop", "mysql_crm", "cms"]
    shop, crm, cms = cfg.backends
    assert shop.options["password"] == "pg-Secret-1"
    assert shop.exclude_tables == ("sessions", "audit_*")
    assert shop.options["spool_max_bytes"] == 2**30
    assert crm.options["server_id"] == 4711
    assert set(cfg.plugins) == {"nats", "stdout"}
    assert set(cfg.plugins_for(shop)) == {"nats"}              # its own plugins replace global
    assert set(cfg.plugins_for(crm)) == {"nats", "stdout"}
    assert cfg.http is not None and (cfg.http.host, cfg.http.port) == ("127.0.0.1", 9187)


def test_toml_and_json_examples_describe_the_same_setup():
    views = []
    for name in ("lapidus.toml", "lapidus.json"):
        view = load_config(CONF / name, env=EXAMPLE_ENV).redacted()
        view.pop("source")
        # The TOML example connects to MongoDB with a uri, the JSON one with the original's keys.
        for key in ("uri", "host", "port", "user", "password", "auth_source", "replica_set"):
            view["backends"][2].pop(key)
        views.append(view)
    assert views[0] == views[1]


def test_design_toml_example_loads():
    cfg = parse_config(__import__("tomllib").loads(DESIGN_TOML), source="<design>",
                       env={"SHOP_PG_PASSWORD": "x"})
    (shop,) = cfg.backends
    assert shop.name == "shop" and shop.options["password"] == "x"
    assert cfg.control.socket == Path("/run/lapidus/lapidus.sock")
    assert cfg.log.format == "json"
    assert cfg.plugins_for(shop) == {"nats": {"server": "nats://127.0.0.1:4222"}}


# --------------------------------------------------------------------------------------------
# Each kind of problem


def test_unknown_backend_type():
    assert problems(pg(), pg(database="b"), {"type": "oracle"}) == [
        'backends[2].type: unknown backend type "oracle" (expected postgresql, mysql, mongo)']


def test_backend_type_near_miss_gets_a_hint():
    (msg,) = problems({"type": "mariadb"})
    assert msg.endswith('(expected postgresql, mysql, mongo) (did you mean "mysql"?)')


def test_missing_type():
    assert problems({"database": "x"}) == [
        "backends[0].type: missing (expected postgresql, mysql, mongo)"]


def test_misspelt_key_suggests_the_nearest():
    assert problems(pg(hostnme="db")) == ['backends[0].hostnme: unknown key (did you mean '
                                          '"hostname"?)']


def test_camel_case_spelling_suggests_the_snake_case_key():
    (msg,) = problems({"type": "mongo", "authSource": "admin"})
    assert msg == 'backends[0].authSource: unknown key (did you mean "auth_source"?)'


def test_misspelt_key_in_a_backend_of_unknown_type_is_still_reported():
    msgs = problems({"type": "oracle", "hostname": "x", "exclude_tabels": []})
    assert 'backends[0].exclude_tabels: unknown key (did you mean "exclude_tables"?)' in msgs
    assert not any("hostname" in m for m in msgs)


def test_key_of_another_backend_type():
    assert problems(pg(serverId=3)) == [
        "backends[0].serverId: not a postgresql setting (serverId applies to mysql backends)"]


def test_bad_port():
    assert problems(pg(), pg(database="x", port="abc")) == [
        'backends[1].port: expected an integer from 1 to 65535, got "abc"']
    assert problems(pg(port=0)) == ["backends[0].port: expected an integer from 1 to 65535, got 0"]
    assert problems(pg(port=True)) == [
        "backends[0].port: expected an integer from 1 to 65535, got true"]


def test_bad_choice_suggests():
    assert problems(pg(decoder="wal2jsn")) == [
        'backends[0].decoder: expected one of auto, pgoutput, wal2json, got "wal2jsn" '
        '(did you mean "wal2json"?)']


def test_missing_required_database():
    assert problems({"type": "postgresql"}) == [
        "backends[0].database: missing (required for postgresql backends: Database to stream "
        "(logical decoding is per database))"]


def test_no_backends():
    assert problems() == ["backends: empty: configure at least one backend"]
    with pytest.raises(ConfigError) as info:
        parse_config({"plugins": {}}, env={})
    assert info.value.problems == ['backends: missing: configure at least one backend '
                                   '([[backends]] in TOML, "backends": [...] in JSON)']
    with pytest.raises(ConfigError) as info:
        parse_config({"backends": {"type": "mysql"}}, env={})
    assert info.value.problems == [
        "backends: expected a list of backend tables ([[backends]] in TOML), got a table"]


def test_backend_not_a_table():
    assert problems(pg(), "mysql") == ['backends[1]: expected a table, got "mysql"']


def test_unknown_top_level_key():
    assert problems(pg(), lgo={}) == ['lgo: unknown key (did you mean "log"?)']
    assert problems(pg(), zzz=1) == [
        "zzz: unknown key (expected one of backends, cluster, control, http, log, plugins, "
        "state_dir, supervisor)"]


def test_bad_values_in_sections():
    msgs = problems(pg(), log={"level": "verbose", "format": "xml"}, http={"listen": "9187"},
                    supervisor={"max_restarts": -1, "backoff_initial": 10, "backoff_max": 2})
    assert msgs == [
        'log.format: expected one of auto, json, console, got "xml"',
        'log.level: expected one of debug, info, warning, error, got "verbose"',
        'http.listen: expected "host:port" such as "127.0.0.1:9187" (port 0 picks a free port), '
        'got "9187"',
        "supervisor.max_restarts: expected an integer >= 0, got -1",
        "supervisor.backoff_max: must be at least backoff_initial (10), got 2",
    ]


def test_http_without_listen():
    assert problems(pg(), http={}) == [
        "http.listen: missing (required: Address of the status page (`/`), `/metrics` "
        "(Prometheus) and `/healthz`)"]


def test_invalid_and_duplicate_names():
    msgs = problems(pg(name="shop eu"), pg(name="a"), pg(name="a", database="b"))
    assert msgs == [
        'backends[0].name: expected a name of 1 to 64 letters, digits, "_" or "-", got "shop eu"',
        'backends[2].name: duplicate backend name "a" (also used by backends[1]); names must be '
        'unique',
    ]


def test_invalid_slot_name():
    assert problems(pg(slot="Shop-Slot")) == [
        'backends[0].slot: expected a slot name of 1 to 63 lowercase letters, digits or "_", '
        'got "Shop-Slot"']


def test_two_backends_sharing_a_slot_on_one_server():
    msgs = problems(pg(slot="s"), pg(database="other", slot="s"),
                    pg(database="third", slot="s", port=5433))
    assert msgs == ['backends[1].slot: slot "s" is also used by backends[0] on 127.0.0.1:5432; '
                    'give each backend its own slot']


def test_two_mysql_backends_sharing_a_server_id():
    msgs = problems({"type": "mysql", "serverId": 7}, {"type": "mysql", "server_id": 7,
                                                       "database": "b"})
    assert msgs == ["backends[1].server_id: server_id 7 is also used by backends[0] on "
                    "127.0.0.1:3306; give each backend its own server_id"]


def test_server_id_range():
    assert problems({"type": "mysql", "server_id": 0}) == [
        "backends[0].server_id: expected an integer from 1 to 4294967295, got 0"]


def test_spool_cap_below_segment():
    assert problems(pg(spool_segment_bytes="64MiB", spool_max_bytes="1MiB")) == [
        "backends[0].spool_max_bytes: must be at least spool_segment_bytes (67108864), "
        "got 1048576"]


def test_table_patterns_must_be_a_list_of_strings():
    assert problems(pg(excludeTables="sessions")) == [
        'backends[0].excludeTables: expected a list of table patterns such as '
        '["sessions", "audit_*"], got "sessions"']


def test_mongo_uri_with_host_user_password_is_an_error_naming_both():
    msgs = problems({"type": "mongo", "uri": "mongodb://u:pw@db/", "hostname": "db",
                     "password": "pw"})
    assert msgs == ["backends[0].uri: give either uri or host/port/user/password, not both "
                    "(also given: host, password)"]


def test_mongo_uri_must_be_a_mongodb_uri():
    assert problems({"type": "mongo", "uri": "http://x"}) == [
        "backends[0].uri: expected a connection string starting with mongodb:// or "
        "mongodb+srv://, got a string"]


def test_mongo_password_without_user():
    assert problems({"type": "mongo", "password": "pw12345"}) == [
        "backends[0].password: given without user; add user (or username)"]


def test_plugin_options_must_be_a_table():
    msgs = problems(pg(plugins={"nats": "nats://x"}), plugins={"stdout": True})
    assert msgs == [
        'backends[0].plugins.nats: expected a table of options, got "nats://x"; an empty table '
        "enables the plugin with its defaults ({} in JSON, a [backends.plugins.nats] header in "
        "TOML)",
        "plugins.stdout: expected a table of options, got true; an empty table enables the "
        "plugin with its defaults ({} in JSON, a [plugins.stdout] header in TOML)",
    ]


def test_socket_path_too_long():
    msgs = problems(pg(), state_dir="/" + "d" * 120)
    assert msgs == ["control.socket: the path is 134 bytes long, a Unix socket path allows "
                    "107; set control.socket to a shorter path (the default lies in state_dir)"]


def test_toml_syntax_error_names_file_line_and_column(tmp_path):
    path = write(tmp_path, "lapidus.toml", 'state_dir = "/x"\n[log]\nlevel = \n')
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert info.value.problems == [f"{path}:3:9: invalid TOML: Invalid value"]


def test_json_syntax_error_names_file_line_and_column(tmp_path):
    path = write(tmp_path, "lapidus.json", '{\n  "backends": [\n    {"type": "mysql",}\n  ]\n}\n')
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert info.value.problems == [
        f"{path}:3:22: invalid JSON: Expecting property name enclosed in double quotes"]


def test_json_key_given_twice(tmp_path):
    path = write(tmp_path, "x.json", '{"backends": [{"type": "mysql", "port": 1, "port": 2}]}')
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert info.value.problems == ["backends[0].port: given twice in the same object; keep one"]


def test_json_top_level_must_be_an_object(tmp_path):
    path = write(tmp_path, "x.json", "[]")
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert info.value.problems == [f"{path}: expected an object at the top level, got a list"]


def test_unreadable_and_non_utf8_files(tmp_path):
    with pytest.raises(ConfigError) as info:
        load_config(tmp_path / "nope.toml")
    assert info.value.problems == [f"{tmp_path / 'nope.toml'}: cannot read the configuration "
                                   f"file: No such file or directory"]
    path = tmp_path / "latin1.toml"
    path.write_bytes(b'state_dir = "/x"\n# caf\xe9\n')
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert info.value.problems == [f"{path}:2: not UTF-8 text"]


def test_every_problem_is_reported_at_once():
    msgs = problems(
        pg(hostnme="x", port="abc", decoder="nope"),
        {"type": "mysql", "password": "${MISSING}", "server_id": -1},
        {"type": "oracle"},
        log={"level": "loud"},
        plugins={"stdout": 1},
    )
    assert len(msgs) == 8
    # grouped in file order: backends first (as written above), then log, then plugins
    assert [m.split(":")[0] for m in msgs] == [
        "backends[0].hostnme", "backends[0].port", "backends[0].decoder",
        "backends[1].password", "backends[1].server_id", "backends[2].type",
        "log.level", "plugins.stdout"]


# --------------------------------------------------------------------------------------------
# Aliases


def test_aliases_in_toml_file(tmp_path):
    path = write(tmp_path, "lapidus.toml", """
[[backends]]
type = "mysql"
hostname = "db1"
username = "jacob"
serverId = 42
excludeTables = ["sessions"]
includeTables = ["jacob.*"]

[[backends]]
type = "mongo"
hostname = "db2"
replicaSet = "rs0"

[plugins.nats]
publishEventData = true
cachePrefix = "lap"
""")
    cfg = load_config(path, env={})
    mysql, mongo = cfg.backends
    assert (mysql.options["host"], mysql.options["user"], mysql.options["server_id"]) == (
        "db1", "jacob", 42)
    assert mysql.exclude_tables == ("sessions",) and mysql.include_tables == ("jacob.*",)
    assert "hostname" not in mysql.options and "serverId" not in mysql.options
    assert mongo.options["replica_set"] == "rs0" and mongo.options["host"] == "db2"
    assert cfg.plugins["nats"] == {"publish_event_data": True, "cache_prefix": "lap"}


def test_aliases_in_json_file(tmp_path):
    path = write(tmp_path, "lapidus.json", json.dumps({
        "backends": [{"type": "postgresql", "hostname": "db", "username": "u", "database": "d",
                      "excludeTables": ["a"],
                      "plugins": {"nats": {"publishEventData": False}}}]}))
    (backend,) = load_config(path, env={}).backends
    assert (backend.options["host"], backend.options["user"]) == ("db", "u")
    assert backend.exclude_tables == ("a",)
    assert backend.plugins == {"nats": {"publish_event_data": False}}


def test_key_and_alias_together_is_an_error_in_toml(tmp_path):
    path = write(tmp_path, "lapidus.toml",
                 '[[backends]]\ntype = "mysql"\nhost = "a"\nhostname = "b"\n')
    with pytest.raises(ConfigError) as info:
        load_config(path, env={})
    assert info.value.problems == ['backends[0].hostname: "hostname" is another name for "host", '
                                   'which is also given; keep only one of them']


def test_key_and_alias_together_is_an_error_in_json(tmp_path):
    path = write(tmp_path, "lapidus.json", json.dumps({"backends": [
        {"type": "mysql", "serverId": 1, "server_id": 2, "excludeTables": [],
         "exclude_tables": []}],
        "plugins": {"x": {"cache_prefix": "a", "cachePrefix": "b"}}}))
    with pytest.raises(ConfigError) as info:
        load_config(path, env={})
    assert info.value.problems == [
        'backends[0].serverId: "serverId" is another name for "server_id", which is also given; '
        'keep only one of them',
        'backends[0].excludeTables: "excludeTables" is another name for "exclude_tables", which '
        'is also given; keep only one of them',
        'plugins.x.cachePrefix: "cachePrefix" is another name for "cache_prefix", which is also '
        'given; keep only one of them',
    ]


# --------------------------------------------------------------------------------------------
# ${VAR}


def test_env_expansion_everywhere():
    env = {"PG_PW": "s3cret-pw", "HOST": "db.internal", "PORT": "6543", "PFX": "prod",
           "TLS": "true"}
    cfg = parse(pg(host="${HOST}", port="${PORT}", password="${PG_PW}",
                   exclude_tables=["${PFX}_*"]),
                {"type": "mongo", "host": "m", "tls": "${TLS}"},
                plugins={"nats": {"subject_prefix": "${PFX}.cdc", "servers": ["nats://${HOST}"]}},
                env=env)
    shop, mongo = cfg.backends
    assert shop.options["host"] == "db.internal"
    assert shop.options["port"] == 6543                       # numbers may come from the env
    assert shop.options["password"] == "s3cret-pw"
    assert shop.exclude_tables == ("prod_*",)
    assert mongo.options["tls"] is True
    assert cfg.plugins["nats"] == {"subject_prefix": "prod.cdc",
                                   "servers": ["nats://db.internal"]}


def test_env_defaults_to_os_environ(monkeypatch):
    monkeypatch.setenv("LAPIDUS_TEST_PW", "from-os-env")
    cfg = parse_config({"backends": [pg(password="${LAPIDUS_TEST_PW}")]})
    assert cfg.backends[0].options["password"] == "from-os-env"


def test_missing_env_var_names_key_and_variable():
    assert problems(pg(password="${SHOP_PG_PASSWORD}")) == [
        "backends[0].password: environment variable SHOP_PG_PASSWORD is not set"]


def test_missing_env_var_is_reported_once_even_for_typed_and_required_keys():
    assert problems({"type": "postgresql", "port": "${PG_PORT}", "database": "${DB}"}) == [
        "backends[0].port: environment variable PG_PORT is not set",
        "backends[0].database: environment variable DB is not set"]
    assert problems(pg(exclude_tables=["a", "${T}"])) == [
        "backends[0].exclude_tables[1]: environment variable T is not set"]


def test_dollar_escape_gives_a_literal():
    cfg = parse(pg(password="pa$${HOME}ss$word"), env={"HOME": "/root"})
    assert cfg.backends[0].options["password"] == "pa${HOME}ss$word"


def test_empty_variable_is_an_empty_string():
    assert parse(pg(password="${EMPTY}"), env={"EMPTY": ""}).backends[0].options["password"] == ""


def test_env_values_are_not_expanded_again():
    cfg = parse(pg(password="${A}"), env={"A": "${B}", "B": "no"})
    assert cfg.backends[0].options["password"] == "${B}"


def test_malformed_references_do_not_echo_the_value():
    msgs = problems(pg(password="abc${unterminated", user="${not a name}"))
    assert msgs == [
        'backends[0].password: unterminated "${" (write "$${" for a literal "${")',
        'backends[0].user: invalid variable reference in "${...}": use letters, digits and "_" '
        '(write "$${" for a literal "${")']


# --------------------------------------------------------------------------------------------
# Names


def test_names_derived_from_type_and_database():
    cfg = parse({"type": "mysql", "database": "jacob"}, pg(database="lapidus"),
                {"type": "mongo"}, pg(database="my shop.eu"))
    assert [b.name for b in cfg.backends] == [
        "mysql_jacob", "postgresql_lapidus", "mongo", "postgresql_my_shop_eu"]


def test_derived_name_collisions_get_a_suffix_and_avoid_explicit_names():
    cfg = parse({"type": "mysql", "database": "a", "server_id": 1},
                {"type": "mysql", "database": "a", "server_id": 2},
                {"type": "mysql", "database": "a", "server_id": 3},
                {"type": "mysql", "name": "mysql_a_4", "database": "x", "server_id": 4},
                {"type": "mysql", "database": "a", "server_id": 5})
    assert [b.name for b in cfg.backends] == [
        "mysql_a", "mysql_a_2", "mysql_a_3", "mysql_a_4", "mysql_a_5"]
    cfg = parse(pg(database="a"), pg(name="postgresql_a", database="b"))
    assert [b.name for b in cfg.backends] == ["postgresql_a_2", "postgresql_a"]


def test_backend_lookup_by_name():
    cfg = parse(pg(name="shop"))
    assert cfg.backend("shop") is cfg.backends[0]
    with pytest.raises(KeyError, match='no backend named "crm" \\(configured: shop\\)'):
        cfg.backend("crm")


# --------------------------------------------------------------------------------------------
# Defaults


def test_postgresql_defaults():
    (b,) = parse(pg(name="Shop-EU")).backends
    assert b.options == {
        "enabled": True, "batch_size": 1000, "batch_linger": 0.003, "max_inflight_batches": 8,
        "on_undeliverable": "hold", "reconnect_max_delay": 30.0,
        "snapshot": "never", "snapshot_chunk_rows": 5000, "snapshot_chunk_timeout": 30.0,
        "host": "127.0.0.1", "port": 5432, "user": "postgres", "password": None,
        "connect_timeout": 10, "passfile": None, "database": "shop",
        "slot": "lapidus_shop_eu", "temporary_slot": False, "decoder": "auto",
        "publication": "lapidus_shop_eu", "publication_mode": "all_tables",
        "publish_via_partition_root": False, "messages": True,
        "sslmode": None, "sslrootcert": None, "sslcert": None, "sslkey": None,
        "fsync_interval": 1.0, "status_interval": 10.0,
        "spool_segment_bytes": 64 * 2**20, "spool_max_bytes": 2**30, "slot_warn_bytes": 2**30,
        "pg_recvlogical": None,
    }
    assert (b.include_tables, b.exclude_tables, b.plugins) == ((), (), None)


def test_derived_slot_is_always_a_valid_slot_name():
    (b,) = parse(pg(name="X" * 64)).backends
    assert b.options["slot"] == "lapidus_" + "x" * 55
    assert S.SLOT_RE.fullmatch(b.options["slot"])


def test_mysql_defaults_and_derived_server_id():
    a, b = parse({"type": "mysql", "name": "crm"}, {"type": "mysql", "name": "erp"}).backends
    assert a.options == {
        "enabled": True, "batch_size": 1000, "batch_linger": 0.003, "max_inflight_batches": 8,
        "on_undeliverable": "hold", "reconnect_max_delay": 30.0,
        "snapshot": "never", "snapshot_chunk_rows": 5000, "snapshot_chunk_timeout": 30.0,
        "host": "127.0.0.1", "port": 3306, "user": "lapidus", "password": None,
        "connect_timeout": 10, "database": None, "server_id": S.derived_server_id("crm"),
        "connect_retry_seconds": None, "heartbeat_seconds": 15.0,
        "allow_partial_row_image": False, "flavor": "auto",
        "ssl_ca": None, "ssl_cert": None, "ssl_key": None, "ssl_verify": None,
    }
    assert 1000 <= a.options["server_id"] <= 4294967295
    assert a.options["server_id"] != b.options["server_id"]
    # stable across runs: a fixed value, not a salted hash()
    assert S.derived_server_id("crm") == S.derived_server_id("crm")
    assert S.derived_server_id("crm", "host-a") == 1000 + int.from_bytes(
        __import__("hashlib").sha256(b"host-a\0crm").digest()[:8], "big") % (4294967295 - 999)
    # the same backend name on two hosts: two ids (a server drops a reader whose id another
    # reader connects with)
    assert S.derived_server_id("crm", "host-a") != S.derived_server_id("crm", "host-b")
    from lapidus.settings.names import host_identity
    assert S.derived_server_id("crm") == S.derived_server_id("crm", host_identity())


def test_mongo_defaults_with_and_without_uri():
    plain, with_uri = parse({"type": "mongo", "user": "u", "password": "pw12345"},
                            {"type": "mongo", "name": "m2", "uri": "mongodb://h/"}).backends
    assert plain.options == {
        "enabled": True, "batch_size": 1000, "batch_linger": 0.003, "max_inflight_batches": 8,
        "on_undeliverable": "hold", "reconnect_max_delay": 30.0,
        "snapshot": "never", "snapshot_chunk_rows": 5000, "snapshot_chunk_timeout": 30.0,
        "uri": None, "host": "127.0.0.1", "port": 27017, "user": "u", "password": "pw12345",
        "database": None, "replica_set": None, "auth_source": None, "tls": None,
        "tls_ca_file": None, "tls_certificate_key_file": None,
        "tls_allow_invalid_certificates": None, "full_document": "updateLookup",
        "full_document_before_change": "off", "history_lost": "fail",
        "snapshot_watermarks": None,
    }
    assert with_uri.options["uri"] == "mongodb://h/"
    assert with_uri.options["host"] is None and with_uri.options["port"] is None


def test_top_level_defaults_for_a_user(monkeypatch):
    cfg = parse(pg(), env={"HOME": "/home/ann"})
    assert cfg.state_dir == Path("/home/ann/.local/state/lapidus")
    assert cfg.control.socket == Path("/home/ann/.local/state/lapidus/lapidus.sock")
    assert cfg.log == config_module.LogConfig(format="auto", level="info")
    assert cfg.http is None
    assert cfg.supervisor == config_module.SupervisorConfig(
        max_restarts=5, restart_window=60.0, backoff_initial=1.0, backoff_max=30.0,
        stop_timeout=10.0)
    assert cfg.plugins == {}
    cfg = parse(pg(), env={"HOME": "/home/ann", "XDG_STATE_HOME": "/xdg"})
    assert cfg.state_dir == Path("/xdg/lapidus")


def test_top_level_defaults_for_root(monkeypatch):
    monkeypatch.setattr(config_module, "_running_as_root", lambda: True)
    cfg = parse(pg(), env={"HOME": "/root"})
    assert cfg.state_dir == Path("/var/lib/lapidus")
    assert cfg.control.socket == Path("/var/lib/lapidus/lapidus.sock")


def test_relative_paths_resolve_against_the_config_directory(tmp_path):
    path = write(tmp_path, "lapidus.toml", """
state_dir = "state"
[control]
socket = "run/ctl.sock"
[[backends]]
type = "postgresql"
database = "d"
passfile = "pgpass"
pg_recvlogical = "pg_recvlogical"
[[backends]]
type = "postgresql"
database = "e"
pg_recvlogical = "bin/pg_recvlogical"
""")
    cfg = load_config(path, env={"HOME": "/home/ann"})
    assert cfg.state_dir == tmp_path / "state"
    assert cfg.control.socket == tmp_path / "run" / "ctl.sock"
    first, second = cfg.backends
    assert first.options["passfile"] == str(tmp_path / "pgpass")
    assert first.options["pg_recvlogical"] == "pg_recvlogical"       # looked up on $PATH
    assert second.options["pg_recvlogical"] == str(tmp_path / "bin" / "pg_recvlogical")
    cfg = parse(pg(passfile="~/.pgpass"), state_dir="~/lap", env={"HOME": "/home/ann"})
    assert cfg.state_dir == Path("/home/ann/lap")
    assert cfg.backends[0].options["passfile"] == "/home/ann/.pgpass"


def test_default_file_lookup(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError) as info:
        load_config(None)
    assert info.value.problems == ["no configuration file: neither ./lapidus.toml nor "
                                   "./lapidus.json exists (give one with -c PATH)"]
    write(tmp_path, "lapidus.json", json.dumps({"backends": [pg(name="from_json")]}))
    assert load_config(None, env={}).backends[0].name == "from_json"
    write(tmp_path, "lapidus.toml", '[[backends]]\ntype = "mysql"\nname = "from_toml"\n')
    cfg = load_config(None, env={})
    assert cfg.backends[0].name == "from_toml"
    assert cfg.source == str(tmp_path / "lapidus.toml")


def test_format_is_sniffed_for_other_suffixes(tmp_path):
    json_file = write(tmp_path, "lapidus.conf", json.dumps({"backends": [pg(name="j")]}))
    toml_file = write(tmp_path, "other.conf", '[[backends]]\ntype = "mysql"\nname = "t"\n')
    assert load_config(json_file, env={}).backends[0].name == "j"
    assert load_config(toml_file, env={}).backends[0].name == "t"


def test_value_forms():
    cfg = parse(pg(spool_segment_bytes="8 MiB", spool_max_bytes="1GB", fsync_interval="0.5",
                   messages="false", enabled=False, include_tables=["public.*"]),
                http={"listen": "[::1]:0"}, log={"level": "debug", "format": "console"},
                supervisor={"restart_window": 30, "max_restarts": "2"})
    (b,) = cfg.backends
    assert b.options["spool_segment_bytes"] == 8 * 2**20
    assert b.options["spool_max_bytes"] == 10**9
    assert b.options["fsync_interval"] == 0.5
    assert b.options["messages"] is False and b.options["enabled"] is False
    assert b.include_tables == ("public.*",)
    assert (cfg.http.host, cfg.http.port) == ("::1", 0)
    assert cfg.log.level == "debug"
    assert cfg.supervisor.restart_window == 30.0 and cfg.supervisor.max_restarts == 2


# --------------------------------------------------------------------------------------------
# Plugins


def test_per_backend_plugins_replace_the_global_set():
    cfg = parse(pg(name="own", plugins={"nats": {"server": "nats://a"}}),
                pg(name="none", database="x", plugins={}),
                pg(name="inherit", database="y"),
                plugins={"nats": {"servers": ["nats://g"]}, "stdout": {}})
    assert cfg.plugins_for("own") == {"nats": {"server": "nats://a"}}
    assert cfg.plugins_for(cfg.backend("none")) == {}
    assert cfg.plugins_for("inherit") == {"nats": {"servers": ["nats://g"]}, "stdout": {}}
    # the result is a copy: changing it does not change the configuration
    cfg.plugins_for("inherit")["stdout"]["x"] = 1
    assert cfg.plugins["stdout"] == {}


def test_with_plugin_reaches_every_backend():
    cfg = parse(pg(name="own", plugins={"nats": {"server": "nats://a"}}),
                pg(name="inherit", database="y"),
                plugins={"nats": {"servers": ["nats://g"]}})
    out = cfg.with_plugin("stdout", {})
    assert set(out.plugins_for("own")) == {"nats", "stdout"}
    assert set(out.plugins_for("inherit")) == {"nats", "stdout"}
    assert out.plugins_for("own")["nats"] == {"server": "nats://a"}
    # the original is untouched (frozen, no shared mutation)
    assert set(cfg.plugins_for("own")) == {"nats"} and "stdout" not in cfg.plugins


def test_with_plugin_keeps_configured_options_unless_given():
    cfg = parse(pg(name="own", plugins={"stdout": {"pretty": True}}),
                pg(name="inherit", database="y"), plugins={"stdout": {"pretty": False}})
    kept = cfg.with_plugin("stdout")
    assert kept.plugins_for("own") == {"stdout": {"pretty": True}}
    assert kept.plugins_for("inherit") == {"stdout": {"pretty": False}}
    replaced = cfg.with_plugin("stdout", {"fields": ["id"]})
    assert replaced.plugins_for("own") == {"stdout": {"fields": ["id"]}}
    assert replaced.plugins_for("inherit") == {"stdout": {"fields": ["id"]}}


def nats_validator(options):
    issues = []
    if "servers" not in options and "server" not in options:
        issues.append(("servers", "missing: give servers = [\"nats://host:4222\"]"))
    if "jetstream" in options and not isinstance(options["jetstream"], bool):
        issues.append(("jetstream", "expected true or false"))
    return issues


VALIDATORS = {"nats": nats_validator, "stdout": lambda options: [], "exec": lambda o: []}


def test_plugin_validators_report_with_full_key_paths():
    msgs = problems(pg(), pg(database="b", plugins={"nats": {"jetstream": "yes"}}),
                    plugins={"nats": {}}, plugin_validators=VALIDATORS)
    assert msgs == [
        'backends[1].plugins.nats.servers: missing: give servers = ["nats://host:4222"]',
        "backends[1].plugins.nats.jetstream: expected true or false",
        'plugins.nats.servers: missing: give servers = ["nats://host:4222"]',
    ]


def test_unknown_plugin_names_only_with_validators():
    cfg = parse(pg(), plugins={"kafka": {}})
    assert cfg.plugins == {"kafka": {}}
    assert problems(pg(plugins={"stdot": {}}), plugins={"kafka": {}},
                    plugin_validators=VALIDATORS) == [
        'backends[0].plugins.stdot: unknown plugin "stdot" (known: exec, nats, stdout; '
        'did you mean "stdout"?)',
        'plugins.kafka: unknown plugin "kafka" (known: exec, nats, stdout)']


def test_plugin_validator_sees_expanded_and_aliased_options():
    seen = []

    def validator(options):
        seen.append(options)
        return [("", "bad as a whole"), ("[0]", "indexed")]

    msgs = problems(pg(), plugins={"p": {"cachePrefix": "${X}", "token": "t"}},
                    plugin_validators={"p": validator}, env={"X": "cx"})
    assert seen == [{"cache_prefix": "cx", "token": "t"}]
    assert msgs == ["plugins.p: bad as a whole", "plugins.p[0]: indexed"]


def test_a_failing_plugin_validator_does_not_hide_other_problems():
    def broken(options):
        raise RuntimeError("oops")

    msgs = problems(pg(port="x"), plugins={"nats": {}}, plugin_validators={"nats": broken})
    assert msgs == ['backends[0].port: expected an integer from 1 to 65535, got "x"',
                    "plugins.nats: the plugin's validator failed: RuntimeError: oops"]


# --------------------------------------------------------------------------------------------
# Secrets


SECRETS = ["pg-pass-Zq1", "uri-pass-Zq2", "nats-tok-Zq3", "SUAseed-Zq4", "creds-Zq5",
           "mongo-pw-Zq6", "tok-url-Zq7"]


def secret_config():
    return parse(
        pg(password="${PGPW}", plugins={"nats": {"servers": ["nats://u:nats-tok-Zq3@h:4222"],
                                                 "nkeys_seed": "SUAseed-Zq4"}}),
        {"type": "mongo", "uri": "mongodb://app:uri-pass-Zq2@m1,m2/?replicaSet=rs0"},
        {"type": "mongo", "name": "m2", "user": "u", "password": "mongo-pw-Zq6"},
        plugins={"nats": {"servers": ["nats://tok-url-Zq7@h:4222"],
                          "user_credentials": "creds-Zq5", "token": "nats-tok-Zq3"},
                 "exec": {"command": ["cat"], "env": {"PGPASSWORD": "pg-pass-Zq1"}}},
        env={"PGPW": "pg-pass-Zq1"})


def test_redacted_view_masks_every_secret():
    cfg = secret_config()
    view = cfg.redacted()
    text = json.dumps(view)                                   # JSON-able
    for secret in SECRETS:
        assert secret not in text
    assert view["backends"][0]["password"] == "***"
    assert view["backends"][1]["uri"] == "mongodb://app:***@m1,m2/?replicaSet=rs0"
    assert view["backends"][0]["plugins"]["nats"]["servers"] == ["nats://u:***@h:4222"]
    assert view["plugins"]["nats"]["servers"] == ["nats://***@h:4222"]
    assert view["plugins"]["nats"]["token"] == "***"
    assert view["plugins"]["exec"]["env"]["PGPASSWORD"] == "***"
    assert view["backends"][2]["user"] == "u"                 # not a secret
    assert view["backends"][0]["uses_plugins"] == ["nats"]
    # the real values are still there for the workers
    assert cfg.backends[0].options["password"] == "pg-pass-Zq1"


def test_reprs_do_not_show_secrets():
    cfg = secret_config()
    text = repr(cfg) + "".join(repr(b) + str(b) for b in cfg.backends)
    for secret in SECRETS:
        assert secret not in text
    assert "BackendConfig(name='postgresql_shop'" in text


def test_error_messages_never_echo_a_password():
    msgs = problems(
        pg(password=12345678, port="pg-pass-Zq1"),               # password typed into port
        {"type": "mongo", "uri": "http://app:uri-pass-Zq2@h", "password": "mongo-pw-Zq6"},
        pg(database="b", password="pg-pass-Zq1", slot="pg-pass-Zq1"),
        plugins={"nats": {"token": "nats-tok-Zq3"}},
        plugin_validators={"nats": lambda o: [("token", f"bad token {o['token']}")]})
    text = "\n".join(msgs)
    for secret in SECRETS + ["12345678"]:
        assert secret not in text
    assert "backends[0].password: expected a string, got a number" in msgs
    assert 'backends[0].port: expected an integer from 1 to 65535, got "***"' in msgs
    assert "plugins.nats.token: bad token ***" in msgs


def test_mask_uri():
    assert mask_uri("postgresql://u:p@h/db") == "postgresql://u:***@h/db"
    assert mask_uri("mongodb://u:p%40ss@h1,h2/x") == "mongodb://u:***@h1,h2/x"
    assert mask_uri("nats://h:4222") == "nats://h:4222"
    assert mask_uri("mongodb://user@h/") == "mongodb://user@h/"           # no password
    assert mask_uri("nats://tok@h,tls://a:b@h2") == "nats://***@h,tls://a:***@h2"


# --------------------------------------------------------------------------------------------
# Declarations and documentation


def test_backend_config_constructor_is_unchanged():
    b = BackendConfig("shop", "postgresql", {"host": "h"}, ("a",), ("b",), None)
    assert (b.name, b.type, b.options, b.include_tables, b.exclude_tables, b.plugins) == (
        "shop", "postgresql", {"host": "h"}, ("a",), ("b",), None)
    assert [f.name for f in dataclasses.fields(BackendConfig)] == [
        "name", "type", "options", "include_tables", "exclude_tables", "plugins"]
    with pytest.raises(dataclasses.FrozenInstanceError):
        b.name = "x"  # type: ignore[misc]


def test_config_is_frozen():
    cfg = parse(pg())
    assert isinstance(cfg, Config)
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.plugins = {}  # type: ignore[misc]


@pytest.mark.parametrize("backend_type", S.BACKEND_TYPES)
def test_each_key_is_declared_once_per_backend_type(backend_type):
    keys = [k for s in S.backend_settings(backend_type) for k in (s.name, *s.aliases)]
    assert len(keys) == len(set(keys))


def test_spec_settings_are_declared():
    names = {t: {s.name for s in S.backend_settings(t)} for t in S.BACKEND_TYPES}
    common = {"name", "type", "include_tables", "exclude_tables", "plugins", "enabled",
              "batch_size", "batch_linger", "max_inflight_batches", "on_undeliverable",
              "reconnect_max_delay", "snapshot", "snapshot_chunk_rows",
              "snapshot_chunk_timeout"}
    assert common <= names["postgresql"] and common <= names["mysql"] and common <= names["mongo"]
    assert names["postgresql"] - common == {
        "host", "port", "user", "password", "passfile", "database", "slot", "temporary_slot",
        "decoder", "publication", "publication_mode", "publish_via_partition_root",
        "messages", "sslmode", "sslrootcert", "sslcert", "sslkey", "connect_timeout",
        "fsync_interval", "status_interval", "spool_segment_bytes", "spool_max_bytes",
        "slot_warn_bytes", "pg_recvlogical"}
    assert names["mysql"] - common == {
        "host", "port", "user", "password", "database", "server_id", "connect_timeout",
        "connect_retry_seconds", "heartbeat_seconds", "allow_partial_row_image", "flavor",
        "ssl_ca", "ssl_cert", "ssl_key", "ssl_verify"}
    assert names["mongo"] - common == {
        "uri", "host", "port", "user", "password", "database", "replica_set", "auth_source",
        "tls", "tls_ca_file", "tls_certificate_key_file", "tls_allow_invalid_certificates",
        "full_document", "full_document_before_change", "history_lost",
        "snapshot_watermarks"}


def test_documentation_is_generated_from_the_declarations():
    doc = (ROOT / "docs" / "configuration.md").read_text()
    start = doc.index(S.DOC_BEGIN)
    end = doc.index(S.DOC_END) + len(S.DOC_END) + 1
    assert doc[start:end] == S.render_markdown(), (
        "docs/configuration.md is out of date: python -m lapidus.settings --write "
        "docs/configuration.md")
    every = S.BACKEND_COMMON + S.BACKEND_TYPED + tuple(
        s for section in S.SECTIONS.values() for s in section)
    for setting in every:
        assert f"`{setting.name}`" in doc[start:end]
        for alias in setting.aliases:
            assert f"`{alias}`" in doc


@pytest.mark.parametrize("key, secret", [
    ("password", True), ("PGPASSWORD", True), ("token", True), ("nkeys_seed", True),
    ("user_credentials", True), ("creds", True), ("api_key", True), ("secretKey", True),
    ("passfile", False), ("tls_certificate_key_file", False), ("user", False),
    ("subject_prefix", False), ("auth_source", False), (None, False),
])
def test_secret_key_detection(key, secret):
    assert S.is_secret_key(key) is secret


# --------------------------------------------------------------------------------------------
# Encodings


@pytest.mark.parametrize("name, body", [
    ("lapidus.toml", '[[backends]]\ntype = "mysql"\nname = "bom"\n'),
    ("lapidus.json", '{"backends": [{"type": "mysql", "name": "bom"}]}'),
    ("lapidus.conf", '{"backends": [{"type": "mysql", "name": "bom"}]}'),   # sniffed as JSON
])
def test_a_utf8_byte_order_mark_is_accepted(tmp_path, name, body):
    path = tmp_path / name
    path.write_bytes(b"\xef\xbb\xbf" + body.encode())
    assert load_config(path, env={}).backends[0].name == "bom"


def test_syntax_errors_after_a_byte_order_mark_keep_their_columns(tmp_path):
    path = tmp_path / "lapidus.toml"
    path.write_bytes(b"\xef\xbb\xbflevel = \n")
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert info.value.problems == [f"{path}:1:9: invalid TOML: Invalid value"]


def test_utf16_text_is_named_as_such(tmp_path):
    path = tmp_path / "lapidus.toml"
    path.write_bytes('[[backends]]\ntype = "mysql"\n'.encode("utf-16"))
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert info.value.problems == [f"{path}: the file is UTF-16 text (it starts with a UTF-16 "
                                   f"byte order mark); save it as UTF-8"]


# --------------------------------------------------------------------------------------------
# Table patterns, element by element


def test_each_bad_table_pattern_is_reported_with_its_index():
    msgs = problems(pg(include_tables=["orders", "items[", ""], exclude_tables=["a", 7]))
    assert msgs == [
        'backends[0].include_tables[1]: "items[": "[" starts a character class that is never '
        'closed by "]"; write "[[]" for a literal "["',
        "backends[0].include_tables[2]: an empty pattern matches no table; remove it",
        'backends[0].exclude_tables[1]: expected a table pattern (a string such as "audit_*"), '
        "got 7",
    ]


def test_a_pattern_is_reported_as_spelt_under_an_alias():
    assert problems({"type": "mysql", "excludeTables": ["ok", ""]}) == [
        "backends[0].excludeTables[1]: an empty pattern matches no table; remove it"]


@pytest.mark.parametrize("backend", [pg(), {"type": "mysql"}])
def test_sql_patterns_have_at_most_one_dot(backend):
    msgs = problems({**backend, "include_tables": ["a.b.c"], "exclude_tables": ["x.y"]})
    assert msgs == ['backends[0].include_tables[0]: "a.b.c" has 2 dots; a pattern is "table" or '
                    '"schema.table" (for a table whose name contains a dot, write "?" in place '
                    'of that dot)']


def test_mongo_patterns_may_name_collections_with_dots():
    (b,) = parse({"type": "mongo", "include_tables": ["shop.system.profile", "db.a.*"]}).backends
    assert b.include_tables == ("shop.system.profile", "db.a.*")


def test_closed_character_classes_are_fine():
    (b,) = parse(pg(include_tables=["t[0-9]", "[]]x", "[!]]y", "[[]literal"])).backends
    assert b.include_tables == ("t[0-9]", "[]]x", "[!]]y", "[[]literal")


# --------------------------------------------------------------------------------------------
# Bad values that came from ${VAR}


def test_a_bad_value_from_a_variable_names_the_variable():
    msgs = problems(pg(port="${PG_PORT}", decoder="${DEC}", host="${H}"),
                    env={"PG_PORT": "abc", "DEC": "wal2jsn", "H": ""})
    assert msgs == [
        'backends[0].host: must not be empty (from ${H})',
        'backends[0].port: expected an integer from 1 to 65535, got "abc" (from ${PG_PORT})',
        'backends[0].decoder: expected one of auto, pgoutput, wal2json, got "wal2jsn" '
        '(from ${DEC}) (did you mean "wal2json"?)',
    ]


def test_a_value_partly_from_variables_names_them():
    assert problems(pg(port="${A}${B}"), env={"A": "54", "B": "x"}) == [
        'backends[0].port: expected an integer from 1 to 65535, got "54x" '
        '(with ${A}, ${B} expanded)']


def test_a_secret_from_a_variable_is_named_but_not_shown():
    (msg,) = problems({"type": "mongo", "uri": "${URI}"}, env={"URI": "http://u:pw-Zq9@h"})
    assert msg == ("backends[0].uri: expected a connection string starting with mongodb:// or "
                   "mongodb+srv://, got a string (from ${URI})")


def test_pattern_and_plugin_problems_name_the_variable():
    msgs = problems(pg(exclude_tables=["ok", "${T}"]),
                    plugins={"nats": {"servers": ["${NATS}"]}},
                    plugin_validators={"nats": lambda o: [("servers[0]", "not a nats:// URL")]},
                    env={"T": "", "NATS": "http://h"})
    assert msgs == [
        "backends[0].exclude_tables[1]: an empty pattern matches no table; remove it "
        "(from ${T})",
        "plugins.nats.servers[0]: not a nats:// URL (from ${NATS})",
    ]


def test_values_written_in_the_file_have_no_origin():
    assert problems(pg(port="abc")) == [
        'backends[0].port: expected an integer from 1 to 65535, got "abc"']


# --------------------------------------------------------------------------------------------
# [http] listen syntax (whether it can be bound: tests/unit/test_preflight.py)


_LISTEN = 'expected "host:port" such as "127.0.0.1:9187" (port 0 picks a free port), got '


@pytest.mark.parametrize("listen, hint", [
    ("::1:9187", ' (an IPv6 address goes in brackets: "[::1]:9187")'),
    ("[::zz]:9187", ' ("::zz" is not an IPv6 address)'),
    ("[1.2.3.4]:9187", ' ("1.2.3.4" is not an IPv6 address)'),
    ("127.0.0.1:70000", " (a port is 0 to 65535)"),
    (":9187", " (give a host: 127.0.0.1 for this machine only, 0.0.0.0 for every interface)"),
    ("localhost:http", ""),
])
def test_listen_syntax_problems_say_what_is_wrong(listen, hint):
    assert problems(pg(), http={"listen": listen}) == [
        f'http.listen: {_LISTEN}"{listen}"{hint}']


@pytest.mark.parametrize("listen, host, port", [
    ("127.0.0.1:0", "127.0.0.1", 0), ("[::]:9187", "::", 9187), ("localhost:65535",
                                                                  "localhost", 65535),
    ("[fe80::1]:1", "fe80::1", 1),
])
def test_listen_forms_accepted(listen, host, port):
    cfg = parse(pg(), http={"listen": listen})
    assert (cfg.http.host, cfg.http.port) == (host, port)


# --------------------------------------------------------------------------------------------
# Unset secrets: lapidus -t and lapidusctl run in shells without the service's secrets


def lenient(*backends, env=None, **top):
    return parse_config({"backends": list(backends), **top}, source="/etc/lapidus/lapidus.toml",
                        env={} if env is None else env, secrets_optional=True)


def test_an_unset_secret_is_a_warning_when_secrets_are_optional():
    cfg = lenient(pg(password="${SHOP_PG_PASSWORD}"),
                  {"type": "mongo", "uri": "${MONGO_URI}"},
                  plugins={"nats": {"token": "${NATS_TOKEN}"},
                           "exec": {"command": ["cat"], "env": {"PGPASSWORD": "${PGPW}"}}})
    assert cfg.warnings == tuple(
        f"{path}: environment variable {name} is not set here; this secret was not checked, "
        f"and lapidus will refuse to start unless {name} is set where it runs (the service's "
        f"EnvironmentFile)"
        for path, name in [("backends[0].password", "SHOP_PG_PASSWORD"),
                           ("backends[1].uri", "MONGO_URI"), ("plugins.nats.token", "NATS_TOKEN"),
                           ("plugins.exec.env.PGPASSWORD", "PGPW")])
    shop, mongo = cfg.backends
    assert shop.options["password"] is None and mongo.options["uri"] is None


def test_an_unset_secret_in_the_exec_sinks_env_passes_its_validator_with_the_warning():
    """The plugin validators see such a value as null: the exec sink's must not take it for a
    value that is not a string."""
    from lapidus.sinks import registry
    cfg = parse_config({"backends": [pg()], "plugins": {"exec": {
        "command": ["cat"], "env": {"REFRESH_DSN": "host=db password=${PG_PW}", "MODE": "x"}}}},
        source="/etc/lapidus/lapidus.toml", env={}, secrets_optional=True,
        plugin_validators=registry.validators())
    assert [w.split(":")[0] for w in cfg.warnings] == ["plugins.exec.env.REFRESH_DSN"]
    with pytest.raises(ConfigError) as info:      # a number is still refused
        parse_config({"backends": [pg()], "plugins": {"exec": {
            "command": ["cat"], "env": {"MODE": 3}}}}, source="/etc/lapidus/lapidus.toml",
            env={}, plugin_validators=registry.validators())
    assert info.value.problems == [
        "plugins.exec.env.MODE: expected a string value (quote numbers)"]


def test_the_password_inside_a_url_is_a_secret_too():
    cfg = lenient({"type": "mongo", "uri": "mongodb://app:${MONGO_PW}@m1/?replicaSet=rs0"},
                  plugins={"nats": {"servers": ["nats://lap:${NATS_PW}@h:4222"]}})
    assert [w.split(":")[0] for w in cfg.warnings] == ["backends[0].uri",
                                                       "plugins.nats.servers[0]"]
    assert cfg.backends[0].options["uri"] == "mongodb://app:@m1/?replicaSet=rs0"   # still checked
    assert cfg.plugins["nats"]["servers"] == ["nats://lap:@h:4222"]


def test_unset_variables_outside_secrets_stay_problems_when_secrets_are_optional():
    with pytest.raises(ConfigError) as info:
        lenient(pg(password="${PW}", port="${PG_PORT}"),
                {"type": "mongo", "uri": "mongodb://${MONGO_HOST}/"})
    assert info.value.problems == [
        "backends[0].port: environment variable PG_PORT is not set",
        "backends[1].uri: environment variable MONGO_HOST is not set"]


def test_without_secrets_optional_an_unset_secret_is_still_a_problem():
    assert problems(pg(password="${SHOP_PG_PASSWORD}")) == [
        "backends[0].password: environment variable SHOP_PG_PASSWORD is not set"]
    assert parse(pg(password="${PW}"), env={"PW": "x"}).warnings == ()


def test_load_config_passes_secrets_optional(tmp_path):
    path = write(tmp_path, "lapidus.toml",
                 '[[backends]]\ntype = "postgresql"\ndatabase = "d"\npassword = "${PW}"\n')
    assert len(load_config(path, env={}, secrets_optional=True).warnings) == 1
    with pytest.raises(ConfigError):
        load_config(path, env={})


def test_control_socket_needs_no_backend_or_plugin_variable(tmp_path):
    path = write(tmp_path, "lapidus.toml", f'''
state_dir = "{tmp_path}/state"
[[backends]]
type = "postgresql"
database = "${{DB}}"
password = "${{SHOP_PG_PASSWORD}}"
port = "${{PG_PORT}}"
[plugins.nats]
token = "${{NATS_TOKEN}}"
''')
    assert config_module.control_socket_for(path, env={}) == tmp_path / "state" / "lapidus.sock"


def test_control_socket_says_when_it_needs_a_variable(tmp_path):
    path = write(tmp_path, "lapidus.toml", 'state_dir = "/var/lib/lapidus/${TENANT}"\n'
                                           '[[backends]]\ntype = "mysql"\n')
    with pytest.raises(ConfigError) as info:
        config_module.control_socket_for(path, env={})
    assert info.value.problems == [
        "state_dir: environment variable TENANT is not set; it is needed to find the control "
        "socket (or give the socket with --socket PATH)"]
    assert config_module.control_socket_for(path, env={"TENANT": "t1"}) == Path(
        "/var/lib/lapidus/t1/lapidus.sock")


def test_every_bad_pattern_of_a_list_is_reported_together():
    assert [m.split(":")[0] for m in problems(pg(include_tables=["items[", "a.b.c", ""]))] == [
        "backends[0].include_tables[0]", "backends[0].include_tables[1]",
        "backends[0].include_tables[2]"]


def test_publish_via_partition_root_is_refused_with_wal2json():
    assert problems(pg(decoder="wal2json", publish_via_partition_root=True)) == [
        'backends[0].publish_via_partition_root: true needs decoder = "pgoutput": wal2json '
        'names every change by its partition and has no such option; set decoder = '
        '"pgoutput" (switching needs a new slot, docs/postgresql.md#choosing-the-decoder) or '
        "publish_via_partition_root = false"]


def test_publish_via_partition_root_with_pgoutput_auto_or_false():
    cfg = parse(pg(name="a", decoder="pgoutput", publish_via_partition_root=True),
                pg(name="b", publish_via_partition_root="true"),
                pg(name="c", decoder="wal2json", publish_via_partition_root=False))
    assert [b.options["publish_via_partition_root"] for b in cfg.backends] == [True, True,
                                                                              False]
    assert problems(pg(publish_via_partition_root="yes")) == [
        "backends[0].publish_via_partition_root: expected true or false, got \"yes\""]


def test_tls_paths_are_relative_to_the_file_and_contradictions_are_refused():
    config = parse(pg(sslmode="verify-full", sslrootcert="certs/ca.pem"),
                   {"type": "mysql", "ssl_ca": "ca.pem", "ssl_verify": "ca"})
    assert config.backends[0].options["sslrootcert"] == "/etc/lapidus/certs/ca.pem"
    assert config.backends[1].options["ssl_ca"] == "/etc/lapidus/ca.pem"
    assert not config.warnings
    assert problems(pg(sslmode="disable", sslrootcert="/ca.pem")) == [
        'backends[0].sslmode: "disable" uses no TLS, yet sslrootcert is set; remove it or set '
        'sslmode = "verify-full"']
    assert problems(pg(sslkey="/k.pem"), {"type": "mysql", "ssl_key": "/k.pem"}) == [
        "backends[0].sslkey: given without sslcert; add the client certificate that goes with "
        "the key",
        "backends[1].ssl_key: given without ssl_cert; add the client certificate that goes "
        "with the key"]
    assert problems({"type": "mysql", "ssl_verify": "full"})[0].startswith(
        "backends[0].ssl_verify: expected one of")
    weak = parse(pg(sslrootcert="/ca.pem"))
    assert weak.warnings == ('backends[0].sslrootcert: with sslmode = "prefer" a server without '
                             'TLS is still accepted in plain text; set sslmode = "verify-full" '
                             '(or "verify-ca") to refuse it',)
