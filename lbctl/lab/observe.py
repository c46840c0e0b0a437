"""What the lab reads off its nodes: keepalived's processes, role and log,
the kernel's connection entries, ARP answers and link counters.  A part of
Lab (topology.py)."""

import json
import os
import re
import signal
import time
from collections import Counter
from ipaddress import IPv4Address

from lbctl.errors import LabError
from lbctl.lab.shell import run


class Observations:
    """Lab's readings; they use its nodes, paths (path()) and commands (sh())."""

    def keepalived_pids(self, node):
        pids = []
        for name in ("keepalived", "vrrp", "checkers"):
            try:
                with open(self.path(node, "pid_file", name)) as fh:
                    pid = int(fh.read().strip())
                os.kill(pid, 0)
                pids.append(pid)
            except (OSError, ValueError):
                pass
        return pids

    def kill_keepalived(self, node, sig=signal.SIGKILL):
        """A crash (SIGKILL: no goodbye advert, VIP left behind) or a clean stop (SIGTERM)."""
        for pid in self.keepalived_pids(node):
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + 15
        while self.keepalived_pids(node) and time.monotonic() < deadline:
            time.sleep(0.05)

    def vrrp_state(self, node, cluster_name=None):
        """MASTER, BACKUP or FAULT as keepalived's notify hook last recorded it,
        for the lab's cluster or the one named."""
        try:
            with open(self.path(node, "vrrp_state", cluster_name=cluster_name)) as fh:
                return fh.read().split()[0]
        except (OSError, IndexError):
            return None

    def keepalived_log(self, node, lines=40):
        """The end of the node's keepalived log (lab keepalived logs to a file),
        without the lines of each gratuitous ARP it sends, which would crowd out
        the state changes."""
        try:
            with open(self.path(node, "log_file")) as fh:
                kept = [line for line in fh if "Sending gratuitous ARP on" not in line]
            return "".join(kept[-lines:])
        except OSError as exc:
            return f"(no log: {exc})"

    def wait_for_roles(self, master="lb1", backup="lb2", timeout=30):
        """Until the hooks record `master` MASTER and `backup` BACKUP; a timeout
        shows what both keepalived logs say."""
        try:
            self.wait_for(lambda: self.vrrp_state(master) == "MASTER" and
                          self.vrrp_state(backup) == "BACKUP", timeout=timeout,
                          what=f"{master} master and {backup} backup")
        except LabError as exc:
            logs = "\n".join(f"--- {n} ({self.vrrp_state(n)}):\n{self.keepalived_log(n)}"
                             for n in (master, backup))
            raise LabError(f"{exc}\n{logs}") from None

    def connection_entries(self, node):
        """The node's IPVS connection entries, each the fields of a row of
        /proc/net/ip_vs_conn_sync: protocol, client address and port, VIP and
        port, worker address and port (hex), state, origin (LOCAL: scheduled
        here; SYNC: learned from the peer), seconds left."""
        rows = self.sh(node, ["cat", "/proc/net/ip_vs_conn_sync"]).stdout.splitlines()[1:]
        return [row.split() for row in rows]

    def service_entries(self, node, vip, port):
        """connection_entries() of the connections to vip:port."""
        target = [f"{int(IPv4Address(vip)):08X}", f"{port:04X}"]
        return [fields for fields in self.connection_entries(node) if fields[3:5] == target]

    def learned_ports(self, node, vip, port):
        """{client port: seconds left} of the established connections to
        vip:port that `node` holds, whoever scheduled them.  The sync daemon
        sends a new connection in a batch that goes once full or 2 s old, and
        looks once a second: up to 3 s late.  An entry the standby scheduled
        itself while it was master (LOCAL) stays LOCAL when the peer's sync
        later updates it (the kernel keeps an entry's origin), so a port is
        known whatever its origin says."""
        return {fields[2]: int(fields[9]) for fields in self.service_entries(node, vip, port)
                if fields[7] == "ESTABLISHED"}

    def wait_until_learned(self, node, vip, port, count, before, timeout=30):
        """Until `node` has learned `count` connections to vip:port since
        `before` (learned_ports() taken before they opened).  A connection
        from a client port an old entry still holds (an entry whose end the
        node never heard of stays 15 minutes) refreshes that entry instead of
        adding one: it counts once its time left has gone up.  A timeout
        says how many it had learned and what its table holds for vip:port."""
        def learned_since():
            now = self.learned_ports(node, vip, port)
            return sum(1 for p, left in now.items() if p not in before or left > before[p])
        try:
            self.wait_for(lambda: learned_since() >= count, timeout=timeout,
                          what=f"{node} to learn {count} new connections to {vip}:{port} "
                          "from its peer")
        except LabError as exc:
            kinds = Counter(" ".join(fields[7:9])
                            for fields in self.service_entries(node, vip, port))
            raise LabError(f"{exc}: learned {learned_since()}; {node} holds "
                           f"{dict(kinds)} (state origin: entries) for {vip}:{port}, "
                           f"{len(before)} established before") from None

    def vip_macs(self, vip, node="client", count=3):
        """The MACs that answer ARP for `vip`."""
        out = self.sh(node, ["arping", "-c", str(count), "-i", "eth0", str(vip)],
                      check=False).stdout
        return set(re.findall(r"from ([0-9a-f:]{17})", out))

    def iface_bytes(self, node, ifname="eth0"):
        """(rx_bytes, tx_bytes) of an interface in a node's namespace."""
        out = run(["ip", "-n", self.nodes[node].netns, "-j", "-s", "link", "show", ifname]).stdout
        stats = json.loads(out)[0]["stats64"]
        return stats["rx"]["bytes"], stats["tx"]["bytes"]

    def cached_mac(self, address, node="client"):
        """The MAC `node`'s ARP cache holds for `address` on eth0, without
        asking the LAN; None when it holds none (or an entry still resolving)."""
        shown = self.sh(node, ["ip", "-j", "neigh", "show", str(address), "dev", "eth0"],
                        check=False).stdout
        return next((entry.get("lladdr") for entry in json.loads(shown or "[]")), None)

    def mac(self, node, ifname="eth0"):
        out = run(["ip", "-n", self.nodes[node].netns, "-j", "link", "show", ifname]).stdout
        return json.loads(out)[0]["address"]
