"""The kernel's IPVS table, read the one way every lab test reads it.

`ipvsadm -Ln` for one service, as an operator would look: each real server's
address, weight, and active and inactive connection counts.  The tests
assert against this, not against what lbctl reports of the same table.
"""

from dataclasses import dataclass


@dataclass(frozen=True)
class RealServerRow:
    weight: int
    active: int
    inactive: int


def parse_service(text):
    """{"ADDRESS:PORT": RealServerRow} from `ipvsadm -Ln -t|-u VIP:PORT`."""
    rows = {}
    for line in text.splitlines():
        words = line.split()
        # "  -> 192.168.100.3:80   Route   1   0   0"; the column header's
        # "-> RemoteAddress:Port" has no digit where the address goes.
        if len(words) >= 6 and words[0] == "->" and words[1][0].isdigit():
            rows[words[1]] = RealServerRow(int(words[3]), int(words[4]), int(words[5]))
    return rows


def service(run, vip, port, protocol="tcp"):
    """The real servers of one service as `run(argv)` (a node's shell) reads
    them, or None when the kernel has no such service."""
    flag = "-u" if protocol == "udp" else "-t"
    done = run(["ipvsadm", "-Ln", flag, f"{vip}:{port}"])
    if done.returncode == 0:
        return parse_service(done.stdout)
    if "No such service" in done.stderr:
        return None
    raise AssertionError(f"ipvsadm -Ln {flag} {vip}:{port}: {done.stderr.strip()}")


def on(lab, node):
    """`run` for service(): a command in the lab node's namespace."""
    return lambda argv: lab.sh(node, argv, check=False)


def weights(lab, node, vip, port, protocol="tcp"):
    """{"ADDRESS": weight} of a service's real servers on a balancer ({} if none)."""
    rows = service(on(lab, node), vip, port, protocol) or {}
    return {address.rsplit(":", 1)[0]: row.weight for address, row in rows.items()}


def active(lab, node, vip, port, real_server=None):
    """Active connections on one real server ("ADDRESS:PORT"), or on them all."""
    rows = service(on(lab, node), vip, port) or {}
    if real_server is not None:
        return rows[real_server].active if real_server in rows else 0
    return sum(row.active for row in rows.values())
