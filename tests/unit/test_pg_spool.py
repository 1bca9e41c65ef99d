"""Spool and SpoolReader: the durable segment files between pg_recvlogical and the worker."""

from __future__ import annotations

import os
import stat

import pytest

from lapidus.workers.postgresql.spool import Spool, SpoolReader, segment_name


class LineDecoder:
    """Framing like Wal2JsonDecoder's: one frame per line, the newline not included; each
    frame "decodes" to itself."""

    def split(self, data: bytes):
        end = data.rfind(b"\n")
        if end < 0:
            return (), 0
        return data[:end].split(b"\n"), end + 1

    def decode_run(self, data: bytes, pos: int, limit: int, origin):
        out = []
        while len(out) < limit:
            end = data.find(b"\n", pos)
            if end < 0:
                break
            out.append((data[pos:end], end + 1 - pos))
            pos = end + 1
        return out, pos


DECODER = LineDecoder()


def read_frames(reader: SpoolReader, decoder=DECODER, limit: int = 1000) -> list:
    """The frames the reader hands out now (not yet consumed)."""
    return [frame for frame, _ in reader.read_messages(decoder, limit)]


def consume(reader: SpoolReader, frame: bytes) -> None:
    reader.consumed(len(frame) + 1)


@pytest.fixture
def spool(tmp_path) -> Spool:
    spool = Spool(tmp_path / "spool")
    spool.prepare()
    return spool


def write_active(spool: Spool, data: bytes) -> None:
    """Append through the ``active`` symlink, as pg_recvlogical does."""
    with open(spool.active_link, "ab") as f:
        f.write(data)


def append(spool: Spool, number: int, data: bytes) -> None:
    with open(spool.path(number), "ab") as f:
        f.write(data)


def read_all(reader: SpoolReader) -> list:
    """Every frame available now, each marked consumed (what the worker does)."""
    out = []
    while True:
        frames = read_frames(reader)
        if not frames:
            return out
        for frame in frames:
            consume(reader, frame)
            out.append(frame)


# -- Spool -------------------------------------------------------------------------------

def test_segment_names_are_zero_padded_and_sort_numerically():
    assert segment_name(7) == "000000000007.seg"
    assert sorted([segment_name(10), segment_name(9)]) == [segment_name(9), segment_name(10)]


def test_prepare_creates_private_directory_and_active_symlink(tmp_path):
    spool = Spool(tmp_path / "state" / "spool")
    spool.prepare()
    assert stat.S_IMODE(os.stat(spool.directory).st_mode) == 0o700
    assert spool.active_link.is_symlink()
    assert os.readlink(spool.active_link) == "000000000001.seg"
    assert spool.active_segment() == 1


def test_prepare_starts_at_the_given_first_segment(tmp_path):
    spool = Spool(tmp_path / "spool")
    spool.prepare(first_segment=7)
    assert os.readlink(spool.active_link) == "000000000007.seg"


def test_prepare_points_active_at_the_newest_existing_segment(tmp_path):
    spool = Spool(tmp_path / "spool")
    spool.directory.mkdir()
    for number in (3, 5):
        spool.path(number).write_bytes(b"x\n")
    spool.prepare(first_segment=3)
    assert spool.active_segment() == 5


def test_prepare_repoints_an_active_link_left_at_a_segment_never_created(tmp_path):
    spool = Spool(tmp_path / "spool")
    spool.prepare()
    write_active(spool, b"a\n")
    spool.rotate()                       # crashed before pg_recvlogical created segment 2
    spool.prepare()
    assert spool.active_segment() == 1


def test_prepare_twice_keeps_the_active_segment(spool):
    write_active(spool, b"a\n")
    spool.prepare()
    assert spool.active_segment() == 1
    assert spool.path(1).read_bytes() == b"a\n"


def test_rotate_repoints_active_to_the_next_segment(spool):
    write_active(spool, b"a\n")
    assert spool.rotate() == 2
    assert os.readlink(spool.active_link) == "000000000002.seg"
    write_active(spool, b"b\n")
    assert spool.path(1).read_bytes() == b"a\n"
    assert spool.path(2).read_bytes() == b"b\n"
    assert spool.segments() == [1, 2]


def test_rotate_creates_the_next_segment_only_when_asked(spool):
    """While pg_recvlogical runs, the new file must come from it (only then is the old one
    final); a paused pg_recvlogical cannot, so rotate(create=True) makes it."""
    write_active(spool, b"a\n")
    spool.rotate()
    assert spool.segments() == [1]
    spool.rotate(create=True)
    assert spool.segments() == [1, 3]
    assert spool.path(3).read_bytes() == b""


def test_reader_leaves_a_fully_read_segment_once_the_next_is_created(spool):
    write_active(spool, b"a\nb\n")
    reader = SpoolReader(spool, 1, 0)
    frames = read_frames(reader)
    for frame in frames:
        consume(reader, frame)
    spool.rotate(create=True)
    assert read_frames(reader) == []
    assert reader.segment == 2 and reader.offset == 0
    assert spool.delete_before(reader.segment) == 1


def test_rotate_leaves_no_temporary_link_behind(spool):
    spool.rotate()
    spool.rotate()
    assert sorted(os.listdir(spool.directory)) == ["active"]
    assert spool.active_segment() == 3


def test_segments_ignore_files_that_are_not_segments(spool):
    append(spool, 2, b"a\n")
    append(spool, 10, b"b\n")
    (spool.directory / "notes.seg").write_text("x")
    (spool.directory / "000000000003.seg.tmp").write_text("x")
    assert spool.segments() == [2, 10]


def test_size_bytes_sums_the_segments(spool):
    append(spool, 1, b"abc\n")
    append(spool, 2, b"de\n")
    assert spool.size_bytes() == 7


def test_delete_before_removes_only_older_segments(spool):
    for number in (1, 2, 3):
        append(spool, number, b"x\n")
    assert spool.delete_before(3) == 2
    assert spool.segments() == [3]
    assert spool.active_link.is_symlink()


def test_delete_before_the_oldest_segment_deletes_nothing(spool):
    append(spool, 2, b"x\n")
    assert spool.delete_before(2) == 0
    assert spool.delete_before(1) == 0
    assert spool.segments() == [2]


# -- SpoolReader -------------------------------------------------------------------------

def test_reader_returns_complete_frames_in_order(spool):
    write_active(spool, b"one\ntwo\nthree\n")
    assert read_all(SpoolReader(spool, 1, 0)) == [b"one", b"two", b"three"]


def test_reader_has_nothing_while_the_segment_does_not_exist(spool):
    reader = SpoolReader(spool, 1, 0)
    assert read_frames(reader) == []
    write_active(spool, b"a\n")
    assert read_frames(reader) == [b"a"]


def test_partial_last_line_is_held_back_until_completed(spool):
    reader = SpoolReader(spool, 1, 0)
    write_active(spool, b"a\nbc")
    assert read_all(reader) == [b"a"]
    assert read_frames(reader) == []
    write_active(spool, b"d\ne")
    assert read_all(reader) == [b"bcd"]
    write_active(spool, b"\n")
    assert read_all(reader) == [b"e"]


def test_messages_come_in_runs_of_at_most_limit_continuing_in_the_buffer(spool):
    write_active(spool, b"a\nb\nc\nd")
    reader = SpoolReader(spool, 1, 0)
    assert read_frames(reader, limit=2) == [b"a", b"b"]
    assert read_frames(reader, limit=2) == [b"c"]
    assert read_frames(reader, limit=2) == []
    write_active(spool, b"e\nf\n")
    assert read_frames(reader, limit=1) == [b"de"]
    assert read_frames(reader, limit=1) == [b"f"]
    assert reader.offset == 0                 # handed out, none consumed: the checkpoint stays


def test_consumed_moves_offset_past_the_frame_and_its_newline(spool):
    write_active(spool, b"a\nbcd\n")
    reader = SpoolReader(spool, 1, 0)
    frames = read_frames(reader)
    assert frames == [b"a", b"bcd"]
    assert reader.offset == 0                 # nothing consumed yet
    consume(reader, frames[0])
    assert reader.offset == 2
    consume(reader, frames[1])
    assert reader.offset == 6 == spool.path(1).stat().st_size


def test_reader_resumes_at_a_checkpointed_offset(spool):
    write_active(spool, b"a\nb\nc\n")
    assert read_all(SpoolReader(spool, 1, 2)) == [b"b", b"c"]


def test_frame_longer_than_one_read_is_returned_whole(spool):
    reader = SpoolReader(spool, 1, 0)
    reader.CHUNK = 7
    long_frame = b"x" * 100
    write_active(spool, b"a\n" + long_frame + b"\nb\n")
    assert read_all(reader) == [b"a", long_frame, b"b"]
    assert reader.offset == 2 + 101 + 2


def test_reader_follows_rotations_in_order(spool):
    reader = SpoolReader(spool, 1, 0)
    write_active(spool, b"1\n2\n")
    spool.rotate()
    write_active(spool, b"3\n")
    spool.rotate()
    write_active(spool, b"4\n5\n")
    assert read_all(reader) == [b"1", b"2", b"3", b"4", b"5"]
    assert (reader.segment, reader.offset) == (3, 4)


def test_reader_moves_to_next_segment_only_once_it_exists(spool):
    reader = SpoolReader(spool, 1, 0)
    write_active(spool, b"a\n")
    assert read_all(reader) == [b"a"]
    spool.rotate()                            # SIGHUP not handled yet: no segment 2 file
    assert read_frames(reader) == []
    assert (reader.segment, reader.offset) == (1, 2)
    write_active(spool, b"b\n")               # pg_recvlogical reopened active
    frames = read_frames(reader)
    assert frames == [b"b"]
    assert (reader.segment, reader.offset) == (2, 0)
    consume(reader, frames[0])
    assert reader.offset == 2


def test_reader_reads_the_last_bytes_of_the_old_segment_before_switching(spool):
    reader = SpoolReader(spool, 1, 0)
    write_active(spool, b"a\n")
    assert read_all(reader) == [b"a"]          # reader is at the end of segment 1
    append(spool, 1, b"b\nc\n")                # written just before the reopen ...
    spool.rotate()
    write_active(spool, b"d\n")                # ... and the next segment exists now
    frames = read_frames(reader)
    assert frames == [b"b", b"c"]
    assert reader.segment == 1
    for frame in frames:
        consume(reader, frame)
    assert read_all(reader) == [b"d"]
    assert reader.segment == 2


class RacingSpool(Spool):
    """Simulates the race the reader must survive: right after the reader saw the end of
    segment 1, pg_recvlogical writes its last bytes there, then reopens ``active`` (creating
    segment 2) before the reader looks for a later segment."""

    race = None

    def active_segment(self):
        if self.race is not None:
            race, self.race = self.race, None
            race()
        return super().active_segment()


def test_bytes_written_to_old_segment_between_eof_and_rotation_are_not_lost(tmp_path):
    spool = RacingSpool(tmp_path / "spool")
    spool.prepare()
    write_active(spool, b"a\n")
    reader = SpoolReader(spool, 1, 0)
    assert read_all(reader) == [b"a"]

    def last_write_then_reopen():
        write_active(spool, b"late\n")
        spool.rotate()
        write_active(spool, b"next\n")

    spool.race = last_write_then_reopen
    assert read_frames(reader) == [b"late"]
    assert reader.segment == 1
    consume(reader, b"late")
    assert read_all(reader) == [b"next"]
    assert reader.segment == 2


def test_reader_skips_a_missing_segment_when_a_later_one_exists(spool):
    # pg_recvlogical died before it reopened ``active`` after a rotation: segment 2 was never
    # created, and the next rotation (spool full, no pg_recvlogical) created segment 3
    spool.rotate()
    spool.rotate(create=True)
    append(spool, 3, b"b\n")
    reader = SpoolReader(spool, 1, 0)
    assert read_all(reader) == [b"b"]
    assert reader.segment == 3


def test_reader_at_the_end_of_the_active_segment_does_not_list_the_directory(spool):
    listings = []

    class CountingSpool(Spool):
        def segments(self):
            listings.append(1)
            return super().segments()

    counting = CountingSpool(spool.directory)
    write_active(counting, b"a\n")
    reader = SpoolReader(counting, 1, 0)
    assert read_all(reader) == [b"a"]
    assert read_frames(reader) == []
    assert listings == []


def test_sealed_segment_ending_in_an_incomplete_frame_is_an_error(spool):
    reader = SpoolReader(spool, 1, 0)
    write_active(spool, b"a\nbro")
    spool.rotate()
    write_active(spool, b"c\n")
    assert read_frames(reader) == [b"a"]
    with pytest.raises(RuntimeError, match="000000000001.seg.*incomplete frame"):
        read_frames(reader)


# -- repairing a half-written tail -------------------------------------------------------

def test_truncate_partial_tail_cuts_only_the_incomplete_frame(spool):
    write_active(spool, b"a\nb\npar")
    assert spool.truncate_partial_tail(1, 0, DECODER) == 4
    assert spool.path(1).read_bytes() == b"a\nb\n"


def test_truncate_partial_tail_from_a_frame_boundary_inside_the_segment(spool):
    write_active(spool, b"a\nb\npar")
    assert spool.truncate_partial_tail(1, 2, DECODER) == 4
    assert spool.path(1).read_bytes() == b"a\nb\n"


def test_truncate_partial_tail_of_a_segment_holding_only_a_partial_frame(spool):
    write_active(spool, b"partial")
    assert spool.truncate_partial_tail(1, 0, DECODER) == 0
    assert spool.path(1).read_bytes() == b""


def test_truncate_partial_tail_leaves_a_complete_segment_alone(spool):
    write_active(spool, b"a\nb\n")
    assert spool.truncate_partial_tail(1, 0, DECODER) is None
    assert spool.truncate_partial_tail(1, 4, DECODER) is None
    assert spool.path(1).read_bytes() == b"a\nb\n"


def test_truncate_partial_tail_of_a_missing_segment_does_nothing(spool):
    assert spool.truncate_partial_tail(1, 0, DECODER) is None
    assert not spool.path(1).exists()


def test_after_truncate_drops_the_buffered_half_frame(spool):
    reader = SpoolReader(spool, 1, 0)
    write_active(spool, b"a\npar")             # pg_recvlogical died mid-write
    assert read_all(reader) == [b"a"]
    new_size = spool.truncate_partial_tail(1, reader.offset, DECODER)
    assert new_size == 2
    reader.after_truncate(new_size)
    write_active(spool, b"full\n")             # the server resends the cut message
    assert read_all(reader) == [b"full"]
    assert reader.offset == 7


def test_after_truncate_keeps_bytes_the_reader_had_not_read(spool):
    write_active(spool, b"a\npar")
    reader = SpoolReader(spool, 1, 0)          # nothing read yet
    reader.after_truncate(spool.truncate_partial_tail(1, 0, DECODER))
    write_active(spool, b"b\n")
    assert read_all(reader) == [b"a", b"b"]


def test_pg_recvlogical_reports_every_status_interval_and_every_second_once_resumed(tmp_path):
    """10 s by default (pg_recvlogical's own); started again after a pause at the spool cap it
    runs only until the spool is full again, and a stop sends no last report: every second,
    or the slot would never move and every resume would stream the same WAL again."""
    from lapidus.workers.postgresql.recvlogical import RecvLogical

    def status_of(options, resumed=False):
        child = RecvLogical(binary="pg_recvlogical", options={"database": "db", **options},
                            slot="s", output=tmp_path / "active", plugin_options=[],
                            log_path=tmp_path / "log", application_name="lapidus_b")
        child.resumed = resumed
        (arg,) = [a for a in child.argv() if a.startswith("--status-interval=")]
        return int(arg.split("=")[1])

    assert status_of({}) == 10
    assert status_of({"status_interval": 30.0}) == 30
    assert status_of({}, resumed=True) == 1
    assert status_of({"status_interval": 30.0}, resumed=True) == 1
