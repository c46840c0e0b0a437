"""install --all and uninstall --all: lbctl itself onto the nodes, or off them.

The nodes need only python3 and sshd: the program that runs there
(remote/node_install.py) uses the standard library alone, and gets this
lbctl's wheel, and for an offline node the dependencies' wheels, as a tar
stream over SSH.
"""

import io
import os
import sys
import tarfile
from dataclasses import replace
from pathlib import Path

from lbctl import __version__
from lbctl.config import load_cluster
from lbctl.config.model import Mode
from lbctl.errors import NodeError
from lbctl.layout import INSTALL_LINK, INSTALL_VENV, OWNERSHIP_DIR
from lbctl.remote import node_install
from lbctl.remote.blocks import node_block, progress
from lbctl.remote.fleet import select
from lbctl.remote.ssh import NOT_FOUND, run_program_on
from lbctl.render.keepalived import SCRIPT_USER

# apt and pip on a Pi: a first install may fetch and unpack for minutes.
INSTALL_TIMEOUT = 1800
WHEEL_NAME = f"lbctl-{__version__}-py3-none-any.whl"


def run(args, out):
    cluster = load_cluster(args.file)
    selected = select(cluster, args.node)
    if args.command == "install":
        with _wheel(args.wheel) as wheel:
            payload = _payload(wheel, args.wheels)
            verb = f"installing lbctl {__version__} on"
            outcomes = _on_each(cluster, selected, "install", payload, args.ssh_config, verb)
    else:
        outcomes = _on_each(cluster, selected, "uninstall", b"", args.ssh_config,
                            "taking lbctl off")
    changed, failed = [], []
    for target in selected:
        outcome = outcomes[target.node]
        if outcome.returncode == NOT_FOUND:  # the shell's: no python3 (or no sudo)
            outcome = replace(outcome, returncode=1, stdout="", stderr=(
                f"the node has no python3 on root's PATH (or no sudo): {outcome.stderr.strip()}"))
        ok = outcome.returncode == 0 and outcome.problem() is None
        said = outcome.stdout.rstrip().splitlines()
        verdict = "FAILED" if not ok else said[-1].removeprefix("result: ") if said else "?"
        out.write(node_block(outcome, verdict) + "\n")
        if not ok:
            failed.append(target.node)
        elif verdict == "changed":
            changed.append(target.node)
    same = [t.node for t in selected if t.node not in failed and t.node not in changed]
    what = "installed on" if args.command == "install" else "taken off"
    out.write(f"{what} {len(selected) - len(failed)} of {len(selected)} node(s)"
              + (f"; changed: {', '.join(changed)}" if changed else "")
              + (f"; nothing to change: {', '.join(same)}" if same else "")
              + (f"; FAILED: {', '.join(failed)}" if failed else "") + "\n")
    return 1 if failed else 0


def packages_for(cluster, role):
    """The Debian packages a node of `role` needs (README, "Install on a node")."""
    if role == "worker":
        return ["python3-venv"]
    found = ["python3-venv", "ipvsadm"]
    if cluster.engine == "keepalived":
        found.append("keepalived")
    if cluster.mode == Mode.FAILOVER:
        found.append("nftables")  # the takeover grace
    if cluster.mode == Mode.ECMP:
        found.append("bird2")
    return found


def node_program(cluster, target, action):
    """The argv run on the node: python3 with node_install.py's text."""
    code = Path(node_install.__file__).read_text()
    # -I: root's Python imports nothing from the login's folder (sys.path's
    # first entry for -c) or the environment.
    argv = ["python3", "-I", "-c", code, action, "--venv", INSTALL_VENV, "--link", INSTALL_LINK,
            "--packages", *packages_for(cluster, target.role)]
    if action == "uninstall":
        argv += ["--state", OWNERSHIP_DIR, "--user", SCRIPT_USER]
    return argv


def _on_each(cluster, selected, action, payload, ssh_config, verb):
    from concurrent.futures import ThreadPoolExecutor

    progress(f"{verb} {', '.join(t.node for t in selected)} ...")
    with ThreadPoolExecutor(max_workers=min(8, len(selected))) as pool:
        futures = {t.node: pool.submit(run_program_on, t, node_program(cluster, t, action),
                                       payload, ssh_config, INSTALL_TIMEOUT)
                   for t in selected}
        return {node: future.result() for node, future in futures.items()}


def _payload(wheel, wheels_dir):
    """The tar stream the node reads: the wheel, and wheels/ for an offline node."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as archive:
        archive.add(wheel, arcname=os.path.basename(wheel), recursive=False)
        if wheels_dir is not None:
            names = sorted(n for n in os.listdir(wheels_dir)
                           if node_install.DEPENDENCY.fullmatch(n)
                           and os.path.isfile(os.path.join(wheels_dir, n)))
            if not names:
                raise NodeError(f"--wheels {wheels_dir}: no wheel in it (pip download -d "
                                f"{wheels_dir} {WHEEL_NAME})")
            for name in names:
                archive.add(os.path.join(wheels_dir, name), arcname=f"wheels/{name}",
                            recursive=False)
    return buffer.getvalue()


class _wheel:
    """This lbctl's wheel, as a path: the one named, the copy kept beside an
    installed lbctl, or one built from the checkout lbctl runs from (in a
    private folder, removed afterwards)."""

    def __init__(self, named):
        self.named, self.built = named, None

    def __enter__(self):
        if self.named is not None:
            name = os.path.basename(self.named)
            found = node_install.WHEEL.fullmatch(name)
            if found is None or not os.path.isfile(self.named):
                raise NodeError(f"--wheel {self.named}: not an lbctl wheel "
                                "(lbctl-VERSION-py3-none-any.whl)")
            if found[1] != __version__:
                raise NodeError(f"--wheel {self.named} is lbctl {found[1]}; this is lbctl "
                                f"{__version__}, and apply --all wants the same on every node")
            return self.named
        kept = os.path.join(sys.prefix, "share", "lbctl", WHEEL_NAME)
        if os.path.isfile(kept):
            return kept
        checkout = Path(__file__).resolve().parents[2]
        if (checkout / "pyproject.toml").is_file():
            return self._build(checkout)
        raise NodeError(f"no wheel of lbctl {__version__} here: pass --wheel FILE (a checkout's "
                        "`./dev.sh wheel` builds it)")

    def _build(self, checkout):
        import shutil
        import subprocess
        import tempfile

        self.built = tempfile.TemporaryDirectory(prefix="lbctl-wheel-")
        progress(f"building {WHEEL_NAME} from {checkout} ...")
        # From a copy: setuptools builds in the source tree, and would pack
        # whatever an earlier build left in build/ (a module since deleted).
        source = os.path.join(self.built.name, "source")
        shutil.copytree(checkout, source, ignore=shutil.ignore_patterns(
            ".venv", ".git", "build", "dist", "*.egg-info", "__pycache__"))
        done = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps",
                               "--no-build-isolation", "-w", self.built.name, source],
                              capture_output=True, text=True)
        wheel = os.path.join(self.built.name, WHEEL_NAME)
        if done.returncode != 0 or not os.path.isfile(wheel):
            raise NodeError(f"could not build {WHEEL_NAME} from {checkout}: "
                            f"{(done.stderr or done.stdout).strip()[-400:]}; pass --wheel FILE")
        return wheel

    def __exit__(self, *exc):
        if self.built is not None:
            self.built.cleanup()
