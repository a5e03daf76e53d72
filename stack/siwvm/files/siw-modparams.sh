#!/usr/bin/env bash
# Make siw's compile-time knobs writable module parameters (upstream defaults unchanged).
#   siw-modparams.sh SIW_SOURCE_DIR
# Upstream siw (drivers/infiniband/sw/siw) declares them "const bool" in siw_main.c/siw.h and
# has no module parameters.  After this patch each knob is settable by modprobe, the kernel
# command line (siw.NAME=VALUE) or /sys/module/siw/parameters/NAME; siw reads them per
# connection, so a test can change them between cases.
set -euo pipefail
src=$1
[[ -f $src/siw_main.c && -f $src/siw.h ]] || { echo "siw-modparams: no siw source in $src" >&2; exit 1; }
bool_knobs=(zcopy_tx try_gso loopback_enabled mpa_crc_required mpa_crc_strict siw_tcp_nagle peer_to_peer)
for knob in "${bool_knobs[@]}"; do
  sed -i -e "s/^extern const bool ${knob};/extern bool ${knob};/" "$src/siw.h"
  sed -i -e "s/^const bool ${knob}\\b/bool ${knob}/" "$src/siw_main.c"
done
if ! grep -q 'siwvm: module parameters' "$src/siw_main.c"; then
  cat >>"$src/siw_main.c" <<'C'

/* siwvm: module parameters for the test harness (upstream defaults unchanged) */
module_param(zcopy_tx, bool, 0644);
MODULE_PARM_DESC(zcopy_tx, "sendpage TX of unsignalled payloads >= 4 KiB");
module_param(try_gso, bool, 0644);
MODULE_PARM_DESC(try_gso, "offer the private GSO flag (0x08) in MPA Request/Reply");
module_param(loopback_enabled, bool, 0644);
MODULE_PARM_DESC(loopback_enabled, "allow siw links on loopback devices");
module_param(mpa_crc_required, bool, 0644);
MODULE_PARM_DESC(mpa_crc_required, "send C=1 and, as initiator, refuse a Reply without C");
module_param(mpa_crc_strict, bool, 0644);
MODULE_PARM_DESC(mpa_crc_strict, "refuse a peer whose CRC choice differs from ours");
module_param_named(tcp_nagle, siw_tcp_nagle, bool, 0644);
MODULE_PARM_DESC(tcp_nagle, "keep Nagle on (no TCP_NODELAY)");
module_param(mpa_version, byte, 0644);
MODULE_PARM_DESC(mpa_version, "MPA revision of the MPA Request: 1 or 2");
module_param(peer_to_peer, bool, 0644);
MODULE_PARM_DESC(peer_to_peer, "initiator asks for RFC 6581 peer-to-peer mode and an RTR");
C
fi
# Every knob must have lost its const, or the module would not link.
n=$(grep -cE "^bool ($(IFS='|'; echo "${bool_knobs[*]}"))\\b" "$src/siw_main.c" || true)
[[ $n == "${#bool_knobs[@]}" ]] || { echo "siw-modparams: unexpected siw source layout ($n knobs)" >&2; exit 1; }
