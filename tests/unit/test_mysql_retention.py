"""The binlog-expiry warning (lapidus/workers/mysql/retention.py)."""

from lapidus.workers.mysql.retention import retention_warning

FILES = ["mariadb-bin.000004", "mariadb-bin.000005", "mariadb-bin.000006"]


def warn(**overrides):
    args = dict(checkpoint_file="mariadb-bin.000004", checkpoint_gtid="0-1-10", files=FILES,
                expire=604800, server_gtid="0-1-99")
    args.update(overrides)
    return retention_warning(**args)


def test_behind_on_the_oldest_binlog_with_expiry_warns():
    message = warn()
    assert "mariadb-bin.000004" in message and "604800 s" in message


def test_caught_up_on_the_oldest_binlog_does_not_warn():
    assert warn(server_gtid="0-1-10") is None


def test_position_in_a_newer_binlog_does_not_warn():
    assert warn(checkpoint_file="mariadb-bin.000005") is None


def test_no_expiry_configured_does_not_warn():
    assert warn(expire=0) is None


def test_a_single_binlog_does_not_warn():
    assert warn(files=FILES[:1]) is None


def test_a_purged_checkpoint_binlog_says_the_restart_will_fail():
    message = warn(checkpoint_file="mariadb-bin.000002")
    assert "gone from the server" in message and "mariadb-bin.000004" in message


def test_no_checkpoint_yet_does_not_warn():
    assert warn(checkpoint_file=None) is None
