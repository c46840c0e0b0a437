"""Every path lbctl uses on a node, in one place.

Paths are spelled as the node sees them (`/etc/lbctl/web/keepalived.conf`);
`Layout.real()` puts the node's root in front (`--root`, `$LBCTL_ROOT`, a lab
node's folder), which is what a daemon started there must be given.  The
renderers, the adapters, the lab and the tests all ask this module, so a path
is changed here or nowhere.

lbctl writes only below its own three folders, plus the boot units and the
sysctl file it names after the cluster:
- /etc/lbctl: the saved cluster file and what the daemons read (keepalived's
  config and hooks, BIRD's config);
- /run/lbctl: what lasts until a reboot (locks, pid files, the hooks' state,
  the VIPs on offer, when apply last ran);
- /var/lib/lbctl: what must outlive one (the ownership records, drains, the
  digest of the config keepalived loaded).
"""

import os
from dataclasses import dataclass

ETC_DIR = "/etc/lbctl"
RUN_DIR = "/run/lbctl"
VAR_DIR = "/var/lib/lbctl"
OWN_FOLDERS = (ETC_DIR, RUN_DIR, VAR_DIR)
OWNERSHIP_DIR = VAR_DIR  # one ownership record per cluster
DRAIN_DIR = f"{VAR_DIR}/drained"
UNIT_DIR = "/etc/systemd/system"
WANTS_DIR = f"{UNIT_DIR}/multi-user.target.wants"
SYSCTL_DIR = "/etc/sysctl.d"
# Where `lbctl install --all` puts lbctl on a node: a venv at a fixed path
# (the boot units name its Python), and the command on root's PATH.
INSTALL_VENV = "/opt/lbctl"
INSTALL_LINK = "/usr/local/sbin/lbctl"

# keepalived's hooks, installed into each cluster's folder under ETC_DIR.
CHECK_SCRIPT = "lbctl-check"
NOTIFY_SCRIPT = "lbctl-notify"
TAKEOVER_SCRIPT = "lbctl-takeover"
ANNOUNCE_SCRIPT = "lbctl-announce"
HOOK_ORDER = "lbctl-hook-order"  # sourced by the hooks: the order keepalived ran them in


def unit_name(cluster_name, purpose):
    """A boot unit's name: lbctl-CLUSTER-PURPOSE.service."""
    return f"lbctl-{cluster_name}-{purpose}.service"


@dataclass(frozen=True)
class Layout:
    """The paths of one cluster on one node."""

    cluster: str
    root: str = "/"

    def real(self, path):
        """`path` as this process reaches it: below the node's root."""
        return os.path.join(self.root, path.lstrip("/"))

    # -- /etc/lbctl: the saved file and what the daemons read ----------------
    @property
    def saved_copy(self):
        """The cluster file as last applied (a balancer's boot unit applies it)."""
        return f"{ETC_DIR}/{self.cluster}.yaml"

    @property
    def etc_dir(self):
        return f"{ETC_DIR}/{self.cluster}"

    @property
    def conf(self):
        return f"{self.etc_dir}/keepalived.conf"

    @property
    def check(self):
        return f"{self.etc_dir}/{CHECK_SCRIPT}"

    @property
    def notify(self):
        return f"{self.etc_dir}/{NOTIFY_SCRIPT}"

    @property
    def takeover(self):
        return f"{self.etc_dir}/{TAKEOVER_SCRIPT}"

    @property
    def takeover_rules(self):
        return f"{self.etc_dir}/takeover.nft"

    @property
    def announce(self):
        return f"{self.etc_dir}/{ANNOUNCE_SCRIPT}"

    @property
    def announce_map(self):
        """Mode ecmp: each VIP and the services on it."""
        return f"{self.etc_dir}/announce.map"

    @property
    def announce_slots(self):
        """Mode ecmp: drained real servers whose mh slots the announce hook
        gives back before it offers a VIP.  The hook finds it as the map's
        name with .slots in place of .map."""
        return f"{self.etc_dir}/announce.slots"

    @property
    def bird_conf(self):
        return f"{self.etc_dir}/bird.conf"

    # -- /run/lbctl: until the next boot ------------------------------------
    @property
    def run_dir(self):
        return f"{RUN_DIR}/{self.cluster}"

    @property
    def lock(self):
        """One lbctl at a time changing this cluster here (lbctl.records.lock)."""
        return f"{RUN_DIR}/{self.cluster}.lock"

    @property
    def state_dir(self):
        """Written by keepalived's notify hooks and checks, as the script user."""
        return f"{self.run_dir}/state"

    def pid_file(self, process="keepalived"):
        return f"{self.run_dir}/{process}.pid"

    def log_file(self, process="keepalived"):
        """Where a daemon lbctl starts without systemd (the lab) logs."""
        return f"{self.run_dir}/{process}.log"

    @property
    def vrrp_state(self):
        """The VRRP state keepalived's notify hook last recorded."""
        return f"{self.state_dir}/vrrp"

    @property
    def bird_socket(self):
        return f"{self.run_dir}/bird.ctl"

    @property
    def announce_dir(self):
        """Root's: a static route per VIP offered now, which bird.conf includes."""
        return f"{self.run_dir}/announce"

    @property
    def announce_slots_lock(self):
        """Held by the announce hook while it reads announce_slots and acts
        on it, and by apply and drain while they write it."""
        return f"{self.announce_dir}/slots.lock"

    @property
    def checker_fifo(self):
        """Mode ecmp: keepalived's checker makes it, and runs the announce hook
        each time it starts (see lbctl-announce)."""
        return f"{self.run_dir}/checker.fifo"

    @property
    def last_apply(self):
        """When apply last ran here and whether it succeeded (for the exporter)."""
        return f"{self.run_dir}/last-apply.json"

    # -- /var/lib/lbctl: across reboots --------------------------------------
    @property
    def ownership_record(self):
        return f"{OWNERSHIP_DIR}/{self.cluster}.json"

    @property
    def drain_record(self):
        """The workers `lbctl drain` took out of rotation on this balancer."""
        return f"{DRAIN_DIR}/{self.cluster}.json"

    @property
    def balancer_drained(self):
        """Mode ecmp: while this file exists (`lbctl drain-balancer`), the
        balancer offers the router nothing, across restarts and reboots."""
        return f"{DRAIN_DIR}/{self.cluster}.balancer"

    def loaded(self, daemon):
        """The digest of the files `daemon` (keepalived, bird) last (re)loaded.

        Files are written before the daemon is reloaded; an apply killed
        between the two, or a reload that failed, leaves files that match the
        cluster file and a daemon still running the old ones.  The record
        tells the next apply so.  It lives with the ownership records, since
        the daemon's unit loads the same files at boot."""
        return f"{VAR_DIR}/{self.cluster}.{daemon}-loaded"

    # -- the system's folders: boot units and sysctls ------------------------
    @property
    def sysctl_conf(self):
        return f"{SYSCTL_DIR}/90-lbctl-{self.cluster}.conf"

    @property
    def unit(self):
        """keepalived's unit."""
        return unit_name(self.cluster, "keepalived")

    @property
    def bird_unit(self):
        return unit_name(self.cluster, "bird")

    @property
    def exporter_unit(self):
        return unit_name(self.cluster, "exporter")

    def unit_file(self, purpose):
        return f"{UNIT_DIR}/{unit_name(self.cluster, purpose)}"

    def unit_wanted(self, purpose):
        """The link that starts the unit at boot (systemctl enable)."""
        return f"{WANTS_DIR}/{unit_name(self.cluster, purpose)}"

    # -- not paths, but named after the cluster the same way ------------------
    @property
    def nft_table(self):
        """The nftables table of the takeover grace (a pair's balancers only)."""
        return f"lbctl-{self.cluster}"

    def announce_argv(self, *args):
        """lbctl-announce as keepalived and apply run it."""
        return [self.real(self.announce), self.real(self.announce_dir),
                self.real(self.bird_socket), self.real(self.announce_map),
                self.real(self.balancer_drained), *args]
