"""What the lab's tests break on purpose: a cable pulled, VRRP or the sync
daemon's multicast filtered on the way in, or held back on the way out.  A
part of Lab (topology.py)."""

import time

from lbctl.lab.shell import run

# The IPVS sync daemon's datagrams: the kernel's multicast group and port.
SYNC_DATAGRAMS = ["match", "ip", "dst", "224.0.0.81/32", "match", "ip", "protocol", "17", "0xff",
                  "match", "ip", "dport", "8848", "0xffff"]


class Faults:
    """Lab's faults; they act on the nodes of `self.nodes`, and wait with
    Lab.wait_for() on what Observations.vrrp_state() reads."""

    def set_link(self, node, up):
        run(["ip", "-n", self.nodes[node].netns, "link", "set", "eth0", "up" if up else "down"])

    def cut_master(self, master, backup, seconds_down, failback=True):
        """Pull the master's cable, wait for the backup to take over, plug it back
        in after `seconds_down` and wait for the master to take back over, or,
        without preemption (`failback` False), to settle as the backup.
        Returns when the link went down and when it came back (epoch seconds)."""
        self.set_link(master, False)
        cut = time.time()
        self.wait_for(lambda: self.vrrp_state(backup) == "MASTER", timeout=30,
                      what=f"{backup} to take over")
        time.sleep(seconds_down)
        self.set_link(master, True)
        restored = time.time()
        leader, follower = (master, backup) if failback else (backup, master)
        self.wait_for(lambda: self.vrrp_state(leader) == "MASTER"
                      and self.vrrp_state(follower) == "BACKUP", timeout=60,
                      what=f"{leader} master and {follower} backup")
        return cut, restored

    def block_vrrp(self, node, blocked=True):
        """Drop VRRP (IP protocol 112) arriving at a node: the balancers stop hearing
        each other while clients still reach both."""
        self._drop_arriving(node, 1, ["match", "ip", "protocol", "112", "0xff"] if blocked
                            else None)

    def block_sync(self, node, blocked=True):
        """Drop the IPVS sync daemon's multicast arriving at a node, as a firewall or a
        switch's IGMP snooping would: VRRP and clients are not affected."""
        self._drop_arriving(node, 2, SYNC_DATAGRAMS if blocked else None)

    def hold_sync(self, node, held=True):
        """Keep the IPVS sync daemon's multicast leaving a node queued (a plug
        qdisc), as a slow or busy network would; held=False lets what was
        held go, in order, and sends at once from then on.  The peer learns
        a connection exactly when a test says so, however slow the lab runs.
        Everything else leaves the node as usual."""
        tc = ["tc", "-n", self.nodes[node].netns]
        if not held:
            run([*tc, "qdisc", "change", "dev", "eth0", "handle", "20:", "plug",
                 "release_indefinite"], check=False)
            return
        # Two bands: every priority to the first; the filter alone puts the
        # sync daemon's datagrams in the second, the plugged one.
        run([*tc, "qdisc", "del", "dev", "eth0", "root"], check=False)
        run([*tc, "qdisc", "add", "dev", "eth0", "root", "handle", "1:", "prio", "bands", "2",
             "priomap", *["0"] * 16])
        run([*tc, "qdisc", "add", "dev", "eth0", "parent", "1:2", "handle", "20:",
             "plug", "limit", "1000000"])
        run([*tc, "qdisc", "change", "dev", "eth0", "handle", "20:", "plug", "block"])
        run([*tc, "filter", "add", "dev", "eth0", "parent", "1:", "protocol", "ip", "prio", "1",
             "u32", *SYNC_DATAGRAMS, "flowid", "1:2"])

    def stop_holding_sync(self, node):
        """No queue of the sync daemon's own on the node any more."""
        self.hold_sync(node, held=False)
        run(["tc", "-n", self.nodes[node].netns, "qdisc", "del", "dev", "eth0", "root"],
            check=False)

    def _drop_arriving(self, node, pref, match):
        """A u32 drop rule on the ingress of a node's eth0, one per `pref` (so VRRP
        and sync can be blocked at once); None removes it."""
        netns = self.nodes[node].netns
        run(["tc", "-n", netns, "qdisc", "add", "dev", "eth0", "ingress"], check=False)
        run(["tc", "-n", netns, "filter", "del", "dev", "eth0", "parent", "ffff:",
             "pref", str(pref)], check=False)
        if match:
            run(["tc", "-n", netns, "filter", "add", "dev", "eth0", "parent", "ffff:",
                 "pref", str(pref), "protocol", "ip", "u32", *match, "action", "drop"])
