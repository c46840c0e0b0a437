#!/usr/bin/env bash
# Set up lbctl on a fresh Debian machine and run its demo or its tests.
#
#   ./dev.sh setup   apt packages and the .venv (idempotent)
#   ./dev.sh demo    setup, then `lbctl lab demo` on the bundled example
#   ./dev.sh test    setup (the proxies too), then unit tests and the netns suite
#   ./dev.sh golden  rewrite tests/golden/*.plan after a deliberate change (read the diff)
#   ./dev.sh wheel   dist/lbctl-VERSION-py3-none-any.whl to install on nodes (no root needed)
#   ./dev.sh bench [SCRIPT...]   setup and the proxies, then the benchmarks (or those
#                    named, e.g. failover.py); they rewrite docs/benchmarks.md
#
# It needs root (apt, network namespaces) and re-runs itself with sudo when
# started as another user.
# The netns suite needs a kernel with IPVS.  Where this one lacks it, the
# suite runs inside a small VM with Debian's own kernel (see docs/lab.md).
set -euo pipefail
cd "$(dirname "$0")"

APT_PACKAGES=(
  python3 python3-venv python3-pip      # lbctl itself
  iproute2 kmod procps ipvsadm          # the kernel side lbctl drives, and checks on it
  keepalived passwd nftables            # health checks and failover pairs (passwd: useradd; nftables: the takeover grace)
  bird2                                 # mode ecmp: the tests check its BIRD config with BIRD's own parser
  systemd systemd-container             # systemd-analyze checks lbctl's units; the lab boots nodes with systemd-nspawn
  curl apache2-utils arping tcpdump     # lab clients and captures
  tmux                                  # the lab reads status --watch off a real terminal
  groff-base zsh                        # the tests render lbctl's man page and run its zsh completion
  busybox-static                        # lab web servers, and the lab VM's initramfs
  qemu-system-x86 cpio                  # the lab VM where the kernel has no IPVS
  openssh-client openssh-server         # --all over ssh, and an sshd in each lab node
  sudo                                  # the tests ask sudo whether docs/security.md's narrow rule works
)
# The proxies bench/dataplane.py measures direct routing against, and GNU time
# for the peak memory of one command.
BENCH_PACKAGES=(haproxy pen nginx time)
# The venv's extras: pytest for every command; matplotlib (the benchmarks'
# plots) only where the benchmarks run.
PIP_EXTRAS=test

if [ "${1:-}" = golden ]; then
  # No root: it only renders.  Run from tests/, as pytest does, for its imports.
  cd tests && exec ../.venv/bin/python test_golden.py
fi

if [ "${1:-}" = wheel ]; then
  # The wheel to install on nodes: no root, no lab packages, only python3-venv.
  build=$(mktemp -d)
  trap 'rm -rf "$build"' EXIT
  python3 -m venv "$build/venv"
  "$build/venv/bin/python" -m pip install -q --upgrade pip
  # setuptools builds in the tree and packs whatever an earlier build left in
  # build/: start clean, so the wheel holds exactly what pyproject.toml names.
  rm -rf build lbctl.egg-info
  "$build/venv/bin/python" -m pip wheel -q --no-deps -w dist .
  ls dist/lbctl-*.whl
  exit 0
fi

if [ "$(id -u)" -ne 0 ]; then
  if command -v sudo >/dev/null; then
    exec sudo -- "$0" "$@"
  fi
  echo "dev.sh: run as root: it installs packages and creates network namespaces" >&2
  exit 1
fi

# Root on purpose from here: the lab and the tests run as root.  lbctl refuses
# under sudo what would hand root a file or command of the invoking user's
# choosing (lab, --all, --root: docs/security.md), which is all dev.sh does.
unset SUDO_USER SUDO_UID SUDO_GID SUDO_COMMAND

python_for_venv() {
  # Python 3.11+ (Raspberry Pi OS bookworm); prefer the system one.
  for py in /usr/bin/python3 python3; do
    if command -v "$py" >/dev/null && "$py" -c 'import sys; sys.exit(sys.version_info < (3, 11))'; then
      echo "$py"; return
    fi
  done
  echo "dev.sh: Python 3.11 or newer is required" >&2
  exit 1
}

setup() {
  missing=()
  for pkg in "${APT_PACKAGES[@]}" "$@"; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
  done
  if [ ${#missing[@]} -gt 0 ]; then
    if [ -d /run/systemd/system ]; then
      # The lab starts its own sshd and proxies in each node's namespace;
      # installing the packages must not also open ports on this machine.
      for unit in openssh-server:ssh.service openssh-server:ssh.socket \
                  nginx:nginx.service haproxy:haproxy.service; do
        case " ${missing[*]} " in
          *" ${unit%%:*} "*) systemctl mask --quiet "${unit#*:}" ;;
        esac
      done
    fi
    apt-get update -q
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}"
  elif [ -z "$(find /var/lib/apt/lists -maxdepth 1 -name '*Packages*' -print -quit)" ]; then
    apt-get update -q   # the lab VM looks its kernel package up with apt-cache
  fi
  if [ ! -x .venv/bin/python ]; then
    "$(python_for_venv)" -m venv .venv
  fi
  # setuptools 77 or newer builds lbctl offline, as the lab's upgrade test does.
  .venv/bin/python -m pip install -q --upgrade pip 'setuptools>=77'
  .venv/bin/python -m pip install -q -e ".[$PIP_EXTRAS]"
  # An editable install leaves lbctl without bytecode, and where
  # PYTHONDONTWRITEBYTECODE is set nothing writes it: every lbctl command
  # (hundreds in the lab, each a new process) would compile lbctl again.
  .venv/bin/python -m compileall -q lbctl
  # lbctl's dependencies as wheels, for `install --all --wheels` where the
  # nodes have no Internet access: the lab VM's (its test installs on nodes).
  .venv/bin/python -c 'import tomllib; print("\n".join(tomllib.load(open("pyproject.toml", "rb"))["project"]["dependencies"]))' \
    > .venv/node-requirements.txt
  .venv/bin/python -m pip download -q --only-binary=:all: -d .venv/node-wheels \
    -r .venv/node-requirements.txt
}

case "${1:-}" in
  setup)
    setup ;;
  demo)
    setup
    exec .venv/bin/lbctl lab demo "${@:2}" ;;
  test)
    PIP_EXTRAS=test,bench
    setup "${BENCH_PACKAGES[@]}"   # the netns suite runs the benchmarks at their smallest
    # The unit tests wait on subprocesses and timers more than they compute:
    # two workers take half the time (a module each: the install test builds
    # its venv once).
    .venv/bin/python -m pytest tests -q -n 2 --dist loadfile
    # The slowest tests, then the failed ones, are named at the end: the suite
    # has a time budget, and a CI log shows only its tail.
    # A test still running after 15 minutes (the slowest takes about 4) has
    # every thread's stack printed, so a hang shows where it is.
    # Three workers, a module each at a time (tests in a module build on each
    # other), taken in conftest's slowest-first order: a lab waits on timers
    # (adverts, checks, timeouts) much of the time, and the others fill it.
    # With two, the VM's two CPUs were idle 14% of the run; with three, 4%.
    exec .venv/bin/python -m lbctl.lab.vm -- .venv/bin/python -m pytest netns-tests -q -p no:cacheprovider \
      -n 3 --dist loadfile --no-loadscope-reorder \
      --durations=15 -rfE -o faulthandler_timeout=900 ;;
  bench)
    PIP_EXTRAS=test,bench
    setup "${BENCH_PACKAGES[@]}"
    exec .venv/bin/python bench/run.py "${@:2}" ;;
  *)
    sed -n '2,15p' "$0" >&2
    exit 2 ;;
esac
