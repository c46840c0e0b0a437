#!/usr/bin/env bash
# Set up lbctl on a fresh Debian machine and run its demo or its tests.
#
#   ./dev.sh setup   apt packages and the .venv (idempotent)
#   ./dev.sh demo    setup, then `lbctl lab demo` on the bundled example
#   ./dev.sh test    setup, then unit tests and the netns suite
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
  keepalived passwd                     # health checks and failover pairs (passwd: useradd)
  systemd                               # systemd-analyze checks the units lbctl writes
  curl apache2-utils arping tcpdump     # lab clients and captures
  busybox-static                        # lab web servers, and the lab VM's initramfs
  qemu-system-x86 cpio                  # the lab VM where the kernel has no IPVS
)

if [ "$(id -u)" -ne 0 ]; then
  if command -v sudo >/dev/null; then
    exec sudo -- "$0" "$@"
  fi
  echo "dev.sh: run as root: it installs packages and creates network namespaces" >&2
  exit 1
fi

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
  for pkg in "${APT_PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
  done
  if [ ${#missing[@]} -gt 0 ]; then
    apt-get update -q
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}"
  elif [ -z "$(find /var/lib/apt/lists -maxdepth 1 -name '*Packages*' -print -quit)" ]; then
    apt-get update -q   # the lab VM looks its kernel package up with apt-cache
  fi
  if [ ! -x .venv/bin/python ]; then
    "$(python_for_venv)" -m venv .venv
  fi
  .venv/bin/python -m pip install -q --upgrade pip
  .venv/bin/python -m pip install -q -e '.[test]'
}

case "${1:-}" in
  setup)
    setup ;;
  demo)
    setup
    exec .venv/bin/lbctl lab demo "${@:2}" ;;
  test)
    setup
    .venv/bin/python -m pytest tests -q
    # The slowest tests are named at the end: the suite has a time budget.
    exec .venv/bin/python -m lbctl.lab.vm -- .venv/bin/python -m pytest netns-tests -q -p no:cacheprovider \
      --durations=15 ;;
  *)
    sed -n '2,11p' "$0" >&2
    exit 2 ;;
esac
