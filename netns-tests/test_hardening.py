"""What root trusts on a balancer, with real keepalived: a state folder its
script user could fill with traps, applies under a strict umask, and two
applies at once."""

import os
import shutil
import signal
import stat
import threading
from pathlib import Path

from lbctl.adapters.ipvs import READ_NEEDS_ROOT
from lbctl.layout import ETC_DIR, RUN_DIR
from test_keepalived import ALL_WEB, ipvs_web_serving, pair  # noqa: F401


def test_two_applies_under_umask_077_both_finish_and_their_checks_pass(lab, pair):
    root = Path(lab.nodes["lb1"].root)
    # lb1 from scratch: keepalived stopped, lbctl's folders gone.
    lab.kill_keepalived("lb1", signal.SIGTERM)
    for folder in (RUN_DIR, ETC_DIR):
        shutil.rmtree(root / folder.lstrip("/"))
    argv = ["sh", "-c", 'umask 077 && exec "$@"', "sh",
            *lab.lbctl_argv("apply", str(pair), node="lb1")]
    results = [None, None]

    def apply(i):
        results[i] = lab.sh("lb1", argv, check=False, timeout=600)
    threads = [threading.Thread(target=apply, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for done in results:
        assert done.returncode == 0, done.stdout + done.stderr
    layout = lab.layout("lb1")
    for folder in (ETC_DIR, layout.etc_dir, RUN_DIR, layout.run_dir, layout.state_dir):
        assert stat.S_IMODE(os.stat(layout.real(folder)).st_mode) == 0o755, folder
    # The damped web checks run as keepalived's script user, in those folders.
    lab.wait_for(lambda: ipvs_web_serving(lab, "lb1") == ALL_WEB, timeout=60,
                 what="every web worker checked and serving on lb1")
    plan = lab.lbctl("lb1", "plan", str(pair), "--detailed-exitcode")
    assert plan.returncode == 0, plan.stdout + plan.stderr
    lab.wait_for_roles()


def test_plan_and_status_without_root_ask_for_it(lab, pair):
    # Here ip_vs is loaded and the kernel refuses its every request without
    # CAP_NET_ADMIN (tests/test_without_root.py has a kernel that has not
    # loaded it).  Root with every capability dropped is such a user.
    no_capabilities = ["setpriv", "--inh-caps=-all", "--bounding-set=-all", "--"]
    for args in (("plan", str(pair)), ("status",)):
        done = lab.sh("lb1", no_capabilities + lab.lbctl_argv(*args, node="lb1"), check=False,
                      timeout=120)
        assert (done.returncode, done.stderr) == (1, f"lbctl: {READ_NEEDS_ROOT}\n"), \
            done.stdout + done.stderr
    plan = lab.lbctl("lb1", "plan", str(pair), "--detailed-exitcode")
    assert plan.returncode == 0, plan.stdout + plan.stderr


def test_traps_in_the_state_folder_neither_hang_nor_crash_status_or_apply(lab, pair):
    state = Path(lab.path("lb1", "state_dir"))
    # The names lbctl's own hooks use: a FIFO blocks an open for reading, and
    # /dev/zero never ends.  The script user owns this folder and can do this.
    (state / "health.web@pi1").unlink(missing_ok=True)
    os.mkfifo(state / "health.web@pi1")
    for name in ("health.web@pi2", "vrrp.transitions"):
        (state / name).unlink(missing_ok=True)
        (state / name).symlink_to("/dev/zero")
    try:
        status = lab.sh("lb1", lab.lbctl_argv("status", node="lb1"), check=False, timeout=120)
        assert status.returncode == 0, status.stdout + status.stderr
        assert "health web/pi3: up" in status.stdout
        applied = lab.sh("lb1", lab.lbctl_argv("apply", str(pair), node="lb1"), check=False,
                         timeout=300)
        assert "Traceback" not in applied.stderr, applied.stderr
        assert applied.returncode == 0, applied.stdout + applied.stderr
        # The two workers whose reports are traps show as not yet checked.
        assert "no check has passed yet for" in applied.stdout, applied.stdout
    finally:
        for name in ("health.web@pi1", "health.web@pi2", "vrrp.transitions"):
            (state / name).unlink(missing_ok=True)
