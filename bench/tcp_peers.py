"""The far end of a benchmark's TCP traffic, run in the workers' namespace.

    python bench/tcp_peers.py listen FIRST_PORT COUNT
        accept and close connections on COUNT ports from FIRST_PORT, for
        health checks that need only a port that answers; prints "ready"
        once every port listens, then runs until killed.
    python bench/tcp_peers.py connect HOST FIRST_PORT COUNT
        one SYN to each of those ports of HOST, as a client would open a
        connection; no answer is awaited.
    python bench/tcp_peers.py sink PORT
        accept connections on PORT and read and drop all they send; prints
        "ready" once it listens, then runs until killed.
    python bench/tcp_peers.py upload HOST PORT CONNECTIONS SECONDS
        open CONNECTIONS to HOST:PORT and send as fast as each takes it for
        SECONDS, as many clients uploading at once; prints the bytes sent."""

import selectors
import socket
import sys
import time
from contextlib import suppress


def _listener(selector, port, backlog=64):
    listener = socket.socket()
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("0.0.0.0", port))
    listener.listen(backlog)
    listener.setblocking(False)
    selector.register(listener, selectors.EVENT_READ)
    return listener


def listen(first, count):
    selector = selectors.DefaultSelector()
    for port in range(first, first + count):
        _listener(selector, port)
    print("ready", flush=True)
    while True:
        for key, _ in selector.select():
            with suppress(BlockingIOError):
                key.fileobj.accept()[0].close()


def connect(host, first, count):
    for port in range(first, first + count):
        with socket.socket() as sock:
            sock.setblocking(False)
            with suppress(BlockingIOError):
                sock.connect((host, port))


def sink(port):
    selector = selectors.DefaultSelector()
    listener = _listener(selector, port, 256)
    print("ready", flush=True)
    while True:
        for key, _ in selector.select():
            if key.fileobj is listener:
                with suppress(BlockingIOError):
                    conn = listener.accept()[0]
                    conn.setblocking(False)
                    selector.register(conn, selectors.EVENT_READ)
                continue
            try:
                data = key.fileobj.recv(1 << 16)
            except BlockingIOError:
                continue
            except OSError:
                data = b""
            if not data:
                selector.unregister(key.fileobj)
                key.fileobj.close()


def upload(host, port, connections, seconds):
    selector = selectors.DefaultSelector()
    for _ in range(connections):
        sock = socket.create_connection((host, port), timeout=10)
        sock.setblocking(False)
        selector.register(sock, selectors.EVENT_WRITE)
    chunk, sent = bytes(1 << 16), 0
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        for key, _ in selector.select(timeout=0.1):
            with suppress(BlockingIOError):
                sent += key.fileobj.send(chunk)
    for key in list(selector.get_map().values()):
        key.fileobj.close()
    print(sent, flush=True)


def main():
    command, *args = sys.argv[1:]
    if command == "listen":
        listen(*map(int, args))
    elif command == "connect":
        connect(args[0], *map(int, args[1:]))
    elif command == "sink":
        sink(int(args[0]))
    elif command == "upload":
        upload(args[0], *map(int, args[1:3]), float(args[3]))
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main()
