#!/usr/bin/env bash
# Install Debian's valgrind: callgrind counts instructions for tools/op_profile.py
# --instructions (tests/tools/test_op_profile.py), a figure no machine load moves.
set -euo pipefail
if command -v valgrind >/dev/null 2>&1; then
    valgrind --version
    exit 0
fi
SUDO=""
if [ "$(id -u)" -ne 0 ]; then
    SUDO="sudo"
fi
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends valgrind >/dev/null
valgrind --version
