"""In-memory stand-ins for the adapters, for unit tests of the pure logic only.

tests/test_adapters_contract.py checks each against the same Protocol as the
real adapter it replaces.
"""

import errno
from contextlib import contextmanager

from lbctl.adapters.protocols import IpvsDest, IpvsService, OpResult
from lbctl.state import FWD_DIRECT_ROUTING


class FakeIpvs:
    def __init__(self):
        self.services = {}  # ServiceKey -> ServiceSpec
        self.dests = {}  # DestKey -> [weight, forward, active]
        self.log = []
        self.fail = {}  # (verb, target, key) -> errno
        self.kernel_timeouts = {"tcp": 900, "tcp_fin": 120, "udp": 300}
        self.daemons = []  # [SyncDaemon]
        self.dumped = []  # what each dump() was asked for: None (all) or {ServiceKey}

    def dump(self):
        self.dumped.append(None)
        return self._table()

    def _table(self):
        result = []
        for key, spec in sorted(self.services.items()):
            # As the kernel lists them: each new one at the head of the list.
            dests = tuple(IpvsDest(d.address, d.port, w, fwd, active)
                          for d, (w, fwd, active) in reversed(self.dests.items())
                          if d.service == key)
            result.append(IpvsService(key, str(key), spec.scheduler, spec.persistence, dests,
                                      flags=spec.flags))
        return result

    def real_servers(self, services):
        self.dumped.append(set(services))
        table = {svc.key: svc.dests for svc in self._table()}
        return {key: table.get(key, ()) for key in services}

    def run(self, ops):
        results = []
        for op in sorted(ops, key=lambda o: o.target != "service"):
            key = op.service if op.target == "service" else op.dest
            code = self.fail.get((op.verb, op.target, key), 0) or self._apply(op)
            self.log.append((op.verb, op.target, str(key)))
            results.append((op, OpResult(op, OSError(code, "fake") if code else None, code)))
        order = {id(op): r for op, r in results}
        return [order[id(op)] for op in ops]

    def timeouts(self):
        return dict(self.kernel_timeouts)

    def set_timeouts(self, timeouts):
        self.log.append(("set", "timeouts", str(sorted(timeouts.items()))))
        self.kernel_timeouts.update(timeouts)

    def sync_daemons(self):
        return list(self.daemons)

    def stop_sync_daemon(self, role):
        self.log.append(("stop", "sync daemon", role))
        self.daemons = [d for d in self.daemons if d.role != role]

    def _apply(self, op):
        if op.target == "service":
            if op.verb == "add":
                if op.service in self.services:
                    return errno.EEXIST
                self.services[op.service] = op.spec
            elif op.verb == "set":
                self.services[op.service] = op.spec
            else:
                self.services.pop(op.service, None)
                for d in [d for d in self.dests if d.service == op.service]:
                    del self.dests[d]
            return 0
        if op.service not in self.services:
            return errno.ESRCH
        if op.verb == "del":
            self.dests.pop(op.dest, None)
        else:
            active = self.dests.get(op.dest, [0, 0, 0])[2]
            self.dests[op.dest] = [op.spec.weight, op.spec.forward, active]
        return 0

    def set_active(self, dest_key, active):
        self.dests[dest_key][2] = active


class FakeAddresses:
    def __init__(self, entries=(), elsewhere=None):
        self.entries = set(entries)  # (ip, prefixlen, ifname)
        self.elsewhere = dict(elsewhere or {})  # {IPv4Address: MAC} another host answers for
        self.unasked = {}  # {ifname: why} no probe could go out there
        self.log = []

    def list(self):
        return sorted(self.entries)

    def add(self, address):
        self.entries.add((address.ip, address.prefixlen, address.ifname))
        self.log.append(("add", str(address)))

    def remove(self, address):
        self.entries.discard((address.ip, address.prefixlen, address.ifname))
        self.log.append(("remove", str(address)))

    def announce(self, addresses):
        self.log += [("announce", str(a)) for a in addresses]

    def probe(self, addresses, listen):
        from lbctl.adapters.protocols import Probed

        self.log += [("probe", str(a)) for a in addresses]
        # As the real one: an interface no probe went out on hears no answer.
        return Probed(held={a: self.elsewhere[a.ip] for a in addresses
                            if a.ip in self.elsewhere and a.ifname not in self.unasked},
                      unasked={ifname: why for ifname, why in self.unasked.items()
                               if any(a.ifname == ifname for a in addresses)})


class FakeSysctls:
    def __init__(self, values=None):
        self.values = dict(values or {})

    def read(self, key):
        return self.values.get(key)

    def write(self, key, value):
        self.values[key] = value


class FakeFiles:
    def __init__(self):
        self.root = "/fake"
        self.files = {}
        self.links = {}
        self.writes = 0
        self.held = []  # the locks held now

    def read(self, path):
        found = self.files.get(path)  # (content, mode); every fake file is root's
        return None if found is None else (*found[:2], 0)

    def write(self, path, content, mode):
        self.files[path] = (content, mode)
        self.writes += 1

    @contextmanager
    def locked(self, lock):
        self.held.append(lock)
        try:
            yield
        finally:
            self.held.remove(lock)

    def remove(self, path):
        self.files.pop(path, None)
        self.links.pop(path, None)

    def readlink(self, path):
        return self.links.get(path)

    def symlink(self, path, target):
        self.links[path] = target


__all__ = ["FakeIpvs", "FakeAddresses", "FakeSysctls", "FakeFiles", "FWD_DIRECT_ROUTING"]


class FakeDaemon:
    """Records what apply asks of a daemon; `rejects` makes its config test fail."""

    def __init__(self, is_running=False, rejects=(), name="keepalived"):
        self.name = name
        self.is_running = is_running
        self.rejects = list(rejects)
        self.calls = []

    @classmethod
    def for_balancer(cls, layout, systemd, mode):
        return cls()

    def running(self):
        return self.is_running

    def test(self, text):
        self.calls.append("test")
        return list(self.rejects)

    def prepare(self, programs=frozenset()):
        self.calls.append("prepare")
        self.prepared_programs = programs

    def start(self):
        self.calls.append("start")
        self.is_running = True

    def reload(self):
        self.calls.append("reload")

    def stop(self):
        self.calls.append("stop")
        self.is_running = False
