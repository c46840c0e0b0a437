"""What a tcpdump capture of the lab's LAN (`tcpdump -e -n -tt`) says of a
failed request."""

import re

from lbctl.lab.traffic import failed_client_port


def split_by_a_move(lines, failed, client, macs):
    """The `failed` load records whose connection began on one balancer and
    went on to the other as the VIP moved between them: in the capture's
    `lines`, the SYN from `client` went to one of `macs` (the balancers'),
    the client's next packet of that connection to another.  IPVS syncs a
    connection once it is established, so the old master, which saw only
    the SYN, sends the new one nothing of it (docs/keepalived.md, "A
    handshake cut by the move")."""
    ports = {failed_client_port(record[3]): record for record in failed}
    packet = re.compile(rf"^\S+ (\S+) > (\S+), .*: {re.escape(str(client))}\.(\d+) > \S+: "
                        r"Flags \[([^]]*)\]")
    syn_to, then_to = {}, {}
    for line in lines:
        found = packet.match(line)
        # (A balancer sends the client's packets on to a worker with the
        # client's address: only what it was sent counts.)
        if not found or int(found[3]) not in ports or found[1] in macs:
            continue
        port, to = int(found[3]), found[2]
        if found[4] == "S":
            syn_to[port] = to
        elif port in syn_to:
            then_to.setdefault(port, to)
    return [ports[port] for port, to in syn_to.items()
            if port in then_to and {to, then_to[port]} <= set(macs) and to != then_to[port]]
