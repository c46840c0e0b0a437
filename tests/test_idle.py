"""A worker's connections across ECMP balancers (remote/idle.py): an entry
the router's move left open is set aside once another balancer saw the
connection close; everything else that keeps a worker busy counts."""

import io
import json
from types import SimpleNamespace

from lbctl.remote.idle import live_connections, wait_idle_across

KERNEL = {"tcp": 900, "tcp_fin": 120, "udp": 300}


def entry(state, expires, client_port=40000, protocol="tcp"):
    """One row of `status --connections --json`, a client's connection to pi2."""
    return {"protocol": protocol, "client": "10.0.0.9", "client_port": client_port,
            "vip": "10.200.0.10", "port": 80, "service": "web", "cluster": "pi-web",
            "worker": "pi2", "worker_address": "192.168.100.4", "worker_port": 80, "state": state,
            "expires": expires, "template": client_port == 0}


def table(*entries, timeouts=KERNEL, weight=0):
    """A balancer's answer: its entries, its kernel's timeouts, pi2's weight."""
    return {"connections": list(entries), "summary": [], "timeouts": timeouts,
            "real_servers": [{"service": "web", "cluster": "pi-web", "worker": "pi2",
                              "weight": weight}]}


def live(**tables):
    found, set_aside = live_connections(tables)
    return [(node, e["state"]) for node, e in found], set_aside


def test_a_connection_the_router_moved_and_that_closed_there_is_set_aside():
    # lb1 last saw it 50 s ago, established; lb2 picked it up and saw the
    # client's FIN 5 s ago (in direct routing FIN_WAIT is where a close rests).
    assert live(lb1=table(entry("ESTABLISHED", 850)), lb2=table(entry("FIN_WAIT", 115))) == \
        ([], {"lb1": 1})
    # A FIN that was the first packet lb2 saw: CLOSE, for 10 s.
    assert live(lb1=table(entry("ESTABLISHED", 850)), lb2=table(entry("CLOSE", 8))) == \
        ([], {"lb1": 1})


def test_a_connection_the_router_moved_that_goes_on_counts_once():
    assert live(lb1=table(entry("ESTABLISHED", 850)), lb2=table(entry("ESTABLISHED", 899))) == \
        ([("lb2", "ESTABLISHED")], {})


def test_an_open_entry_newer_than_the_close_is_a_connection_that_goes_on():
    # The client port reused for a new connection after the old one closed.
    assert live(lb1=table(entry("FIN_WAIT", 60)), lb2=table(entry("ESTABLISHED", 899))) == \
        ([("lb2", "ESTABLISHED")], {})


def test_with_nothing_to_show_it_closed_a_quiet_connection_counts():
    # Its end went elsewhere long ago, or it is just quiet: no telling.
    assert live(lb1=table(entry("ESTABLISHED", 10)), lb2=table()) == \
        ([("lb1", "ESTABLISHED")], {})


def test_a_handshake_under_way_counts_and_an_icmp_entry_shows_nothing():
    # The kernel counts SYN_RECV as active; a NONE entry is one IPVS made for
    # an ICMP error (schedule_icmp) and never took a state: it masks nothing.
    assert live(lb1=table(entry("SYN_RECV", 59)), lb2=table(entry("NONE", 3))) == \
        ([("lb1", "SYN_RECV")], {})
    assert live(lb1=table(entry("ESTABLISHED", 850)), lb2=table(entry("NONE", 3))) == \
        ([("lb1", "ESTABLISHED")], {})


def test_each_balancer_ages_its_entries_by_its_own_kernels_timeouts():
    # lb2's tcp_fin is 600: its FIN_WAIT with 100 s left was seen 500 s ago,
    # before lb1's last packet 50 s ago; the connection goes on through lb1.
    slow_fin = {**KERNEL, "tcp_fin": 600}
    assert live(lb1=table(entry("ESTABLISHED", 850)),
                lb2=table(entry("FIN_WAIT", 100), timeouts=slow_fin)) == \
        ([("lb1", "ESTABLISHED")], {})
    # More time left than the state allows: an entry due but not yet reaped,
    # whose count an older kernel printed wrapped.  It is as old as can be,
    # and hides nothing.
    assert live(lb1=table(entry("ESTABLISHED", 850)), lb2=table(entry("FIN_WAIT", 4000))) == \
        ([("lb1", "ESTABLISHED")], {})


def test_udp_flows_count_for_their_life_and_persistence_templates_not_at_all():
    assert live(lb1=table(entry("UDP", 200, protocol="udp"), entry("NONE", 300, client_port=0),
                          entry("ASSURED", 300, client_port=0))) == ([("lb1", "UDP")], {})


def test_different_connections_of_one_client_are_each_counted():
    assert len(live(lb1=table(entry("ESTABLISHED", 899, client_port=1)),
                    lb2=table(entry("ESTABLISHED", 899, client_port=2)))[0]) == 2


CLUSTER = SimpleNamespace(name="pi-web")
BALANCERS = [SimpleNamespace(node="lb1"), SimpleNamespace(node="lb2")]


def waited(answers, timeout=60):
    """wait_idle_across over the balancers' answers in turn, 2 s apart."""
    answers, now, out = iter(answers), [0.0], io.StringIO()

    def sleep(seconds):
        now[0] += seconds
    idle = wait_idle_across(CLUSTER, BALANCERS, "pi2", None, timeout, None, out,
                            ask=lambda: next(answers), clock=lambda: now[0], sleep=sleep)
    return idle, out.getvalue()


def test_the_wait_ends_once_the_connection_closes_where_it_went_and_names_what_is_left():
    going_on = ({"lb1": table(entry("ESTABLISHED", 850)), "lb2": table(entry("ESTABLISHED", 899))},
                [])
    closed = ({"lb1": table(entry("ESTABLISHED", 848)), "lb2": table(entry("FIN_WAIT", 119))},
              [])
    assert waited([going_on, closed]) == (
        True, "pi2 is idle on lb1, lb2 after 2s\n"
              "  lb1 still lists 1 ESTABLISHED entry of connections that closed through another "
              "balancer: ipvsadm and status count them as active until IPVS's tcp timeout\n")


def test_a_drain_undone_on_a_balancer_stops_the_wait_at_once():
    undone = ({"lb1": table(), "lb2": table(weight=1)}, [])
    assert waited([undone]) == (False, "pi2 has weight 1 on lb2 again: something undid the drain "
                                       "(an apply of another file?); not waiting\n")


def test_a_balancer_that_does_not_answer_keeps_idle_unconfirmed_until_the_timeout():
    silent = ({"lb1": table()}, ["lb2"])
    assert waited([silent] * 10, timeout=4) == (
        False, "pi2: idle not confirmed after 4s: no answer from lb2; it stays drained "
               "(`lbctl undrain pi2 FILE --all` puts it back)\n")


def test_at_the_timeout_the_connections_left_are_named_by_balancer():
    busy = ({"lb1": table(entry("ESTABLISHED", 899, client_port=1)),
             "lb2": table(entry("ESTABLISHED", 899, client_port=2),
                          entry("ESTABLISHED", 899, client_port=3))}, [])
    assert waited([busy] * 10, timeout=4) == (
        False, "pi2 still has 3 connection(s) after 4s (1 on lb1, 2 on lb2); it stays drained "
               "(`lbctl undrain pi2 FILE --all` puts it back)\n")


def test_services_of_no_cluster_or_of_another_neither_count_nor_undo_the_drain():
    # A hand-made service and another cluster's both send pi2's address new
    # connections: without --service the balancer reports them too.
    hand_made = dict(entry("ESTABLISHED", 899, client_port=7), service=None, cluster=None)
    other = dict(entry("ESTABLISHED", 899, client_port=8), service="web", cluster="pi-api")
    lb1 = table(hand_made, other)
    lb1["real_servers"] += [{"service": None, "cluster": None, "worker": None, "weight": 1},
                            {"service": "web", "cluster": "pi-api", "worker": "pi2", "weight": 1}]
    assert waited([({"lb1": lb1, "lb2": table()}, [])]) == (
        True, "pi2 is idle on lb1, lb2 after 0s\n"
              "  pi2 also has connections to services outside cluster pi-web (2 on lb1), which "
              "this drain does not stop\n")


def test_a_balancer_that_gives_no_table_says_why(monkeypatch):
    from lbctl.remote import idle

    outcomes = {"lb1": SimpleNamespace(returncode=255, stdout="", stderr=(
                    "ssh: connect to host 192.168.100.2 port 22: No route to host\n")),
                "lb2": SimpleNamespace(returncode=0, stdout="Traceback", stderr="")}
    monkeypatch.setattr(idle, "run_on_each", lambda *args, **kw: outcomes)
    assert idle._tables(BALANCERS, "pi2", None, None, 12.0) == (
        {}, ["lb1 (exit 255: ssh: connect to host 192.168.100.2 port 22: No route to host)",
             "lb2 (its answer is not JSON)"])


def test_a_balancer_that_leaves_out_the_weights_is_no_answer(monkeypatch):
    # Run without root, status leaves out what needs it: the weights, which
    # the wait needs to see the drain still holds.
    from lbctl.remote import idle

    without_root = json.dumps({"connections": [], "summary": []})
    with_root = json.dumps(table())
    asked = {}

    def run_on_each(targets, args_for, text, ssh_config, timeout):
        asked["timeout"] = timeout
        # Named from the copy each balancer applied, not from the file given.
        asked["args"] = args_for(targets[0])
        return {t.node: SimpleNamespace(returncode=0, stdout=with_root if t.node == "lb1"
                                        else without_root, stderr="") for t in targets}
    monkeypatch.setattr(idle, "run_on_each", run_on_each)
    assert idle._tables(BALANCERS, "pi2", None, None, 12.0) == (
        {"lb1": json.loads(with_root)},
        ["lb2 (lbctl ran there without root, and read no weights)"])
    assert asked["timeout"] == 12.0
    assert asked["args"] == ["status", "--connections", "--json", "--worker", "pi2"]
