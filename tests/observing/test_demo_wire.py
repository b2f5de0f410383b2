"""shmlab.lessons.wire reads strace's log: a call that strace splits in two is still counted."""

from shmlab.lessons import wire


def test_a_call_split_by_another_process_is_joined_at_its_end():
    welcome = "".join(f"\\x{b:02x}" for b in b"\0\0\0\x09#WELCOME#")  # strace -x: all hex
    lines = [
        f'41 write(10, "{welcome}", 13 <unfinished ...>',
        '42 sendmsg(11, {msg_iov=[{iov_base="\\x01", iov_len=1}]}, 0) = 1',
        "41 <... write resumed>) = 13",
        '42 write(4, "ab", 2) = 2',
    ]
    joined = wire._joined(lines)
    assert joined == [lines[1], f'41 write(10, "{welcome}", 13) = 13', lines[3]]
    pid, call, fd, rest, n = wire._CALL.match(joined[1]).groups()
    assert (pid, call, fd, n) == ("41", "write", "10", "13")
    assert wire.describe(call, wire._bytes(rest), rest) == "authkey handshake: #WELCOME#"
