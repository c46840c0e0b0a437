"""Run inside a balancer's namespace: prints, each time it changes, which real
servers of one IPVS service take new connections (weight above 0), as
`EPOCH ADDRESS:PORT ...`.  bench/failover.py times health-check detection
from it: keepalived's own defaults delete a failed real server, lbctl sets
its weight to 0, and either way it has left the pool.

Reads /proc/net/ip_vs every 20 ms: cheaper than a netlink dump, and the
same table ipvsadm -Ln shows.

    python bench/pool_watch.py VIP PORT
"""

import socket
import struct
import sys
import time


def hex_endpoint(address, port):
    return f"{struct.unpack('>I', socket.inet_aton(address))[0]:08X}:{port:04X}"


def endpoint(hexed):
    address, port = hexed.split(":")
    return f"{socket.inet_ntoa(struct.pack('>I', int(address, 16)))}:{int(port, 16)}"


def pool(table, service):
    """The real servers of `service` (hex VIP:PORT) with a weight above 0."""
    live, inside = set(), False
    for line in table.splitlines():
        fields = line.split()
        if line.startswith(("TCP", "UDP")):
            inside = fields[1] == service
        elif inside and fields[:1] == ["->"] and int(fields[3]) > 0:
            live.add(endpoint(fields[1]))
    return live


def main():
    service = hex_endpoint(sys.argv[1], int(sys.argv[2]))
    shown = None
    while True:
        with open("/proc/net/ip_vs") as fh:
            live = pool(fh.read(), service)
        if live != shown:
            print(f"{time.time():.3f} {' '.join(sorted(live))}", flush=True)
            shown = live
        time.sleep(0.02)


if __name__ == "__main__":
    try:
        main()
    except KeyboardInterrupt:
        pass
