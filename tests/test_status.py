"""How status reads on a balancer and on a worker."""

from lbctl.commands.status import format_status

BALANCER = {
    "services": [{"service": "tcp 192.168.100.10:80", "scheduler": "wrr", "persistence": 0,
                  "connections": 12, "conns_per_s": 2, "in_bytes_per_s": 900, "out_bytes_per_s": 0,
                  "real_servers": [{"address": "192.168.100.3:80", "forward": "route", "weight": 1,
                                    "active": 1, "inactive": 4, "connections": 5}]}],
    "vips_on_lo": [], "arp": {"all": {"arp_ignore": "0", "arp_announce": "0"}},
}
WORKER = {"services": [], "vips_on_lo": ["192.168.100.10"],
          "arp": {"all": {"arp_ignore": "1", "arp_announce": "2"},
                  "eth0": {"arp_ignore": "1", "arp_announce": "2"}}}


def test_a_balancer_shows_services_real_servers_connections_and_rates():
    text = format_status(BALANCER)
    assert "tcp 192.168.100.10:80 wrr  connections 12  2 conn/s  in 900 B/s  out 0 B/s" in text
    assert "-> 192.168.100.3:80" in text and "weight 1" in text and "active 1" in text
    assert "ARP settings" not in text


def test_a_worker_shows_its_vips_and_arp_settings():
    text = format_status(WORKER)
    assert "IPVS services: none" in text
    assert "VIPs on lo: 192.168.100.10" in text
    assert "eth0       arp_ignore=1  arp_announce=2" in text


def test_a_keepalived_balancer_shows_vrrp_state_and_each_workers_health(tmp_path):
    from lbctl.commands.status import keepalived_states

    state = tmp_path / "run/lbctl/pi-web/state"
    state.mkdir(parents=True)
    (state / "vrrp").write_text("MASTER 1000.5\n")
    (state / "health.web@pi1").write_text("up 1000.0\n")
    (state / "health.web@pi.2").write_text("down 1090.0\n")
    (state / "check.web@pi1").write_text("up 0\n")  # lbctl-check's own counter, not health
    states = keepalived_states(str(tmp_path))
    assert [h["worker"] for h in states["pi-web"]["health"]] == ["pi.2", "pi1"]
    text = format_status(dict(BALANCER, keepalived=states), now=1100.0)
    assert "keepalived for cluster pi-web: VRRP MASTER for 100s" in text
    assert "health web/pi1: up for 100s" in text
    assert "health web/pi.2: down for 10s" in text


def test_arp_settings_show_what_the_kernel_acts_on_the_larger_of_all_and_the_interface():
    from lbctl.commands.status import effective_arp

    raw = {"all": {"arp_ignore": "1", "arp_announce": "2"},
           "eth0": {"arp_ignore": "0", "arp_announce": "0"},
           "wlan0": {"arp_ignore": "8", "arp_announce": "0"}}
    assert effective_arp(raw) == {"all": {"arp_ignore": "1", "arp_announce": "2"},
                                  "eth0": {"arp_ignore": "1", "arp_announce": "2"},
                                  "wlan0": {"arp_ignore": "8", "arp_announce": "2"}}
