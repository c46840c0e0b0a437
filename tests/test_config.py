"""Loading and validating good files into the model."""

from ipaddress import IPv4Address, IPv4Network
from pathlib import Path

import pytest

from helpers import PI_ECMP, PI_SINGLE, cluster_from
from lbctl.config import load_cluster
from lbctl.config.model import RealServer, ServiceKey
from lbctl.errors import ConfigError

ROOT = Path(__file__).resolve().parent.parent


def test_the_shipped_example_is_valid():
    cluster = load_cluster(ROOT / "examples" / "pi-single.yaml")
    assert cluster.name == "pi-web"
    assert set(cluster.workers) == {"pi1", "pi2", "pi3"}


def test_defaults_fill_in_protocol_scheduler_weights_and_workers():
    cluster = cluster_from(PI_SINGLE.replace(", scheduler: wrr", ""))
    web = cluster.services["web"]
    assert (web.protocol, web.scheduler, web.persistence) == ("tcp", "wlc", 0)
    assert web.real_servers == (
        RealServer("pi1", IPv4Address("192.168.100.3"), 1),
        RealServer("pi2", IPv4Address("192.168.100.4"), 1),
        RealServer("pi3", IPv4Address("192.168.100.6"), 2),
    )
    assert cluster.network == IPv4Network("192.168.100.0/24")


def test_per_service_weights_override_worker_weights():
    text = PI_SINGLE.replace("scheduler: wrr}", "scheduler: wrr, workers: {pi1: 5, pi3: 0}}")
    web = cluster_from(text).services["web"]
    assert [(r.worker, r.weight) for r in web.real_servers] == [("pi1", 5), ("pi3", 0)]


def test_service_keys_print_in_the_greppable_form():
    cluster = cluster_from()
    assert str(cluster.services["dns"].key) == "udp 192.168.100.11:53"
    assert cluster.services["web"].key == ServiceKey("tcp", IPv4Address("192.168.100.10"), 80)


def test_network_key_widens_the_l2_check():
    text = PI_SINGLE.replace("pi3: {address: 192.168.100.6", "pi3: {address: 192.168.101.6")
    with pytest.raises(ConfigError, match="not on the balancer's L2 network 192.168.100.0/24"):
        cluster_from(text)
    assert cluster_from("network: 192.168.100.0/23\n" + text).network.prefixlen == 23


def test_a_vip_off_the_lan_is_refused_unless_the_file_says_it_is_routed():
    """A balancer answers ARP for its VIPs on the LAN: a VIP off it would be
    applied, held, and never reached."""
    off = PI_SINGLE.replace("vip: 192.168.100.10,", "vip: 10.9.0.10,")
    with pytest.raises(ConfigError) as refused:
        cluster_from(off)
    message = str(refused.value)
    assert message.startswith("cluster.yaml:"), message  # file:line:col
    assert "services.web.vip: 10.9.0.10 is not on the balancer's network 192.168.100.0/24" \
        in message and "`routed: true`" in message, message
    marked = off.replace("vip: 10.9.0.10,", "vip: 10.9.0.10, routed: true,")
    assert cluster_from(marked).services["web"].routed is True
    # A wider network: on the LAN after all.
    assert cluster_from("network: 10.0.0.0/8\n" + off.replace("192.168.100.", "10.9.0.")
                        .replace("vip: 10.9.0.10,", "vip: 10.9.0.200,")).services["web"]


def test_routed_is_refused_where_it_means_nothing():
    on_lan = PI_SINGLE.replace("vip: 192.168.100.10,", "vip: 192.168.100.10, routed: true,")
    with pytest.raises(ConfigError, match=r"services\.web\.routed: 192\.168\.100\.10 is on the "
                       "balancer's network .*leave it out"):
        cluster_from(on_lan)
    in_ecmp = PI_ECMP.replace("vip: 10.200.0.10,", "vip: 10.200.0.10, routed: true,")
    with pytest.raises(ConfigError, match=r"services\.web\.routed: in mode ecmp every VIP is "
                       "routed already"):
        cluster_from(in_ecmp)
    with pytest.raises(ConfigError, match=r"services\.web\.routed: expected true or false"):
        cluster_from(PI_SINGLE.replace("vip: 192.168.100.10,", "vip: 192.168.100.10, routed: 1,"))


def test_an_empty_file_names_the_missing_sections(tmp_path):
    empty = tmp_path / "empty.yaml"
    empty.write_text("")
    with pytest.raises(ConfigError) as err:
        load_cluster(empty)
    assert "missing required key 'cluster'" in str(err.value)


def test_a_missing_file_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match="cannot read file"):
        load_cluster(tmp_path / "nope.yaml")


def test_a_service_whose_workers_all_weigh_zero_is_refused_at_its_name():
    text = PI_SINGLE.replace("192.168.100.6, weight: 2}", "192.168.100.6, weight: 0}") \
        .replace("pi1: {address: 192.168.100.3}", "pi1: {address: 192.168.100.3, weight: 0}") \
        .replace("pi2: {address: 192.168.100.4}", "pi2: {address: 192.168.100.4, weight: 0}")
    with pytest.raises(ConfigError) as err:
        cluster_from(text)
    assert [(d.line, d.col, d.message.split(";")[0]) for d in err.value.diagnostics] == [
        (9, 3, "services.web: every worker of the service has weight 0, so it would take no "
               "traffic"),
        (10, 70, "services.dns: every worker of the service has weight 0, so it would take no "
                "traffic"),
    ]


def test_a_weight_of_zero_for_some_workers_is_still_fine():
    text = PI_SINGLE.replace("scheduler: wrr}", "scheduler: wrr, workers: {pi1: 0, pi2: 1}}")
    assert [r.weight for r in cluster_from(text).services["web"].real_servers] == [0, 1]


def test_persistence_is_a_duration_like_every_other_time_in_the_file():
    from helpers import PI_SINGLE, cluster_from

    for written, seconds in (("300", 300), ("300s", 300), ("5m", 300), ("1h", 3600),
                             ("1.1h", 3960), ("4.1m", 246), ("0", 0)):
        text = PI_SINGLE.replace("scheduler: wrr}", f"scheduler: wrr, persistence: {written}}}")
        assert cluster_from(text).services["web"].persistence == seconds, written
    with pytest.raises(ConfigError, match="not a whole number of seconds; IPVS counts it"):
        cluster_from(PI_SINGLE.replace("scheduler: wrr}", "scheduler: wrr, persistence: 1.5s}"))
    with pytest.raises(ConfigError, match="expected a duration such as 1s, 0.5s, 200ms or 15m"):
        cluster_from(PI_SINGLE.replace("scheduler: wrr}", "scheduler: wrr, persistence: 5min}"))


def test_a_duration_reads_as_the_seconds_written_to_the_last_digit():
    """700ms is the 0.7 keepalived's config will carry, not 0.7000000000000001,
    which keepalived refuses as having too many decimal places."""
    from lbctl.config.checker import Checker

    checker = Checker(None)
    for written, seconds in (("700ms", 0.7), ("350ms", 0.35), ("1150ms", 1.15), ("0.7s", 0.7),
                             ("1.5m", 90.0), ("2.2h", 7920.0)):
        found = checker.duration(written, ("x",), 0, 10 ** 6)
        assert found == seconds and repr(found) == repr(seconds), written

