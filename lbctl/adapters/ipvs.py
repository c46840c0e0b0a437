"""IPVS over generic netlink, through the lean message layer in ipvs_wire.

Writes go out in batches on one socket (see run()) and dumps are parsed with
struct, which keeps 1000 services x 10 real servers close to ipvsadm.
"""

import errno
import os
import socket
from ipaddress import IPv4Address

from lbctl.adapters import ipvs_wire
from lbctl.adapters.programs import MODPROBE, run
from lbctl.adapters.protocols import (
    IpvsDest, IpvsService, IpvsSnapshot, IpvsStats, OpResult, SyncDaemon,
)
from lbctl.config.model import ServiceKey
from lbctl.errors import KernelError

PROTOCOL_NAMES = {v: k for k, v in ipvs_wire.PROTOCOLS.items()}
SYNC_ROLES = {ipvs_wire.IP_VS_STATE_MASTER: "master", ipvs_wire.IP_VS_STATE_BACKUP: "backup"}
SYNC_STATES = {role: state for state, role in SYNC_ROLES.items()}
# What a reader without root is told: the kernel refuses it every IPVS
# request (EPERM), reads as much as writes.
READ_NEEDS_ROOT = ("reading IPVS needs root: the kernel answers IPVS requests, reads "
                   "included, only to a process with CAP_NET_ADMIN; run it with sudo")


def _ipvs_family(sock, load_module=True):
    """IPVS's generic netlink family; None when ip_vs is not loaded and
    `load_module` is False (nothing of IPVS is in the kernel then)."""
    try:
        return sock.family("IPVS")
    except FileNotFoundError:
        if not load_module:
            return None
    # Looking the netlink family up does not load ip_vs, and on a node that has
    # never run IPVS it is not loaded yet.
    loading = run([MODPROBE, "-q", "ip_vs"])
    try:
        return sock.family("IPVS")
    except FileNotFoundError:
        # Without the capability modprobe fails either way: its dry run says
        # whether there is a module to load.
        if loading.returncode != 0 and not holds_capability(CAP_SYS_MODULE) \
                and run([MODPROBE, "-n", "-q", "ip_vs"]).returncode == 0:
            raise KernelError("the ip_vs module is not loaded, and loading it needs root: "
                              "run it with sudo") from None
        raise KernelError("this kernel has no IPVS (the ip_vs module is missing or cannot "
                          "load); on a machine without it, try the lab: lbctl lab demo") from None


CAP_SYS_MODULE = 16  # linux/capability.h


def holds_capability(number, status="/proc/self/status"):
    """Whether this process holds capability `number` now (its CapEff)."""
    try:
        with open(status, encoding="ascii") as fh:
            for line in fh:
                if line.startswith("CapEff:"):
                    return bool(int(line.split()[1], 16) >> number & 1)
    except (OSError, ValueError, IndexError):
        pass
    return True  # unknown: say what the kernel said


class IpvsNetlink:
    def __init__(self, load_module=True, keep_open=False):
        """`load_module`: load ip_vs when it is not loaded yet (apply, drain).
        A command that only reads (plan) passes False, and finds an empty
        table: reading the state must not change it.  `keep_open`: one
        socket, and the family looked up once, for every read until close()
        (status --watch reads the table each second)."""
        self.load_module = load_module
        self.keep_open = keep_open
        self._kept = None  # (GenlSocket, family id) while kept open

    def close(self):
        if self._kept is not None:
            self._kept[0].close()
            self._kept = None

    # -- reading -----------------------------------------------------------
    def dump(self):
        """The table as apply, plan and drain need it: counters at zero (snapshot() has them)."""
        table = self._with_family(lambda sock, family: sock.ipvs_table(family, stats=False),
                                  absent=())
        return _services(table)

    def real_servers(self, services):
        """{ServiceKey: (IpvsDest, ...)} of the given services, each read by its
        key, counters at zero: what a whole dump would give for them, where
        the table may hold thousands."""
        def read(sock, family):
            return {key: sock.real_servers(family, key) for key in services}

        found = self._with_family(read, absent={})
        made = _Made()
        return {key: made.real_servers(dests) for key, dests in found.items()}

    def timeouts(self):
        """The kernel's IPVS timeouts: {"tcp": s, "tcp_fin": s, "udp": s}; {}
        when ip_vs is not loaded (they are not set until it is)."""
        return self._with_family(lambda sock, family: sock.timeouts(family), absent={})

    def set_timeouts(self, timeouts):
        """Set the named timeouts ({"udp": 60}); the others stay as they are."""
        self._with_family(lambda sock, family: sock.set_timeouts(family, timeouts), write=True)

    def _with_family(self, call, absent=None, write=False, load=None):
        """call(sock, family); `absent` when ip_vs is not loaded and, for a
        read, may not be loaded.  A write loads it whatever load_module says;
        `load=False` never does."""
        if self._kept is not None:
            sock, family = self._kept
        else:
            sock, family = ipvs_wire.GenlSocket(), None
        kept = False
        try:
            if family is None:
                may_load = (self.load_module or write) if load is None else load
                family = _ipvs_family(sock, may_load)
            if family is None:
                return absent
            found = call(sock, family)
            # Kept only after a whole answer: one cut short would leave its
            # remains for the next read.
            kept = self.keep_open
            return found
        except PermissionError:
            if write:
                raise  # apply names the write that was refused (execute.py)
            raise KernelError(READ_NEEDS_ROOT) from None
        finally:
            if kept:
                self._kept = (sock, family)
            else:
                self._kept = None
                sock.close()

    def snapshot(self):
        """Services and sync daemons, or None when the ip_vs module is not loaded.

        Unlike dump() it never loads ip_vs: reading the state must not change it.
        """
        def read_all(sock, family):
            return sock.ipvs_table(family), sock.sync_daemons(family), sock.timeouts(family)

        read = self._with_family(read_all, load=False)
        if read is None:
            return None
        table, daemons, timeouts = read
        return IpvsSnapshot(_services(table),
                            [self._sync_daemon(d) for d in daemons], timeouts)

    def sync_daemons(self):
        """The running connection sync daemons: [SyncDaemon]."""
        return [self._sync_daemon(d) for d in self._with_family(
            lambda sock, family: sock.sync_daemons(family), absent=())]

    def stop_sync_daemon(self, role):
        """Stop the "master" or "backup" sync daemon; one already stopped is done."""
        state = SYNC_STATES[role]
        try:
            self._with_family(lambda sock, family: sock.stop_sync_daemon(family, state),
                              write=True)
        except OSError as exc:
            if exc.errno != errno.ESRCH:  # the kernel's "no such daemon running"
                raise

    @staticmethod
    def _sync_daemon(d):
        return SyncDaemon(SYNC_ROLES.get(d.get("state"), str(d.get("state"))),
                          d.get("interface", ""), d.get("syncid", 0),
                          d.get("group", ""), d.get("port", 0))

    # -- writing -----------------------------------------------------------
    def run(self, ops):
        """Send every op, batched; one OpResult per op, in order.

        Requests go out hundreds to a sendmsg() on one socket and their acks
        are read back after each batch, instead of a round trip each.  Service
        ops are all answered before any real-server op is sent, so a real
        server never races the service it belongs to.
        """
        results = [OpResult(op) for op in ops]
        sock = ipvs_wire.GenlSocket()
        try:
            family = _ipvs_family(sock)
            for target in ("service", "dest"):
                batch = [r for r in results if r.op.target == target]
                builders = [lambda seq, op=r.op: ipvs_wire.op_message(family, seq, op) for r in batch]
                for result, code in zip(batch, sock.request_all(builders)):
                    if code:
                        result.errno = code
                        result.error = OSError(code, os.strerror(code))
        finally:
            sock.close()
        return results


NO_STATS = IpvsStats()  # what a dump without counters gives every entry


def _services(table):
    """IpvsServices of ipvs_wire's dicts."""
    made = _Made()
    services = []
    for svc, dests in table:
        flags = svc.get("flags", 0)
        persistence = svc.get("timeout", 0) if flags & ipvs_wire.IP_VS_SVC_F_PERSISTENT else 0
        proto = PROTOCOL_NAMES.get(svc.get("protocol"))
        scheduler = svc.get("scheduler", "")
        if svc.get("fwmark") or proto is None or svc.get("af") != socket.AF_INET:
            # Not one lbctl makes: no key, and a label to show it by.
            key = None
            label = f"fwmark {svc['fwmark']}" if svc.get("fwmark") else \
                f"proto {svc.get('protocol')} {svc.get('addr')}"
        else:
            key = ServiceKey(proto, made.address(svc["addr"]), svc["port"])
            label = str(key)
        services.append(IpvsService(key, label, scheduler, persistence, made.real_servers(dests),
                                    made.stats(svc["stats"]),
                                    ipvs_wire.flag_names(flags, scheduler)))
    return services


class _Made:
    """Model objects of ipvs_wire's dicts, for one read.  The same few real
    servers recur in many services: each address is made into an
    IPv4Address once."""

    def __init__(self):
        self.addresses = {}

    def address(self, text):
        found = self.addresses.get(text)
        if found is None:
            found = self.addresses[text] = IPv4Address(text)
        return found

    @staticmethod
    def stats(counters):
        return IpvsStats(**counters) if counters else NO_STATS

    def real_servers(self, dests):
        return tuple(IpvsDest(self.address(d["addr"]), d["port"], d["weight"], d["forward"],
                              d["active"], d["inactive"], self.stats(d["stats"]))
                     for d in dests if "addr" in d)
