"""NodeStatus: `status --json` written by to_json and read back by from_json,
which every reader of a node's answer goes through; a wrong shape anywhere
is one StatusShapeError naming the field."""

import json

import pytest

from helpers import keepalived_status, node_status, service_status
from lbctl.status.model import NodeStatus, StatusShapeError

FULL = node_status(
    services=[service_status(flags=["mh-port"], real_servers=[
        {"address": "192.168.100.3:80", "weight": 1, "drained": True}])],
    timeouts={"tcp": 900, "tcp_fin": 120, "udp": 300},
    sync={"daemons": [{"role": "backup", "interface": "eth0", "syncid": 51,
                       "group": "224.0.0.81", "port": 8848}],
          "learned_connections": 3, "warning": None},
    drains=[{"cluster": "pi-web", "worker": "pi2", "services": "every service", "since": 5.0},
            {"cluster": "other", "error": "the drain record is damaged"}],
    keepalived={
        "pi-web": keepalived_status(vrrp={"state": "BACKUP", "since": 7.5}, transitions=2,
                                    advertised_addresses=["169.254.255.1"],
                                    health=[{"service": "web", "worker": "pi1", "state": None,
                                             "since": None}]),
        "routed": keepalived_status(pair=False, mode="ecmp", bgp={
            "router": "192.168.100.1", "error": None, "state": "Established", "since": 3.0,
            "last_error": None, "offered": [{"vip": "10.200.0.10", "since": 4.0}]})},
    drift=["~ file /etc/lbctl/pi-web/keepalived.conf"], drift_error=None)


def test_what_to_json_writes_from_json_reads_back_the_same():
    status = NodeStatus.from_json(json.loads(json.dumps(FULL)))
    assert status.to_json() == FULL
    assert NodeStatus.from_json(status.to_json()) == status
    assert status.keepalived["pi-web"].health_by_pair()[("web", "pi1")].state is None
    assert status.keepalived["routed"].bgp.offered[0].vip == "10.200.0.10"


def test_what_was_not_asked_or_is_not_there_is_left_out_of_the_json():
    bare = NodeStatus.from_json(node_status(ipvs_loaded=False))
    data = bare.to_json()
    assert "sync" not in data and "timeouts" not in data  # IPVS not loaded
    assert "drift" not in data and "drift_error" not in data  # --no-drift
    assert "bgp" not in NodeStatus.from_json(FULL).to_json()["keepalived"]["pi-web"]


@pytest.mark.parametrize("answer, named", [
    (None, "the status: null, not an object"),
    ([], "the status: a list, not an object"),
    ("lb1", "the status: a string, not an object"),
    ({**FULL, "services": {}}, "services: an object, not a list"),
    ({**FULL, "ipvs_loaded": 1}, "ipvs_loaded: a number, not true or false"),
    ({**FULL, "vips_on_lo": [10]}, "vips_on_lo[0]: a number, not a string"),
    ({**FULL, "arp": {"all": []}}, "arp.all: a list, not an object"),
    ({**FULL, "keepalived": {"pi-web": []}}, "keepalived.pi-web: a list, not an object"),
    ({**FULL, "keepalived": {"pi-web": keepalived_status(
        health=[{"service": "web", "worker": "pi1", "state": "up", "since": "now"}])}},
     "keepalived.pi-web.health[0].since: a string, not a number"),
    ({**FULL, "keepalived": {"pi-web": keepalived_status(transitions=True)}},
     "keepalived.pi-web.transitions: a boolean, not a whole number"),
    ({key: value for key, value in FULL.items() if key != "arp"}, "arp: missing"),
    ({**FULL, "services": [service_status(real_servers=[{"address": "x", "weight": None}])]},
     "services[0].real_servers[0].weight: null, not a whole number"),
])
def test_a_wrong_shape_anywhere_is_one_error_naming_the_field(answer, named):
    with pytest.raises(StatusShapeError) as err:
        NodeStatus.from_json(answer)
    assert str(err.value) == named


def test_a_field_of_a_later_lbctl_is_left_out_and_a_deep_answer_is_not_a_crash():
    later = {**FULL, "new_table": [1, 2], "keepalived": {
        **FULL["keepalived"], "pi-web": {**FULL["keepalived"]["pi-web"], "new_flag": True}}}
    assert NodeStatus.from_json(later) == NodeStatus.from_json(FULL)
    from lbctl.remote.fleet import parse_status

    assert parse_status("[" * 100000 + "]" * 100000) is None  # RecursionError in json
