"""What a tcpdump capture of the lab's LAN (`tcpdump -e -n -tt`) says of a
failed request."""

import re

from lbctl.lab.traffic import failed_client_port

SLACK = 0.5  # seconds: the load's clock and tcpdump's are the same machine's


def split_by_a_move(lines, failed, client, macs):
    """The `failed` load records whose connection began on one balancer and
    went on to the other as the VIP moved between them: in the capture's
    `lines`, within the record's own time, the last SYN from `client` on
    its port went to one of `macs` (the balancers'), and the client's next
    packet on that port to another.  IPVS syncs a connection once it is
    established, so the old master, which saw only the SYN, sends the new
    one nothing of it (docs/keepalived.md, "A handshake cut by the move").
    Frames a balancer sends on (to a worker, with the client's address)
    are not the client's, and a port used again later is another record's."""
    wanted = {}
    for record in failed:
        port = failed_client_port(record[3])
        if port is not None:
            wanted.setdefault(port, []).append(record)
    packet = re.compile(rf"^(\S+) (\S+) > (\S+), .*: {re.escape(str(client))}\.(\d+) > \S+: "
                        r"Flags \[([^]]*)\]")
    sent = {}  # port: [(when, to MAC, SYN?)]
    for line in lines:
        found = packet.match(line)
        if not found or found[2] in macs or int(found[4]) not in wanted:
            continue
        sent.setdefault(int(found[4]), []).append((float(found[1]), found[3], found[5] == "S"))
    split = []
    for port, records in wanted.items():
        for record in records:
            start, end = record[0] - SLACK, record[1] + SLACK
            syn_to = then_to = None
            for when, to, syn in sent.get(port, ()):
                if not start <= when <= end:
                    continue
                if syn:
                    syn_to, then_to = to, None
                elif syn_to is not None and then_to is None:
                    then_to = to
            if syn_to in macs and then_to in macs and syn_to != then_to:
                split.append(record)
    return split
