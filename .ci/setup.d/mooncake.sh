#!/usr/bin/env bash
# CI setup for `kbtp bench --vs mooncake`: Mooncake Transfer Engine (not a dependency of the
# project) and the libibverbs its engine links, so the comparison's test runs for real.
# Idempotent.  A failed install does not stop CI: the test that needs Mooncake is skipped
# and the tests of the refusal (not installed, or installed and not loading) still run.
set -uo pipefail
export DEBIAN_FRONTEND=noninteractive
if ! dpkg -s libibverbs1 >/dev/null 2>&1; then
  echo "mooncake: apt-get install libibverbs1"
  { apt-get update -qq && apt-get install -y -qq --no-install-recommends libibverbs1 >/dev/null; } \
    || echo "mooncake: WARNING: apt-get install libibverbs1 failed"
fi
python3 -m pip install -q mooncake-transfer-engine-non-cuda \
  || echo "mooncake: WARNING: pip install failed; the Mooncake comparison test is skipped"
python3 -c "import mooncake.engine" && echo "mooncake: engine loads"
exit 0
