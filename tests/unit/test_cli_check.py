"""``lapidus -t`` and the start of ``lapidus``: the configuration checked against this machine
(lapidus.config.preflight) and unset secrets as warnings.  No servers needed: the supervisor
is never started."""

from __future__ import annotations

import json
import socket

import pytest

from lapidus import cli
from lapidus import config as config_module


@pytest.fixture(autouse=True)
def no_supervisor(monkeypatch):
    """Fail loudly if a test would really start lapidus."""
    import lapidus.supervisor.arbiter as arbiter

    class Refused:
        def __init__(self, config):
            raise AssertionError("the supervisor must not start")

    monkeypatch.setattr(arbiter, "Arbiter", Refused)
    monkeypatch.setattr(config_module, "_running_as_root", lambda: False)
    monkeypatch.setattr(cli.logs, "configure", lambda *a, **k: None)


def write(tmp_path, state_dir, **extra):
    path = tmp_path / "lapidus.json"
    backend = {"name": "shop", "type": "postgresql", "database": "shop", **extra.pop("pg", {})}
    path.write_text(json.dumps({"state_dir": str(state_dir), "backends": [backend], **extra}))
    return path


@pytest.mark.parametrize("argv", [["-t"], []])
def test_a_state_dir_that_is_a_file_is_a_problem_for_check_and_start(tmp_path, capsys, argv):
    (tmp_path / "state").write_text("")
    path = write(tmp_path, tmp_path / "state")
    assert cli.main([*argv, "-c", str(path)]) == 2
    err = capsys.readouterr().err
    assert err == ("lapidus: invalid configuration (1 problem):\n"
                   f"  - state_dir: {tmp_path / 'state'} is a file, not a directory; remove it "
                   f"or set state_dir to a directory\n")


def test_a_file_where_the_backends_directory_belongs(tmp_path, capsys):
    (tmp_path / "shop").write_text("")
    assert cli.main(["-t", "-c", str(write(tmp_path, tmp_path))]) == 2
    assert 'state_dir: ' + str(tmp_path / "shop") + ' is a file, but backend "shop"' in \
        capsys.readouterr().err


def test_listen_address_in_use(tmp_path, capsys):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        path = write(tmp_path, tmp_path / "state", http={"listen": f"127.0.0.1:{port}"})
        assert cli.main(["-t", "-c", str(path)]) == 2
        assert cli.main(["-c", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.count(f"  - http.listen: address in use: another program already listens on "
                     f"127.0.0.1:{port}; stop it (ss -ltnp 'sport = :{port}' shows which), or "
                     f"choose another port in [http] listen\n") == 2


def test_an_unset_secret_is_a_warning_for_check_only(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("SHOP_PG_PASSWORD", raising=False)
    path = write(tmp_path, tmp_path / "state", pg={"password": "${SHOP_PG_PASSWORD}"})
    assert cli.main(["-t", "-c", str(path)]) == 0
    out, err = capsys.readouterr()
    assert json.loads(out)["backends"][0]["password"] is None
    assert err.splitlines() == [
        "lapidus: warning: backends[0].password: environment variable SHOP_PG_PASSWORD is not "
        "set here; this secret was not checked, and lapidus will refuse to start unless "
        "SHOP_PG_PASSWORD is set where it runs (the service's EnvironmentFile)",
        f"lapidus: configuration {path} is valid (1 backend(s))"]
    assert cli.main(["-c", str(path)]) == 2
    assert "backends[0].password: environment variable SHOP_PG_PASSWORD is not set\n" in \
        capsys.readouterr().err
    assert not (tmp_path / "state").exists()            # nothing was created on the way


def test_lapidusctl_finds_the_socket_without_the_services_secrets(tmp_path, capsys,
                                                                  monkeypatch):
    # An operator's shell: the secrets live only in the unit's EnvironmentFile.
    from lapidus import ctl

    for name in ("SHOP_PG_PASSWORD", "NATS_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    path = write(tmp_path, tmp_path / "state", pg={"password": "${SHOP_PG_PASSWORD}"},
                 plugins={"nats": {"token": "${NATS_TOKEN}"}})
    assert ctl.main(["-c", str(path), "status"]) == 3          # no lapidus runs: unreachable
    assert f"cannot reach lapidus at {tmp_path / 'state' / 'lapidus.sock'}" in \
        capsys.readouterr().err


def test_lapidusctl_dead_letters_reads_the_file_without_the_services_secrets(tmp_path, capsys,
                                                                             monkeypatch):
    from lapidus import ctl

    monkeypatch.delenv("SHOP_PG_PASSWORD", raising=False)
    path = write(tmp_path, tmp_path / "state", pg={"password": "${SHOP_PG_PASSWORD}"})
    assert ctl.main(["-c", str(path), "dead-letters", "shop"]) == 0
    assert capsys.readouterr().out.startswith("no dead letters for shop")


def test_check_refuses_publish_via_partition_root_with_wal2json(tmp_path, capsys):
    path = write(tmp_path, tmp_path / "state",
                 pg={"decoder": "wal2json", "publish_via_partition_root": True})
    assert cli.main(["-t", "-c", str(path)]) == 2
    err = capsys.readouterr().err
    assert "backends[0].publish_via_partition_root: true needs decoder = \"pgoutput\"" in err
    assert "wal2json names every change by its partition and has no such option" in err
    assert "Traceback" not in err


def test_check_names_a_backends_missing_certificate_file_and_start_leaves_it_to_the_backend(
        tmp_path, capsys, monkeypatch):
    (tmp_path / "ca.pem").write_text("not checked here: only that it is a file")
    (tmp_path / "keys").mkdir()
    path = write(tmp_path, tmp_path / "state",
                 pg={"sslmode": "verify-full", "sslrootcert": "ca.pem", "sslcert": "missing.pem",
                     "sslkey": "keys"})
    assert cli.main(["-t", "-c", str(path)]) == 2
    err = capsys.readouterr().err
    assert err == (
        "lapidus: invalid configuration (2 problems):\n"
        f"  - backends[0].sslcert: {tmp_path / 'missing.pem'} does not exist; give the path of "
        f'an existing file (backend "shop" cannot connect as configured without it)\n'
        f"  - backends[0].sslkey: {tmp_path / 'keys'} is a directory, not a file; give the path "
        f'of an existing file (backend "shop" cannot connect as configured without it)\n')
    # at start the backend itself goes FATAL naming the file, and the other backends run:
    # the supervisor (refused by the fixture here) is reached
    with pytest.raises(AssertionError, match="the supervisor must not start"):
        cli.main(["-c", str(path)])


def test_check_names_a_missing_pg_recvlogical_and_the_package_that_has_it(tmp_path, capsys,
                                                                          monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path / "empty-bin"))
    monkeypatch.setattr("lapidus.workers.postgresql.recvlogical.Path.glob",
                        lambda self, pattern: iter(()))     # no /usr/lib/postgresql/*/bin
    path = write(tmp_path, tmp_path / "state")
    assert cli.main(["-t", "-c", str(path)]) == 2
    err = capsys.readouterr().err
    assert 'backend "shop" runs pg_recvlogical, which is not on PATH' in err
    assert "apt-get install postgresql-client" in err


def test_check_names_a_configured_pg_recvlogical_that_is_not_a_program(tmp_path, capsys):
    (tmp_path / "notes.txt").write_text("not a program")
    path = write(tmp_path, tmp_path / "state", pg={"pg_recvlogical": str(tmp_path / "notes.txt")})
    assert cli.main(["-t", "-c", str(path)]) == 2
    err = capsys.readouterr().err
    assert f"backends[0].pg_recvlogical: {tmp_path / 'notes.txt'} is not an executable file" \
        in err


def test_demo_with_a_dsn_that_is_not_one_is_a_usage_error_without_a_traceback(capsys):
    assert cli.main(["demo", "--dsn", "this is not a dsn password=s3cret"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("lapidus demo: --dsn is not a PostgreSQL connection string (invalid "
                          "dsn: ")
    assert "give one like 'host=127.0.0.1 user=postgres'" in err
    assert "s3cret" not in err and "Traceback" not in err


@pytest.mark.parametrize("argv, says", [
    (["-t", "--dsn", "host=x", "-c", "lapidus.toml"], "--dsn is for 'lapidus demo'"),
    (["--dsn", "host=x"], "--dsn is for 'lapidus demo'"),
    (["demo", "-c", "lapidus.toml"], "'lapidus demo' takes no -c"),
    (["demo", "-t", "--stdout"], "'lapidus demo' takes no -t or --stdout")])
def test_options_the_command_would_ignore_are_a_usage_error(argv, says, capsys):
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"lapidus: {says}")


def test_lapidusctl_dead_letters_of_an_unknown_backend_lists_the_configured_ones(tmp_path,
                                                                                 capsys):
    from lapidus import ctl
    path = write(tmp_path, tmp_path / "state")
    assert ctl.main(["-c", str(path), "dead-letters", "crm"]) == 1
    assert capsys.readouterr().err == (
        f'lapidusctl: no backend named "crm" (configured: shop) in {path}\n')


def test_lapidusctl_without_a_configuration_here_suggests_c_and_socket(tmp_path, capsys,
                                                                       monkeypatch):
    from lapidus import ctl
    monkeypatch.chdir(tmp_path)
    assert ctl.main(["status"]) == 2
    assert capsys.readouterr().err == (
        "lapidusctl: no configuration file: neither ./lapidus.toml nor ./lapidus.json exists "
        "(give one with -c PATH or the control socket with --socket PATH)\n")
