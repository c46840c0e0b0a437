"""What `lbctl install --all` and `uninstall --all` run on each node.

The node has no lbctl yet (or another version), so this runs with the
system's python3 and the standard library alone: `python3 -c` with this
file's text, the paths and package names as arguments, and lbctl's wheel
(with the dependencies' wheels, for an offline node) as a tar stream on
standard input.  Nothing here goes through a shell.  It prints one line per
step, and a last line `result: changed` or `result: unchanged`.

Below $LBCTL_ROOT where that is set (a lab node's own tree), as lbctl is.
"""

import argparse
import glob
import os
import pwd
import re
import shutil
import stat
import subprocess
import sys
import tarfile
import tempfile

WHEEL = re.compile(r"lbctl-([0-9][A-Za-z0-9.+]*)-py3-none-any\.whl")
# Wheels and source archives pip can install from (--wheels DIR).
DEPENDENCY = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+-]*\.(whl|tar\.gz|zip)")
SYSTEM_UID_MAX = 999
APT_LOCK_SECONDS = 600
# compileall's -x: the packages compile_ahead leaves to their first use.
ROOT_ONLY = r"/site-packages/scapy/"
# Debian's pip as a wheel (python3-pip-whl, which python3-venv depends on).
# pip runs from it for the venv's Python, so none is copied into the venv:
# ensurepip's copy took longer than the rest of the install on a slow
# node, and more room than lbctl and its dependencies.
SYSTEM_PIP = "/usr/share/python-wheels/pip-*.whl"
# The command line's own help, made by the installed lbctl from its parser,
# where bash-completion, zsh and man read what the administrator adds:
# (lbctl's arguments, the file, how a file lbctl wrote there begins).
HELP_FILES = (
    (("completion", "bash"), "/usr/local/share/bash-completion/completions/lbctl",
     "# bash completion for lbctl, made by "),
    (("completion", "zsh"), "/usr/local/share/zsh/site-functions/_lbctl",
     "#compdef lbctl\n# zsh completion for lbctl, made by "),
    (("manpage",), "/usr/local/share/man/man8/lbctl.8", ".TH LBCTL 8 "),
)


class Refused(Exception):
    """What stops the install, said to the user; `output`: all a failed
    command printed, where one did."""

    def __init__(self, message, output="", error=""):
        super().__init__(message)
        self.output, self.error = output, error or message


def main(argv):
    parser = argparse.ArgumentParser(prog="lbctl install (on the node)")
    parser.add_argument("action", choices=("install", "uninstall"))
    parser.add_argument("--venv", required=True)
    parser.add_argument("--link", required=True)
    parser.add_argument("--packages", nargs="*", default=[])
    parser.add_argument("--state", default=None, help="lbctl's records; uninstall waits for them")
    parser.add_argument("--user", default=None, help="the system user apply made, if any")
    args = parser.parse_args(argv)
    # The venv, its link and the help files are every user's to read (the
    # exporter runs as a user of its own), whatever umask sudo passed on.
    os.umask(0o022)
    if os.geteuid() != 0:
        raise Refused("needs root: log in as root, or as a user with passwordless sudo "
                      "(`ssh: {sudo: true}` in the file)")
    root = os.environ.get("LBCTL_ROOT") or "/"
    venv, link = below(root, args.venv), below(root, args.link)
    changed = (install if args.action == "install" else uninstall)(args, root, venv, link)
    print(f"result: {'changed' if changed else 'unchanged'}")


def below(root, path):
    return os.path.join(root, path.lstrip("/"))


def install(args, root, venv, link):
    with tempfile.TemporaryDirectory(prefix="lbctl-install-") as received:
        wheel, wheels = unpack(sys.stdin.buffer, received)
        version = WHEEL.fullmatch(os.path.basename(wheel))[1]
        changed = install_packages(args.packages)
        python = os.path.join(venv, "bin", "python")
        system = system_pip()
        pip = pip_argv(python, system)
        own_pip = system is None  # no system pip wheel to run: the venv gets a pip of its own
        if not os.path.lexists(python):
            make_venv(venv, own_pip)
            say(f"venv {args.venv}: created")
            changed = True
        elif (problem := venv_problem(venv, pip, own_pip)) is not None:
            make_venv(venv, own_pip, again=True)
            say(f"venv {args.venv}: made again ({problem})")
            changed = True
        changed |= install_wheel(pip, python, venv, wheel, version, wheels)
        changed |= make_link(os.path.join(venv, "bin", "lbctl"), link, args.link)
        changed |= write_help_files(root, python)
    return changed


def system_pip():
    found = sorted(glob.glob(SYSTEM_PIP))
    return found[-1] if found else None


def pip_argv(python, wheel):
    """pip for the venv's Python: from the system's wheel, or the venv's own."""
    return [python, "-I", os.path.join(wheel, "pip")] if wheel else [python, "-I", "-m", "pip"]


def make_venv(venv, own_pip, again=False):
    run([sys.executable, "-I", "-m", "venv", *([] if own_pip else ["--without-pip"]),
         *(["--clear"] if again else []), venv])


def venv_problem(venv, pip, own_pip):
    """Why the venv must be made again, or None.  A distribution upgrade
    (3.11 to 3.13) takes the Python it links to away, or leaves it linked
    to a Python that does not read the site-packages the old one filled;
    a venv made half (before its own pip) has no pip.  Asked cheaply: pip
    from the system's wheel takes a Pi seconds to start."""
    if not os.path.isfile(os.path.join(venv, "pyvenv.cfg")):
        # Its python would be the system's own, and pip would install into /usr.
        return "it has no pyvenv.cfg"
    made_by = venv_version(venv)
    this = f"{sys.version_info[0]}.{sys.version_info[1]}"
    if made_by is not None and made_by != this:
        return f"Python {made_by} made it; this is Python {this}"
    argv = [*pip, "--version"] if own_pip else [os.path.join(venv, "bin", "python"), "-I",
                                                 "-c", ""]
    try:
        done = subprocess.run(argv, capture_output=True, cwd="/")
    except OSError:  # its python links to one that is gone
        return "its Python is gone"
    if done.returncode != 0:
        return "its pip does not run" if own_pip else "its Python does not run"
    return None


def venv_version(venv):
    """The Python version ("3.11") that made the venv, from its pyvenv.cfg; None unread."""
    try:
        with open(os.path.join(venv, "pyvenv.cfg"), encoding="utf-8") as fh:
            for line in fh:
                key, _, value = line.partition("=")
                if key.strip() in ("version", "version_info"):
                    return ".".join(value.strip().split(".")[:2])
    except OSError:
        pass
    return None


def unpack(stream, into):
    """The wheel's path and the dependencies' folder (None without one), from
    the tar stream: plain files with plain names only, written by this
    process into its private folder, never extracted by name."""
    wheel, wheels = None, None
    with tarfile.open(fileobj=stream, mode="r|") as archive:
        for member in archive:
            folder, _, name = member.name.rpartition("/")
            if not member.isfile() or folder not in ("", "wheels"):
                raise Refused(f"unexpected entry in the payload: {member.name!r}")
            if folder == "" and WHEEL.fullmatch(name) and wheel is None:
                wheel = os.path.join(into, name)
                target = wheel
            elif folder == "wheels" and DEPENDENCY.fullmatch(name):
                wheels = os.path.join(into, "wheels")
                os.makedirs(wheels, exist_ok=True)
                target = os.path.join(wheels, name)
            else:
                raise Refused(f"unexpected entry in the payload: {member.name!r}")
            with archive.extractfile(member) as source, open(target, "xb") as out:
                shutil.copyfileobj(source, out)
    if wheel is None:
        raise Refused("the payload holds no lbctl wheel")
    return wheel, wheels


def install_packages(packages):
    if packages and shutil.which("dpkg-query") is None:
        say(f"packages: not checked, no dpkg here (not Debian or Raspberry Pi OS): see that "
            f"{' '.join(packages)} or their like are installed")
        return False
    missing = [p for p in packages if not package_installed(p)]
    if not missing:
        if packages:
            say(f"packages: {' '.join(packages)} present")
        return False
    # apt's words in English whatever the login's locale (ssh and sudo pass
    # LANG on): a held lock is told by what apt says.
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive", LC_ALL="C.UTF-8")
    # A Pi's first minutes after boot go to apt's daily jobs: wait for
    # their locks rather than fail on them.
    apt = ["apt-get", "-o", f"DPkg::Lock::Timeout={APT_LOCK_SECONDS}", "-q"]
    command = [*apt, "install", "-y", "--no-install-recommends", *missing]
    try:
        run_while_locked(lambda: run(command, env=env))
    except Refused as first:
        # A fresh image's package lists may be missing or stale: once more
        # after an update.  Should that fail too, the first failure is said
        # as well: it may be the one that explains.
        try:
            run_while_locked(lambda: run([*apt, "update"], env=env))
            run_while_locked(lambda: run(command, env=env))
        except Refused as exc:
            raise Refused(f"{exc}; before apt-get update: {first.error}") from None
    say(f"packages: installed {' '.join(missing)}")
    return True


def run_while_locked(step, patience=APT_LOCK_SECONDS, spacing=5.0, clock=None, sleep=None):
    """step() again while it fails on a lock apt holds, for up to `patience`
    seconds: DPkg::Lock::Timeout waits for dpkg's lock only.  apt-get update
    fails at once on the package lists' lock, and install on the downloads'
    (/var/cache/apt/archives/lock), which apt's daily jobs hold through a
    Pi's first minutes after boot."""
    import time

    clock, sleep = clock or time.monotonic, sleep or time.sleep
    deadline = clock() + patience
    while True:
        try:
            return step()
        except Refused as exc:
            if "Could not get lock" not in exc.output or clock() + spacing > deadline:
                raise
        sleep(spacing)


def package_installed(name):
    done = subprocess.run(["dpkg-query", "-W", "-f=${Status}", name], capture_output=True,
                          text=True, cwd="/")
    return done.returncode == 0 and done.stdout.endswith(" installed")


def install_wheel(pip, python, venv, wheel, version, wheels):
    """pip installs the wheel unless the same build is installed: its copy
    is kept in the venv, and the two wheels' RECORDs (each file's digest)
    compared, since two builds of one checkout differ only in their zip's
    timestamps."""
    kept_dir = os.path.join(venv, "share", "lbctl")
    kept = os.path.join(kept_dir, os.path.basename(wheel))
    if os.path.exists(kept) and contents(kept) == contents(wheel) and \
            installed_version(python) == version:
        say(f"lbctl {version}: installed already")
        return False
    before = installed_version(python)
    # No cache: a node installs lbctl once a release, and uninstall leaves nothing.
    pip = [*pip, "install", "-q", "--disable-pip-version-check", "--no-cache-dir",
           "--no-compile"]
    if wheels is not None:
        pip += ["--no-index", "--find-links", wheels]
    if before == version:
        pip += ["--force-reinstall", "--no-deps"]  # another build of the same version
    run([*pip, wheel])
    compile_ahead(python, venv)
    os.makedirs(kept_dir, exist_ok=True)
    for old in os.listdir(kept_dir):
        if WHEEL.fullmatch(old):
            os.unlink(os.path.join(kept_dir, old))
    shutil.copyfile(wheel, kept)
    say(f"lbctl {version}: " + (f"upgraded from {before}" if before not in (None, version)
                                else "installed"))
    return True


def compile_ahead(python, venv):
    """Byte-compile what the venv holds, but for the packages only root
    imports (doctor's scapy, half of pip's install time on its own): root's
    first use compiles what it needs and keeps it.  The rest is compiled
    now, since a command run by another user, or the exporter's unit as
    its dynamic user, may not write the venv and would compile it anew at
    each start."""
    for site in glob.glob(os.path.join(venv, "lib", "python3*", "site-packages")):
        done = subprocess.run([python, "-I", "-m", "compileall", "-q", "-x", ROOT_ONLY, site],
                              capture_output=True, text=True, cwd="/")
        if done.returncode != 0:  # as pip's own compiling: slower starts, not a failure
            say(f"compiling {site}: not every file compiled: {last_line(done)}")


def installed_version(python):
    if not os.path.exists(python):
        return None
    done = subprocess.run([python, "-I", "-c", "import importlib.metadata as m; "
                           "print(m.version('lbctl'))"], capture_output=True, text=True)
    return done.stdout.strip() if done.returncode == 0 else None


def make_link(target, link, shown):
    if os.path.islink(link) and os.readlink(link) == target:
        say(f"link {shown}: in place")
        return False
    if os.path.lexists(link) and not (os.path.islink(link) and is_ours(os.readlink(link))):
        raise Refused(f"{shown} exists and is not lbctl's link: left as it is; move it away "
                      "and run install again")
    put_in_place(link, lambda fresh: os.symlink(target, fresh))
    say(f"link {shown}: made")
    return True


def is_ours(target):
    return target.endswith("/bin/lbctl")


def write_help_files(root, python):
    """The completion scripts and the man page, as the lbctl installed makes
    them.  A file there that lbctl did not write (or anything but a file) is
    left as it is, and one that cannot be written is said: neither stops an
    install whose lbctl is in place by now."""
    written, foreign, failed = [], [], []
    for argv, path, mark in HELP_FILES:
        target = below(root, path)
        done = subprocess.run([python, "-I", "-m", "lbctl", *argv], capture_output=True,
                              text=True, cwd="/")
        if done.returncode != 0:
            say(f"completion and man page: not made ({last_line(done)})")
            return bool(written)
        try:
            old = own_text(target, mark)
            if old == done.stdout:
                continue
            if old is False:
                foreign.append(path)
                continue
            replace_text(target, done.stdout)
            written.append(path)
        except OSError as exc:
            failed.append(f"{path} not written ({exc.strerror or exc})")
    say("completion and man page: " + ("written" if written else "in place")
        + "".join(f"; {path} is not lbctl's: left as it is" for path in foreign)
        + "".join(f"; {problem}" for problem in failed))
    return bool(written)


def own_text(path, mark):
    """A help file's text if lbctl wrote it; None if there is nothing there;
    False for anything else (another's file, a link, a folder, a pipe)."""
    try:
        found = os.lstat(path)
    except FileNotFoundError:
        return None
    if not stat.S_ISREG(found.st_mode):
        return False
    with open(path, encoding="utf-8", errors="replace") as fh:
        text = fh.read()
    return text if text.startswith(mark) else False


def replace_text(path, text):
    """`path` holds `text`, readable by all, put in place whole."""
    def write(fresh):
        with open(fresh, "x", encoding="utf-8") as fh:  # O_EXCL
            os.fchmod(fh.fileno(), 0o644)
            fh.write(text)
    put_in_place(path, write)


def put_in_place(path, make):
    """make(name) makes the new `path` under a name no one can know in
    advance, then a rename puts it in place whole.  A fixed name could be
    planted, or swapped between the making and the rename; make() fails on
    a name that exists (O_EXCL, symlink), so nothing planted is followed.
    The name's dot hides it from zsh's search of its folders meanwhile."""
    folder = os.path.dirname(path)
    os.makedirs(folder, exist_ok=True)
    while True:
        fresh = os.path.join(folder, f".lbctl-{os.urandom(8).hex()}")
        try:
            make(fresh)
            break
        except FileExistsError:
            continue
        except BaseException:
            ignoring_os_errors(os.unlink, fresh)  # a file half written
            raise
    try:
        os.replace(fresh, path)
    except BaseException:
        ignoring_os_errors(os.unlink, fresh)
        raise


def remove_help_files(root):
    removed = False
    for _argv, path, mark in HELP_FILES:
        target = below(root, path)
        try:
            ours = isinstance(own_text(target, mark), str)
            if ours:
                os.unlink(target)
        except OSError as exc:
            say(f"{path}: not removed ({exc.strerror or exc})")
            continue
        removed |= ours
    if removed:
        say("completion and man page: removed")
    return removed


def uninstall(args, root, venv, link):
    records = below(root, args.state) if args.state else None
    held = sorted(n[:-5] for n in os.listdir(records) if n.endswith(".json")) \
        if records and os.path.isdir(records) else []
    if held:
        raise Refused(f"lbctl still holds cluster {', '.join(held)} here: run `lbctl apply FILE "
                      "--remove --all` first")
    changed = False
    if os.path.islink(link) and is_ours(os.readlink(link)):
        os.unlink(link)
        say(f"link {args.link}: removed")
        changed = True
    if os.path.isdir(venv):
        shutil.rmtree(venv)
        say(f"venv {args.venv}: removed")
        changed = True
    changed |= remove_help_files(root)
    if records and os.path.isdir(records):
        ignoring_os_errors(os.rmdir, records)  # empty once every cluster is removed
    if root == "/":  # a lab node shares the host's users and root's home
        changed |= remove_cache()
        if args.user:
            changed |= remove_user(args.user)
    present = [p for p in args.packages
               if shutil.which("dpkg-query") is not None and package_installed(p)]
    if present:
        say(f"left installed: {' '.join(present)} (apt remove them if nothing else needs them)")
    if not changed:
        say("lbctl is not installed here")
    return changed


def remove_cache():
    """root's lbctl cache (lbctl/cache.py): validated files, rendered configs."""
    cache = os.path.join(pwd.getpwuid(0).pw_dir, ".cache", "lbctl")
    if not os.path.isdir(cache) or os.path.islink(cache):
        return False
    shutil.rmtree(cache)
    say(f"cache {cache}: removed")
    return True


def remove_user(name):
    try:
        found = pwd.getpwnam(name)
    except KeyError:
        return False
    if found.pw_uid == 0 or found.pw_uid > SYSTEM_UID_MAX:
        say(f"user {name}: a login account, left as it is")
        return False
    run(["userdel", name])
    say(f"user {name}: removed")
    return True


def contents(wheel):
    """The wheel's RECORD: every file it installs, with its digest."""
    import zipfile  # here: the driver imports this module for its names alone

    try:
        with zipfile.ZipFile(wheel) as archive:
            record = next(n for n in archive.namelist() if n.endswith(".dist-info/RECORD"))
            return archive.read(record)
    except (OSError, StopIteration, zipfile.BadZipFile):
        return None


def ignoring_os_errors(func, path):
    try:
        func(path)
    except (FileNotFoundError, OSError):
        pass


def run(argv, env=None):
    # From /: root's Python must import nothing from the login's folder.
    done = subprocess.run(argv, env=env, capture_output=True, text=True, cwd="/")
    if done.returncode != 0:
        raise Refused(f"{' '.join(argv[:4])} ... failed: {last_line(done)}",
                      output=done.stderr + done.stdout, error=last_line(done))
    return done


def last_line(done):
    """What a failed command said last (its error), or its exit status."""
    text = (done.stderr or done.stdout).strip().splitlines()
    return text[-1] if text else f"exit status {done.returncode}"


def say(line):
    print(line, flush=True)


if __name__ == "__main__":
    try:
        main(sys.argv[1:])
    except Refused as exc:
        print(f"lbctl install: {exc}", file=sys.stderr)
        sys.exit(1)
