#!/usr/bin/env bash
# Install Debian's tshark (the independent oracle of tests/dissect/test_tshark_crosscheck.py).
# Non-interactive: answer the setuid question up front (shared/specs/tshark.md).
set -euo pipefail
if command -v tshark >/dev/null 2>&1; then
    tshark --version 2>/dev/null | head -n 1
    exit 0
fi
SUDO=""
if [ "$(id -u)" -ne 0 ]; then
    SUDO="sudo"
fi
$SUDO apt-get update -qq
echo "wireshark-common wireshark-common/install-setuid boolean false" | $SUDO debconf-set-selections
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends tshark >/dev/null
tshark --version 2>/dev/null | head -n 1
