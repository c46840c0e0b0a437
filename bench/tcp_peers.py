"""The far end of a benchmark's TCP traffic, run in the workers' namespace.

    python bench/tcp_peers.py listen FIRST_PORT COUNT
        accept and close connections on COUNT ports from FIRST_PORT, for
        health checks that need only a port that answers; prints "ready"
        once every port listens, then runs until killed.
    python bench/tcp_peers.py connect HOST FIRST_PORT COUNT
        one SYN to each of those ports of HOST, as a client would open a
        connection; no answer is awaited."""

import selectors
import socket
import sys
from contextlib import suppress


def listen(first, count):
    selector = selectors.DefaultSelector()
    for port in range(first, first + count):
        listener = socket.socket()
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("0.0.0.0", port))
        listener.listen(64)
        listener.setblocking(False)
        selector.register(listener, selectors.EVENT_READ)
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


def main():
    command, *args = sys.argv[1:]
    if command == "listen":
        listen(*map(int, args))
    elif command == "connect":
        connect(args[0], *map(int, args[1:]))
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main()
