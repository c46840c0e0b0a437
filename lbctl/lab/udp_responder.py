"""A tiny UDP server for the lab's workers: answers every datagram with its name.

It stands in for a real UDP service (DNS, syslog) so the lab can show which
worker IPVS chose.  It binds the address it is given; the lab runs it inside
a worker's own network namespace.
"""

import argparse
import socket


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--name", required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--bind", default="127.0.0.1")
    parser.add_argument("--size", type=int, default=0,
                        help="make every reply this many bytes, padded or cut short, as a "
                             "long DNS answer or a truncated one is")
    args = parser.parse_args()
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind((args.bind, args.port))
    reply = f"served by {args.name}\n".encode()
    if args.size:
        reply = (reply + b"." * args.size)[:args.size]
    while True:
        _, peer = sock.recvfrom(2048)
        sock.sendto(reply, peer)


if __name__ == "__main__":
    main()
