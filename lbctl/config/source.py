"""A cluster file's text, read with bounds, before anything parses it.

Apart from the YAML parser (load.py) so that reading a file costs no
import of PyYAML: a file whose model is in lbctl's cache is never parsed.
"""

import os
import re
import stat
import sys

from lbctl.errors import ConfigError, Diagnostic

MAX_BYTES = 16 * 1024 * 1024  # a 50,000-service file is about 4 MiB
# YAML's line breaks: the line and column of every mark count with these.
_LINE_BREAK = re.compile("\r\n|[\n\r\x85\u2028\u2029]")


def source_lines(text):
    """The file's lines as YAML counts them."""
    return _LINE_BREAK.split(text)


STDIN = "-"  # the path that means standard input (how `--all` sends the file)
STDIN_NAME = "<stdin>"


def read_source(path):
    """(name, text) of the cluster file at `path`, or of standard input for "-"."""
    if str(path) == STDIN:
        return STDIN_NAME, read_stdin()
    return str(path), read_text(path)


def read_stdin(stream=None):
    """Standard input's text, under the same limits as a file's."""
    stream = stream if stream is not None else sys.stdin.buffer
    if stream.isatty():
        # Waiting silently for a file typed by hand helps nobody.
        raise _file_error(STDIN_NAME, "standard input is a terminal: pipe the cluster "
                          "file in (lbctl validate - < cluster.yaml)")
    data = stream.read(MAX_BYTES + 1)
    if len(data) > MAX_BYTES:
        raise _too_big(STDIN_NAME)
    return _decode(data, STDIN_NAME)


def read_text(path):
    """The file's text: a regular file of at most MAX_BYTES, in UTF-8."""
    name = str(path)
    try:
        # O_NONBLOCK: opening a FIFO must not wait for a writer.
        fd = _open_as_invoker(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    except OSError as exc:
        raise _file_error(name, f"cannot read file: {exc.strerror or exc}{reader_of(exc)}") \
            from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise _file_error(name, f"cannot read file: it is {_file_kind(info.st_mode)}, "
                              "not a regular file; give the path of the cluster file itself")
        if info.st_size > MAX_BYTES:
            raise _too_big(name)
        data = _read_at_most(fd, MAX_BYTES + 1)
    except OSError as exc:
        raise _file_error(name, f"cannot read file: {exc.strerror or exc}") from None
    finally:
        os.close(fd)
    if len(data) > MAX_BYTES:  # it grew while we read it
        raise _too_big(name)
    return _decode(data, name)


def _open_as_invoker(path, flags):
    """The file opened; under sudo (root, SUDO_UID set) opened with the
    permissions of the user who ran sudo: a sudo rule for lbctl must not let
    them read root's files through its error messages (`sudo lbctl validate
    /etc/shadow` would print its lines)."""
    uid = os.environ.get("SUDO_UID", "")
    if os.geteuid() != 0 or not uid.isdigit() or uid == "0":
        return os.open(path, flags)
    import pwd

    try:
        user = pwd.getpwuid(int(uid))
    except KeyError:
        raise PermissionError(1, f"sudo's user {uid} is not in the password database") from None
    saved = os.getgroups()
    os.setgroups(os.getgrouplist(user.pw_name, user.pw_gid))
    os.setegid(user.pw_gid)
    os.seteuid(user.pw_uid)
    try:
        return os.open(path, flags)
    except OSError as exc:
        exc.reader = user.pw_name
        raise
    finally:
        os.seteuid(0)
        os.setegid(0)
        os.setgroups(saved)


def reader_of(exc):
    reader = getattr(exc, "reader", None)
    return f" (read as {reader}, who ran sudo: lbctl reads the file with their rights)" \
        if reader else ""


def _decode(data, name):
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        before = data[:exc.start].decode("utf-8", errors="replace")
        line, col = line_col(before, len(before))
        raise ConfigError([Diagnostic(
            name, line, col, f"byte 0x{data[exc.start]:02x} is not UTF-8 text; save the file "
            "as UTF-8", source_lines(before)[-1])]) from None
    # As Python's text mode reads files: a newline is a newline, whatever the editor wrote.
    return text.replace("\r\n", "\n").replace("\r", "\n")


def _read_at_most(fd, limit):
    chunks, size = [], 0
    while size < limit:
        chunk = os.read(fd, min(1 << 20, limit - size))
        if not chunk:
            break
        chunks.append(chunk)
        size += len(chunk)
    return b"".join(chunks)


def _file_kind(mode):
    kinds = ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a pipe (FIFO)"),
             (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
             (stat.S_ISSOCK, "a socket"))
    return next((text for test, text in kinds if test(mode)), "not a regular file")


def _too_big(name):
    return _file_error(name, f"the file is larger than {MAX_BYTES // (1024 * 1024)} MiB; "
                       "a cluster file of 50,000 services is about 4 MiB")


def _file_error(name, message):
    return ConfigError([Diagnostic(name, 1, 1, message)])


def line_col(text, index):
    line, start = 1, 0
    for brk in _LINE_BREAK.finditer(text, 0, index):
        line, start = line + 1, brk.end()
    return line, index - start + 1
