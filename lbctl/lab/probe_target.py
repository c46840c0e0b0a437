"""Services a health check can find live, dead or silent.

    probe_target tcp PORT          accepts and closes every connection (live)
    probe_target tcp-silent PORT   listens with a full accept queue: SYNs go
                                   unanswered, as behind a firewall DROP
    probe_target udp-silent PORT   reads every datagram and never replies

The lab runs the servers inside a worker's own network namespace.
"""

import socket
import sys
import time


def serve_tcp(port):
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("0.0.0.0", port))
    sock.listen(64)
    while True:
        sock.accept()[0].close()


def serve_tcp_silent(port):
    sock = socket.socket()
    sock.bind(("0.0.0.0", port))
    sock.listen(0)
    # Fill the accept queue from inside the namespace and never accept.
    held = []
    while len(held) < 8:
        s = socket.socket()
        s.setblocking(False)
        s.connect_ex(("127.0.0.1", port))
        held.append(s)
    while True:
        time.sleep(3600)


def serve_udp_silent(port):
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind(("0.0.0.0", port))
    while True:
        sock.recvfrom(2048)


def main(argv):
    kind = argv[0]
    {"tcp": serve_tcp, "tcp-silent": serve_tcp_silent,
     "udp-silent": serve_udp_silent}[kind](int(argv[1]))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
