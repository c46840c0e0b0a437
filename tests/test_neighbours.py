"""Clusters that share a balancer: what the kernel holds once for all of them."""

from pathlib import Path

from helpers import applied_here
from lbctl.engine.neighbours import clusters_here, shared_kernel_warnings
from lbctl.layout import Layout

GOLDEN = Path(__file__).parent / "golden"
PAIR = (GOLDEN / "pi-pair.yaml").read_text()
SINGLE = (GOLDEN / "pi-single.yaml").read_text()


def named(text, name, timeouts=""):
    return timeouts + text.replace("cluster: pi-web", f"cluster: {name}")


def test_a_second_pair_on_a_balancer_is_named_with_what_it_costs(tmp_path):
    web = applied_here(tmp_path, named(PAIR, "pi-web"))
    dns = applied_here(tmp_path, named(PAIR, "pi-dns"))
    lone = applied_here(tmp_path, named(SINGLE, "pi-lone"))
    assert [c.name for c in clusters_here(web, str(tmp_path))] == ["pi-dns", "pi-lone"]
    (warning,) = shared_kernel_warnings(web, clusters_here(web, str(tmp_path)))
    assert warning.startswith("cluster pi-dns is a failover pair on this balancer too: "), warning
    assert "one connection sync daemon per network namespace" in warning
    # A single balancer runs no sync daemon: nothing to say, either way round.
    assert shared_kernel_warnings(lone, [web, dns]) == []


def test_clusters_that_set_other_ipvs_timeouts_are_named_with_both_values(tmp_path):
    web = applied_here(tmp_path, named(SINGLE, "pi-web", "ipvs: {timeouts: {tcp: 900, udp: 30}}\n"))
    dns = applied_here(tmp_path, named(SINGLE, "pi-dns", "ipvs: {timeouts: {udp: 4}}\n"))
    same = applied_here(tmp_path, named(SINGLE, "pi-same", "ipvs: {timeouts: {tcp: 900}}\n"))
    silent = applied_here(tmp_path, named(SINGLE, "pi-silent"))
    assert shared_kernel_warnings(web, [same, silent]) == []
    (warning,) = shared_kernel_warnings(web, clusters_here(web, str(tmp_path)))
    assert warning.startswith("cluster pi-dns applied here sets the IPVS timeouts udp 4, "
                              "this file udp 30: the kernel holds one set"), warning
    assert shared_kernel_warnings(dns, [web]) == [warning.replace(
        "pi-dns applied here sets the IPVS timeouts udp 4, this file udp 30",
        "pi-web applied here sets the IPVS timeouts udp 30, this file udp 4")]


def test_a_saved_copy_that_no_longer_loads_is_left_out(tmp_path):
    web = applied_here(tmp_path, named(PAIR, "pi-web"))
    applied_here(tmp_path, named(PAIR, "pi-dns"))
    broken = Layout("pi-dns", str(tmp_path))
    Path(broken.real(broken.saved_copy)).write_text("cluster: [\n")
    assert clusters_here(web, str(tmp_path)) == []


def test_plan_and_apply_show_each_warning_before_the_drains():
    from types import SimpleNamespace

    from lbctl.status.render import describe_drains

    ctx = SimpleNamespace(drain_problem="the drain record is unreadable",
                          warnings=["cluster pi-dns is a failover pair on this balancer too"],
                          drains={})
    assert describe_drains(ctx, 0) == [
        "WARNING: the drain record is unreadable",
        "WARNING: cluster pi-dns is a failover pair on this balancer too"]
