#!/usr/bin/env bash
# Install aieng as a systemd service (docs/operations.md walks through it).  Run as root from a checkout:
#     sudo deploy/install.sh
# It copies the checkout to $AIENG_PREFIX (default /opt/aieng; the unit file expects that path), sets it up
# there (venv, package, demo models: scripts/setup.sh), creates the system user `aieng`, installs the unit
# and an empty /etc/aieng/aieng.env for AIENG_* settings, and starts the service.  Safe to run again.
set -euo pipefail
prefix=${AIENG_PREFIX:-/opt/aieng}
src=$(cd "$(dirname "$0")/.." && pwd)
if [ "$(id -u)" -ne 0 ]; then
  echo "install.sh: run as root (it writes $prefix, /etc/aieng and /etc/systemd/system)" >&2
  exit 1
fi
mkdir -p "$prefix"
if [ "$src" != "$prefix" ]; then
  # A venv is not relocatable: setup.sh builds a fresh one in place.
  (cd "$src" && tar --exclude=./.venv --exclude=./.git --exclude=./.cache -cf - .) | (cd "$prefix" && tar -xf -)
fi
(cd "$prefix" && ./scripts/setup.sh)
id aieng >/dev/null 2>&1 || useradd --system --home-dir "$prefix" --shell /usr/sbin/nologin aieng
chown -R aieng:aieng "$prefix"
mkdir -p /etc/aieng
[ -f /etc/aieng/aieng.env ] || install -m 0640 -g aieng /dev/null /etc/aieng/aieng.env
install -m 0644 "$prefix/deploy/aieng.service" /etc/systemd/system/aieng.service
systemctl daemon-reload
systemctl enable --now aieng
echo "aieng is installed; 'systemctl status aieng' shows it, 'journalctl -u aieng -f' follows its log."
