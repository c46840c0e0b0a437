"""The daemons a balancer runs, each planned on its own: started, reloaded
and stopped daemon by daemon, in DAEMON_ORDER (BIRD after keepalived, and
stopped before it).

A fake daemon per name records what apply asks of it; the real adapters meet
the same protocol (test_adapters_contract.py) and run in the netns suite.
"""

from ipaddress import IPv4Address

from fakes import FakeAddresses, FakeDaemon, FakeFiles, FakeIpvs, FakeSysctls
from helpers import PI_ECMP, cluster_from, routed
from lbctl.adapters.protocols import Adapters
from lbctl.engine.desired import (
    BootApply, desired_state, leaving_real_servers, strip_saved_copy_header,
)
from lbctl.engine.table_order import check_table_order, configured_real_servers
from lbctl.engine.execute import execute
from lbctl.layout import Layout
from lbctl.engine.observe import observe
from lbctl.records.ownership import read_ownership
from lbctl.engine.plan import format_plan, make_plan
from lbctl.state import NodeState

ECMP = PI_ECMP
PAIR = routed(PI_ECMP.replace("mode: ecmp\n", "")
        .replace("bgp:\n  as: 65001\n  router: {address: 192.168.100.1, as: 65000}\n", "")
        .replace("  lb3: {address: 192.168.100.7, interface: eth0}\n", ""))
LAYOUT = Layout("pi-web")


class Balancer:
    """lb1 with fake keepalived, BIRD and exporter, and every step of apply but the kernel's."""

    def __init__(self, check_order=True):
        self.check_order = check_order  # False: an lbctl before engine/table_order.py
        self.warnings = []
        self.daemons = {name: FakeDaemon(name=name) for name in ("keepalived", "bird", "exporter")}
        self.calls = []  # (daemon, call), in the order they were made
        for daemon in self.daemons.values():
            daemon.calls = _Recorder(daemon.name, self.calls)
        self.adapters = Adapters(
            ipvs=FakeIpvs(), addresses=FakeAddresses({(IPv4Address("192.168.100.2"), 24, "eth0")}),
            sysctls=FakeSysctls(), files=FakeFiles(), daemons=self.daemons)

    def plan(self, text, remove=False):
        cluster = cluster_from(text)
        table = self.adapters.ipvs.dump()
        if self.check_order and not remove:
            self.warnings = check_table_order(cluster, table, self.applied_before,
                                              self.configured)
        if remove:
            desired = NodeState("balancer", "lb1", cluster.name)
        else:
            desired = desired_state(cluster, "lb1", "eth0", layout=LAYOUT,
                                    leaving=leaving_real_servers(cluster, table),
                                    boot=BootApply(text, "/usr/bin/python3"))
        owned = read_ownership(self.adapters.files, self.adapters.ownership_dir, cluster.name)
        observed = observe(desired, owned, self.adapters, self.adapters.addresses.list())
        return make_plan(desired, observed, owned)

    def configured(self):
        conf = self.adapters.files.read(LAYOUT.conf)
        return configured_real_servers(conf[0]) if conf else None

    def applied_before(self):
        saved = self.adapters.files.read(LAYOUT.saved_copy)
        return cluster_from(strip_saved_copy_header(saved[0])) if saved else None

    def apply(self, text, remove=False):
        """As apply does: after a daemon stops, plan again and apply the rest."""
        self.calls.clear()
        for _ in range(3):
            report = execute(self.plan(text, remove), self.adapters)
            if not report.replan:
                return report
        raise AssertionError("apply went on planning again")

    def daemon_calls(self):
        return [(name, call) for name, call in self.calls if call != "prepare"]


class _Recorder(list):
    """FakeDaemon.calls that also notes each call, with its daemon, in one shared list."""

    def __init__(self, name, shared):
        super().__init__()
        self.name, self.shared = name, shared

    def append(self, call):
        super().append(call)
        self.shared.append((self.name, call))


def changes(plan):
    return [(str(c.kind), c.key) for c in plan.changes
            if str(c.kind) in ("keepalived", "bird", "exporter")]


def test_an_ecmp_balancer_starts_keepalived_then_bird_and_records_each():
    node = Balancer()
    node.apply(ECMP)
    assert node.daemon_calls() == [("keepalived", "test"), ("bird", "test"),
                                   ("keepalived", "start"), ("bird", "start")]
    for name in ("keepalived", "bird"):
        assert node.adapters.files.read(LAYOUT.loaded(name)) is not None, name
    again = node.plan(ECMP)
    assert again.empty, format_plan(again)


def test_bird_down_under_a_running_keepalived_is_started_and_keepalived_still_reloads():
    """The lost reload: keepalived runs, BIRD stopped (by hand, or it failed),
    and the file changed.  keepalived must read its new files, and BIRD must
    run before that reload, whose offer sync BIRD takes."""
    node = Balancer()
    node.apply(ECMP)
    node.daemons["bird"].is_running = False
    more = ECMP.replace("  pi2: {address: 192.168.100.4}\n",
                        "  pi2: {address: 192.168.100.4}\n  pi4: {address: 192.168.100.8}\n")
    plan = node.plan(more)
    assert changes(plan) == [("bird", "start"), ("keepalived", "reload")], format_plan(plan)
    # keepalived is not starting: nothing of its table is handed over at weight 0.
    assert not [c for c in plan.changes if c.handover], format_plan(plan)
    node.apply(more)
    assert node.daemon_calls() == [("keepalived", "test"), ("bird", "start"),
                                   ("keepalived", "reload")]
    again = node.plan(more)
    assert again.empty, format_plan(again)


def test_a_changed_bird_conf_reloads_bird_alone():
    node = Balancer()
    node.apply(ECMP)
    held = ECMP.replace("  as: 65001\n", "  as: 65001\n  hold: 6s\n")
    plan = node.plan(held)
    assert changes(plan) == [("bird", "reload")], format_plan(plan)
    node.apply(held)
    assert node.daemon_calls() == [("bird", "test"), ("bird", "reload")]


def test_a_bird_conf_bird_rejects_changes_nothing():
    node = Balancer()
    node.apply(ECMP)
    before = dict(node.adapters.files.files)
    node.daemons["bird"].rejects = ["bird: bird.conf:12:3 syntax error"]
    try:
        node.apply(ECMP.replace("  as: 65001\n", "  as: 65001\n  hold: 6s\n"))
    except Exception as exc:  # noqa: BLE001 - the message is what the user sees
        assert "bird rejects it; nothing on this node was changed" in str(exc)
        assert "syntax error" in str(exc)
    else:
        raise AssertionError("apply took a config BIRD rejects")
    assert node.adapters.files.files == before
    assert ("bird", "reload") not in node.calls


def test_a_reload_lost_to_a_cut_short_apply_is_made_by_the_next_one():
    """The files were written, then apply died before BIRD reloaded: the
    record still names the old files, so the next apply reloads BIRD."""
    node = Balancer()
    node.apply(ECMP)
    held = ECMP.replace("  as: 65001\n", "  as: 65001\n  hold: 6s\n")
    node.daemons["bird"].reload = lambda: (_ for _ in ()).throw(KeyboardInterrupt())
    try:
        node.apply(held)
    except KeyboardInterrupt:
        pass
    del node.daemons["bird"].reload  # the fake's own again
    plan = node.plan(held)
    assert changes(plan) == [("bird", "reload")], format_plan(plan)
    assert "a reload was lost" in format_plan(plan)


def test_leaving_mode_ecmp_stops_bird_before_keepalived_reads_its_new_files():
    node = Balancer()
    node.apply(ECMP)
    plan = node.plan(PAIR)
    # The stop first: apply makes it alone, then plans the rest once BIRD has gone.
    assert changes(plan) == [("bird", "stop"), ("keepalived", "reload")], format_plan(plan)
    assert changes(plan)[0] == (str(plan.changes[0].kind), plan.changes[0].key)
    node.apply(PAIR)
    # keepalived's new config is tested before BIRD stops, and again as the
    # rest of the plan is made.
    assert node.daemon_calls() == [("keepalived", "test"), ("bird", "stop"),
                                   ("keepalived", "test"), ("keepalived", "reload")]
    assert not node.daemons["bird"].is_running
    assert node.adapters.files.read(LAYOUT.bird_conf) is None
    assert node.adapters.files.read(LAYOUT.loaded("bird")) is None
    again = node.plan(PAIR)
    assert again.empty, format_plan(again)


def test_a_pair_that_becomes_ecmp_starts_bird_and_reloads_keepalived():
    node = Balancer()
    node.apply(PAIR)
    node.apply(ECMP)
    assert node.daemon_calls() == [("bird", "test"), ("keepalived", "test"), ("bird", "start"),
                                   ("keepalived", "reload")]
    assert node.plan(ECMP).empty


def test_remove_stops_bird_then_keepalived():
    node = Balancer()
    node.apply(ECMP)
    node.apply(ECMP, remove=True)
    assert node.daemon_calls() == [("bird", "stop"), ("keepalived", "stop")]
    assert node.adapters.files.files == {}


def test_the_exporter_starts_after_the_others_restarts_with_its_unit_and_stops_first():
    node = Balancer()
    with_exporter = ECMP + "exporter: {listen: 'node:9588'}\n"
    node.apply(with_exporter)
    assert node.daemon_calls()[-3:] == [("keepalived", "start"), ("bird", "start"),
                                        ("exporter", "start")]
    assert node.plan(with_exporter).empty
    moved = with_exporter.replace("node:9588", "node:9589")
    plan = node.plan(moved)
    assert changes(plan) == [("exporter", "reload")], format_plan(plan)
    node.apply(moved)
    assert node.daemon_calls() == [("exporter", "test"), ("exporter", "reload")]
    # Without the section: stopped before its unit goes.
    plan = node.plan(ECMP)
    assert changes(plan)[0] == ("exporter", "stop"), format_plan(plan)
    node.apply(ECMP)
    assert not node.daemons["exporter"].is_running
    assert not [path for path in node.adapters.files.files if "exporter" in path]
    assert node.plan(ECMP).empty


def test_a_config_refused_after_a_stop_is_refused_before_the_stop():
    """Leaving mode ecmp stops BIRD first; were keepalived's new config tested
    only after that, a refusal would leave the balancer withdrawn."""
    node = Balancer()
    node.apply(ECMP)
    node.daemons["keepalived"].rejects = ["(keepalived.conf: Line 3) unknown keyword"]
    try:
        node.apply(PAIR)
    except Exception as exc:  # noqa: BLE001 - the message is what the user sees
        assert "keepalived rejects it; nothing on this node was changed" in str(exc)
    else:
        raise AssertionError("apply took a config keepalived rejects")
    assert node.daemons["bird"].is_running
    assert ("bird", "stop") not in node.calls
