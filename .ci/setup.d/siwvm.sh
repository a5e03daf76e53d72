#!/usr/bin/env bash
# CI setup for the Linux siw interop tests: install QEMU, debootstrap and the kernel build
# tools with apt, then build the siw guest image into $SIWVM_CACHE (outside the repository).
# Idempotent: a warm cache returns in well under a second.  Skipped with IWARP_SKIP_INTEROP=1.
# A failed build does not stop CI here: tests/interop then fails with the build's message.
set -uo pipefail
cd "$(dirname "$0")/../.."
if [[ ${IWARP_SKIP_INTEROP:-} == 1 ]]; then
  echo "siwvm: IWARP_SKIP_INTEROP=1, not building the siw VM"
  exit 0
fi
export DEBIAN_FRONTEND=noninteractive
need=()
for p in qemu-system-x86 debootstrap busybox-static cpio e2fsprogs kmod gcc-12 make \
         libc6-dev libelf1 binutils xz-utils; do
  dpkg -s "$p" >/dev/null 2>&1 || need+=("$p")
done
if ((${#need[@]})); then
  echo "siwvm: apt-get install ${need[*]}"
  t0=$SECONDS
  { apt-get update -qq && apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null; } \
    || echo "siwvm: WARNING: apt-get install failed; the interop tests will report it"
  echo "siwvm: apt done in $((SECONDS - t0)) s"
fi
t0=$SECONDS
if bash stack/siwvm/files/build.sh; then
  echo "siwvm: guest image ready in $((SECONDS - t0)) s"
else
  echo "siwvm: WARNING: guest build failed after $((SECONDS - t0)) s; tests/interop will fail" >&2
fi
exit 0
