"""This cluster's keepalived: its config test, and starting, reloading and stopping it.

Where systemd runs, keepalived runs as lbctl's own unit.  Without systemd (the
lab, containers) lbctl starts it directly (adapters/process.py).
"""

import os
import pwd
import shutil
import signal
import stat
import subprocess
import time
from contextlib import suppress

from lbctl.adapters.files import ensure_dir, flock_within
from lbctl.adapters.process import DaemonProcess
from lbctl.adapters.programs import IPVSADM, KEEPALIVED, NFT, QUICK, USERADD, run
from lbctl.adapters.systemd import Systemd
from lbctl.errors import ApplyError
from lbctl.render.keepalived import SCRIPT_USER, keepalived_argv
from lbctl.trust import ancestors

MIN_VERSION = (2, 2, 2)
# lbctl-announce waits up to 30 s for its folder and 22 s for birdc.
ANNOUNCE_SECONDS = 60


class KeepalivedDaemon:
    """`takeover`: this balancer is one of a pair and has the takeover grace
    (keepalived/lbctl-takeover); otherwise any table of it is deleted.
    `announce`: mode ecmp, where keepalived's announce hook keeps the VIPs
    BIRD offers in step with its checks; nothing is on offer until this
    keepalived's checks pass."""

    name = "keepalived"

    def __init__(self, layout, systemd=None, binary=KEEPALIVED, takeover=False, nft=NFT,
                 announce=False, ipvsadm=IPVSADM):
        self.layout = layout
        self.binary = binary
        self.takeover = takeover
        self.nft = nft
        self.announce = announce
        self.ipvsadm = ipvsadm
        self.systemd = systemd or Systemd(layout.root)
        self.process = DaemonProcess(layout, "keepalived", layout.conf)

    @classmethod
    def for_balancer(cls, layout, systemd, mode):
        """The adapter a balancer in `mode` (None: lbctl leaves it) uses."""
        from lbctl.config.model import Mode

        return cls(layout, systemd, takeover=mode == Mode.FAILOVER, announce=mode == Mode.ECMP)

    # -- queries ---------------------------------------------------------------
    def running(self):
        return self.process.running(self.systemd, self.layout.unit)

    def test(self, text):
        """keepalived's own verdict on a candidate config: a list of problems, empty if fine."""
        self._require_installed()
        self._make_run_dirs()
        status, lines = self.process.check_config(
            text, [self.binary, "--config-test", "--use-file"])
        # keepalived 2.2.7 ends its config test with SIGTERM whenever script_user
        # is set (fixed in 2.2.8), so that status alone means nothing; its
        # findings are what it prints, and lbctl's config should draw none.
        if status in (0, -signal.SIGTERM) and not lines:
            return []
        return lines or [f"keepalived --config-test exited with status {status}"]

    # -- changes ---------------------------------------------------------------
    def prepare(self, programs=frozenset()):
        """The script user, the state folder its hooks write to, and the
        programs of exec checks, which keepalived runs as that user."""
        # apply prepares and tests before it changes anything: a missing keepalived
        # must stop it here, with nothing on the node changed.
        self._require_installed()
        self._require_recent()
        if self.takeover and not os.access(self.nft, os.X_OK):
            raise ApplyError("run", "nft", f"it is not installed ({self.nft} not found), and a "
                             "failover pair's balancers need it for the takeover grace: install "
                             "it with `apt install nftables`; nothing on this node was changed")
        if self.announce and not os.access(self.ipvsadm, os.X_OK):
            raise ApplyError("run", "ipvsadm", f"it is not installed ({self.ipvsadm} not found), "
                             "and mode ecmp's announce hook needs it to give a drained worker "
                             "its mh slots as keepalived starts: install it with `apt install "
                             "ipvsadm`; nothing on this node was changed")
        ensure_system_user(SCRIPT_USER)
        for program in sorted(programs):
            _require_runnable_by(_user(SCRIPT_USER), program)
        self._make_run_dirs()

    def start(self):
        self.prepare()
        if self.process.pid() is None:
            # State from an earlier run would show health keepalived no longer has.
            empty_folder(self.layout.real(self.layout.state_dir))
            if self.announce:
                # Nor may BIRD offer a VIP before this keepalived's checks pass.
                ensure_dir(self.layout.root, self.layout.announce_dir)
                run(self.layout.announce_argv("reset"), timeout=ANNOUNCE_SECONDS)
        self._load_takeover_rules(self.takeover)
        if self.systemd.runs:
            self.systemd.start(self.layout.unit, "keepalived")
        elif self.process.pid() is None:
            self.process.spawn(keepalived_argv(self.layout, self.binary))

    def reload(self):
        """keepalived reads its config again; in mode ecmp the VIPs on offer
        follow the new file's services."""
        self._load_takeover_rules(self.takeover)
        if self.systemd.runs:
            self.systemd.reload(self.layout.unit, "keepalived")  # ExecReload syncs the offers too
            return
        self.process.send_signal(signal.SIGHUP, "reload")
        if self.announce:
            refused = sync_offers(self.layout)
            if refused is not None:
                raise ApplyError("reload", "BIRD", refused)

    def stop(self):
        self._load_takeover_rules(False)  # before keepalived's stop hooks run
        if self.systemd.runs:
            self.systemd.stop(self.layout.unit, "keepalived")
            return
        self.process.terminate()
        if self.announce and os.path.exists(self.layout.real(self.layout.announce)):
            # However keepalived ended, BIRD offers nothing its checks no
            # longer vouch for (as the unit's ExecStopPost does).
            run(self.layout.announce_argv("reset"), timeout=ANNOUNCE_SECONDS)

    # -- helpers -------------------------------------------------------------
    def _load_takeover_rules(self, wanted):
        """Before keepalived (re)reads its config or stops: with the grace
        `wanted`, its rules as the file has them now, the armed set left as
        keepalived's hook last set it (only the hook knows when this balancer
        took over).  Without it, the table goes, so no rule of an earlier pair
        drops anything."""
        table = self.layout.nft_table
        rules = self.layout.real(self.layout.takeover_rules)
        if wanted:
            self._nft(f'include "{rules}"\n')
            return
        # The rules go first, under the lock keepalived's hook takes on them: a
        # hook that runs after this finds none and leaves the table gone.
        try:
            held = os.open(rules, os.O_RDONLY)
        except FileNotFoundError:
            held = None
        try:
            if held is not None:
                flock_within(held, rules)
                os.unlink(rules)
            if os.access(self.nft, os.X_OK):
                # (nft 1.0.6 has no "destroy": adding first makes the delete safe.)
                self._nft(f"add table ip {table}\ndelete table ip {table}\n")
        finally:
            if held is not None:
                os.close(held)

    def _nft(self, batch):
        done = run([self.nft, "-f", "-"], input=batch)
        if done.returncode != 0:
            raise ApplyError("load", f"nftables table {self.layout.nft_table}",
                             done.stderr.strip())

    def _require_installed(self):
        if not (os.path.isfile(self.binary) and os.access(self.binary, os.X_OK)):
            raise ApplyError("run", "keepalived", f"it is not installed ({self.binary} not "
                             "found), and this cluster's balancers need it: install it with "
                             "`apt install keepalived`; nothing on this node was changed")

    def _require_recent(self):
        """keepalived applies a changed weight on reload only from 2.2.2 on; an
        older one keeps the old weight, so drains and weight edits never reach
        IPVS while lbctl's table check waits for them."""
        found = _version(self.binary)
        if found is not None and found < MIN_VERSION:
            shown = ".".join(map(str, found))
            raise ApplyError("run", "keepalived", f"version {shown} is too old: lbctl needs "
                             f"{'.'.join(map(str, MIN_VERSION))} or later, which applies a "
                             "changed weight on reload (Debian bookworm has 2.2.7); nothing "
                             "on this node was changed")

    def _make_run_dirs(self):
        run_dir = ensure_dir(self.layout.root, self.layout.run_dir)
        # The one folder the script user writes: its hooks' state.  Made here
        # as a plain folder (never through a link) and handed over.
        state_dir = self.layout.real(self.layout.state_dir)
        with suppress(FileExistsError):
            os.mkdir(state_dir, 0o755)
        if not stat.S_ISDIR(os.lstat(state_dir).st_mode):
            raise ApplyError("make", state_dir, "it exists and is not a directory")
        user = _user(SCRIPT_USER)
        if user is not None:
            os.chown(state_dir, user.pw_uid, user.pw_gid, follow_symlinks=False)
        os.chmod(state_dir, 0o755, follow_symlinks=False)
        return run_dir


def empty_folder(path):
    """Everything in `path` removed, the folder kept.  The script user owns
    it and may have left a folder or a link there: links are removed, not
    followed, and folders go with what is in them."""
    for name in os.listdir(path):
        entry = os.path.join(path, name)
        # A hook still running may rename an entry away meanwhile.
        with suppress(FileNotFoundError):
            if os.path.isdir(entry) and not os.path.islink(entry):
                shutil.rmtree(entry)  # without following links in it
            else:
                os.unlink(entry)


def sync_offers(layout):
    """Mode ecmp: the VIPs on offer follow the announce map, the drain record
    and keepalived's records, and BIRD reads its config again (the announce
    hook's sync).  None when BIRD took it; else what went wrong."""
    done = run(layout.announce_argv("sync"), timeout=ANNOUNCE_SECONDS)
    return None if done.returncode == 0 else (done.stderr or done.stdout).strip()


def _user(name):
    try:
        return pwd.getpwnam(name)
    except KeyError:
        return None


def _require_runnable_by(user, program):
    """An exec check whose program the script user cannot run fails every probe,
    and every worker leaves the pool with nothing said: refuse it up front.
    Asked of the kernel as that user, so ACLs and groups count as they will."""
    groups = os.getgrouplist(user.pw_name, user.pw_gid)

    def can(test, path):
        try:
            return subprocess.run(["/usr/bin/test", test, path], user=user.pw_uid,
                                  group=user.pw_gid, extra_groups=groups,
                                  timeout=QUICK).returncode == 0
        except subprocess.TimeoutExpired:  # a hung network mount: as good as closed
            return False

    if can("-f", program) and can("-x", program):
        return
    reason = f"{program} is not an executable file"
    for folder in ancestors(program):
        if not can("-x", folder):
            reason = f"it may not enter {folder}"
            break
    if not os.path.exists(program):
        reason = f"{program} does not exist"
    raise ApplyError("check", f"exec health check {program}",
                     f"keepalived runs it as user {user.pw_name}, who cannot run it ({reason}): "
                     "install it where every user may run it, such as /usr/local/bin; "
                     "nothing on this node was changed")


NO_LOGIN_SHELLS = ("/usr/sbin/nologin", "/sbin/nologin", "/bin/false", "/usr/bin/false")
SYSTEM_UID_MAX = 999  # Debian's SYS_UID_MAX (/etc/login.defs); people's accounts start at 1000


def ensure_system_user(name):
    """A system user with no home and no login, as packages create them.

    An existing account of that name is used only if it is such a user:
    keepalived runs every check and hook as it, so a person's login account
    would get its files written by them and could edit what they report.
    """
    for _ in range(20):
        found = _user(name)
        if found is not None:
            if found.pw_uid > SYSTEM_UID_MAX or found.pw_uid == 0 \
                    or found.pw_shell not in NO_LOGIN_SHELLS:
                raise ApplyError("use", f"user {name} for keepalived's checks",
                                 f"it exists as a login account (uid {found.pw_uid}, shell "
                                 f"{found.pw_shell}); lbctl needs a system user without a "
                                 "login shell: remove or rename that account")
            return
        result = run([USERADD, "--system", "--user-group", "--no-create-home",
                       "--home-dir", "/nonexistent", "--shell", "/usr/sbin/nologin", name])
        if result.returncode == 0 or _user(name) is not None:
            return
        time.sleep(0.1)  # another apply holds the user database lock
    raise ApplyError("add", f"system user {name}", result.stderr.strip() or "useradd failed")


def _version(binary):
    """(major, minor, patch) from `keepalived --version`, or None if it says no number."""
    import re

    done = run([binary, "--version"])
    found = re.search(r"Keepalived v(\d+)\.(\d+)\.(\d+)", done.stdout + done.stderr)
    return tuple(int(n) for n in found.groups()) if found else None
