#!/usr/bin/env bash
# Build the siw test guest from Debian packages: Debian 12's kernel, siw.ko compiled out of
# tree from the matching linux-source (Debian 12 ships no siw), a debootstrap minbase root
# with rdma-core/perftest/tcpdump, a busybox initramfs, and an ext4 image booted read-only.
#
#   build.sh [--refresh]      as root; idempotent. Cold 2-4 min here (74 s on an idle host),
#                             warm well under a second.
#
# Everything lands in $SIWVM_CACHE (default ${XDG_CACHE_HOME:-$HOME/.cache}/siw-vm), outside
# the repository:  current.env  debs/  rootfs/  $KVER/{vmlinuz,initrd.gz,rootfs.ext4,siw.ko}
# Environment: SIWVM_CACHE, SIWVM_KVER (pin a kernel ABI, e.g. 6.1.0-57-amd64),
# SIWVM_MIRROR (debootstrap mirror; default: the host's apt source for bookworm),
# SIWVM_REBUILD_ROOTFS=1 (re-run debootstrap).
# --refresh re-resolves the kernel version from apt even when a built image exists.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
CACHE=${SIWVM_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/siw-vm}
REFRESH=0; [[ ${1:-} == --refresh ]] && REFRESH=1
export DEBIAN_FRONTEND=noninteractive LC_ALL=C
T0=$EPOCHREALTIME
say() { awk -v t0="$T0" -v t1="$EPOCHREALTIME" -v m="$*" 'BEGIN { printf "[siwvm build %5.1fs] %s\n", t1 - t0, m }'; }
die() { echo "siwvm build: error: $*" >&2; exit 1; }
mkdir -p "$CACHE"
exec 9>"$CACHE/.build.lock"
flock -w 900 9 || die "another build holds $CACHE/.build.lock"

# The image depends on these files; a change rebuilds the image (not the kernel or root).
GUEST_FILES=("$HERE/guest-init.sh" "$HERE/guest-agent.py" "$HERE/initramfs-init.sh"
             "$HERE/siw-modparams.sh" "$HERE/build.sh")
STAMP=$(cat "${GUEST_FILES[@]}" | sha256sum | cut -c1-16)

# --- warm path: nothing to do ------------------------------------------------------------
if [[ $REFRESH == 0 && -z ${SIWVM_REBUILD_ROOTFS:-} && -e $CACHE/current.env ]]; then
  # shellcheck disable=SC1091
  source "$CACHE/current.env"
  if [[ ${STAMP_IMAGE:-} == "$STAMP" && ( -z ${SIWVM_KVER:-} || ${SIWVM_KVER} == "$KVER" ) ]] \
     && [[ -s $CACHE/$KVER/vmlinuz && -s $CACHE/$KVER/initrd.gz && -s $CACHE/$KVER/rootfs.ext4 ]]; then
    say "up to date: kernel $KVER, image $STAMP in $CACHE"
    exit 0
  fi
fi

# --- 0. host tools -------------------------------------------------------------------------
need=()
for p in qemu-system-x86 debootstrap busybox-static cpio e2fsprogs kmod gcc-12 make libc6-dev \
         libelf1 binutils xz-utils; do
  dpkg -s "$p" >/dev/null 2>&1 || need+=("$p")
done
apt_updated=0
apt_update() { [[ $apt_updated == 1 ]] || { say "apt-get update"; apt-get update -qq; apt_updated=1; }; }
if ((${#need[@]})); then
  [[ $(id -u) == 0 ]] || die "missing host packages ${need[*]} (run as root to install them)"
  apt_update
  say "apt-get install ${need[*]}"
  apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi
[[ $(id -u) == 0 ]] || die "the build needs root (debootstrap, chroot)"

# --- 1. root file system (kernel independent, cached) --------------------------------------
# debootstrap is the longest step (about a minute): it runs in the background while the
# kernel packages are fetched and siw.ko is built.
ROOT=$CACHE/rootfs
PKGS=rdma-core,ibverbs-providers,ibverbs-utils,rdmacm-utils,perftest,python3,python3-pyverbs
PKGS+=,tcpdump,iproute2,kmod,procps,iputils-ping,netcat-openbsd,strace,coreutils
build_rootfs() {
  local mirror
  mirror=${SIWVM_MIRROR:-$(apt-get indextargets --format '$(REPO_URI) $(RELEASE)' 2>/dev/null \
                          | awk '$2 == "bookworm" {print $1; exit}')}
  [[ -n $mirror ]] || die "no bookworm apt source found; set SIWVM_MIRROR"
  rm -rf "$ROOT"
  debootstrap --variant=minbase --include="$PKGS" bookworm "$ROOT" "$mirror" \
    >"$CACHE/debootstrap.log" 2>&1 || { tail -20 "$CACHE/debootstrap.log" >&2; die "debootstrap failed"; }
  rm -rf "$ROOT"/usr/share/{doc,man,info,locale}/* "$ROOT"/var/cache/apt/* "$ROOT"/var/lib/apt/lists/*
  echo siwvm >"$ROOT/etc/hostname"
  chroot "$ROOT" dpkg-query -W -f '${Package} ${Version}\n' >"$CACHE/rootfs-packages.txt"
  touch "$ROOT/.done"
}
ROOTFS_PID=
if [[ ! -e $ROOT/.done || -n ${SIWVM_REBUILD_ROOTFS:-} ]]; then
  say "debootstrap bookworm minbase in the background (log: $CACHE/debootstrap.log)"
  build_rootfs &
  ROOTFS_PID=$!
  # If the foreground fails, stop debootstrap and everything it started (by pid, not name).
  kill_tree() { local c; for c in $(ps -o pid= --ppid "$1" 2>/dev/null); do kill_tree "$c"; done
                kill "$1" 2>/dev/null || true; }
  trap '[[ -n ${ROOTFS_PID:-} ]] && kill_tree "$ROOTFS_PID"' EXIT
fi

# --- 2. kernel packages, all pinned to the version of linux-image-$KVER --------------------
resolve_kver() {
  apt-cache depends linux-image-amd64 2>/dev/null \
    | sed -n 's/.*Depends: linux-image-\([0-9].*-amd64\)$/\1/p' | head -1
}
KVER=${SIWVM_KVER:-$(resolve_kver)}
if [[ -z $KVER ]]; then apt_update; KVER=$(resolve_kver); fi
[[ -n $KVER ]] || die "cannot resolve the kernel version (apt-cache depends linux-image-amd64)"
KABI=${KVER%-amd64}                      # 6.1.0-57
KMAJ=$(cut -d. -f1-2 <<<"$KVER")         # 6.1
OUT=$CACHE/$KVER
mkdir -p "$CACHE/debs" "$OUT"
KPKGVER=$(apt-cache show "linux-image-$KVER" 2>/dev/null | sed -n 's/^Version: //p' | head -1)
if [[ -z $KPKGVER ]]; then apt_update; KPKGVER=$(apt-cache show "linux-image-$KVER" | sed -n 's/^Version: //p' | head -1); fi
[[ -n $KPKGVER ]] || die "no package linux-image-$KVER in apt"
say "kernel $KVER ($KPKGVER) -> $OUT"
KPKGS=("linux-image-$KVER" "linux-headers-$KVER" "linux-headers-$KABI-common" "linux-kbuild-$KMAJ")
debfile() { compgen -G "$CACHE/debs/${1}_${KPKGVER}_*.deb" | head -1 || true; }
for p in "${KPKGS[@]}" "linux-source-$KMAJ"; do
  if [[ -z $(debfile "$p") ]]; then
    say "apt-get download $p=$KPKGVER"
    (cd "$CACHE/debs" && apt-get download -qq "$p=$KPKGVER" 2>&1 | grep -v -i unsandboxed || true)
    [[ -n $(debfile "$p") ]] || die "download of $p=$KPKGVER failed"
  fi
done

KDIR=$OUT/kernel
if [[ ! -e $KDIR/.done ]]; then
  say "unpack kernel, headers, kbuild"
  rm -rf "$KDIR" && mkdir -p "$KDIR"
  for p in "${KPKGS[@]}"; do dpkg-deb -x "$(debfile "$p")" "$KDIR"; done
  # The arch headers' Makefile names the -common tree by absolute path: point it into the cache.
  sed -i "s#/usr/src/linux-headers-$KABI-common#$KDIR/usr/src/linux-headers-$KABI-common#" \
    "$KDIR/usr/src/linux-headers-$KVER/Makefile"
  depmod -b "$KDIR" "$KVER"
  touch "$KDIR/.done"
fi
cp "$KDIR/boot/vmlinuz-$KVER" "$OUT/vmlinuz"

# --- 3. siw.ko, out of tree, with its compile-time knobs made module parameters ------------
# Only the siw directory is taken from the
# 130 MB linux-source tarball: named members with --occurrence let tar stop early (6 s instead
# of 30 s); if the Makefile then names a source we lack, the whole directory is extracted.
SIW_FILES="Kconfig Makefile iwarp.h siw.h siw_cm.c siw_cm.h siw_cq.c siw_main.c siw_mem.c
           siw_mem.h siw_qp.c siw_qp_rx.c siw_qp_tx.c siw_verbs.c siw_verbs.h"
siw_sources_complete() {
  local o
  [[ -f $1/Makefile ]] || return 1
  for o in $(grep -o '[a-z0-9_]*\.o' "$1/Makefile" | grep -vx 'siw\.o'); do
    [[ -f $1/${o%.o}.c ]] || return 1
  done
}
build_siw() {
  local S=$OUT/siw-src inner="./usr/src/linux-source-$KMAJ.tar.xz" top="linux-source-$KMAJ/drivers/infiniband/sw/siw"
  local members=() f
  for f in $SIW_FILES; do members+=("$top/$f"); done
  rm -rf "$S" && mkdir -p "$S"
  (set +o pipefail
   dpkg-deb --fsys-tarfile "$(debfile "linux-source-$KMAJ")" 2>/dev/null | tar -xO "$inner" 2>/dev/null \
     | tar -xJ -C "$S" --strip-components=5 --occurrence "${members[@]}" 2>/dev/null) || true
  if ! siw_sources_complete "$S"; then
    echo "siw: named members incomplete, extracting the whole directory"
    rm -rf "$S" && mkdir -p "$S"
    dpkg-deb --fsys-tarfile "$(debfile "linux-source-$KMAJ")" | tar -xO "$inner" \
      | tar -xJ -C "$S" --strip-components=5 "$top"
  fi
  bash "$HERE/siw-modparams.sh" "$S"
  make -s -C "$KDIR/usr/src/linux-headers-$KVER" M="$S" CONFIG_RDMA_SIW=m modules 2>&1 \
    | grep -v 'Skipping BTF' || true
  [[ -s $S/siw.ko ]] || { echo "siw.ko did not build"; return 1; }
  strip --strip-debug -o "$OUT/siw.ko" "$S/siw.ko"
}
if [[ ! -s $OUT/siw.ko || $HERE/siw-modparams.sh -nt $OUT/siw.ko ]]; then
  say "build siw.ko from linux-source-$KMAJ (log: $OUT/siw-build.log)"
  rm -f "$OUT/siw.ko"
  build_siw >"$OUT/siw-build.log" 2>&1 || { tail -20 "$OUT/siw-build.log" >&2; die "siw.ko build failed"; }
fi
if [[ -n $ROOTFS_PID ]]; then
  say "waiting for debootstrap"
  wait "$ROOTFS_PID" || die "building the root file system failed"
  ROOTFS_PID=
  say "root file system ready"
fi

# --- 4. modules: the closure of what the guest loads, plus siw.ko ---------------------------
MODS_BOOT="virtio_pci virtio_blk ext4 crc32c_generic"
MODS_ALL="$MODS_BOOT virtio_net 9p 9pnet_virtio virtio_rng veth ib_core ib_uverbs iw_cm ib_cm"
MODS_ALL+=" rdma_cm rdma_ucm libcrc32c crc32c-intel rdma_rxe"
install_modules() {  # install_modules ROOTDIR MODULE... : modules with their deps, then depmod
  local top=$1 src=$KDIR/lib/modules/$KVER dst=$1/lib/modules/$KVER m f; shift
  rm -rf "$dst"; mkdir -p "$dst/extra"
  for m in "$@"; do
    grep -E "(^|/)${m//[-_]/[-_]}\.ko:" "$src/modules.dep" || die "no module $m in $KVER"
  done | tr -d ':' | tr ' ' '\n' | sort -u | while read -r f; do
    [[ -z $f ]] || install -D -m644 "$src/$f" "$dst/$f"
  done
  cp "$src"/modules.{order,builtin,builtin.modinfo} "$dst/"
  cp "$OUT/siw.ko" "$dst/extra/siw.ko"
  depmod -b "$top" "$KVER"
}
say "install modules, init and agent into the root"
install_modules "$ROOT" $MODS_ALL
install -m755 "$HERE/guest-init.sh" "$ROOT/sbin/siwvm-init"
install -m755 "$HERE/guest-agent.py" "$ROOT/sbin/siwvm-agent"

# --- 5. ext4 image; QEMU opens it with snapshot=on, so a boot never changes it -------------
say "mke2fs rootfs.ext4"
rm -f "$OUT/rootfs.ext4.new"
mke2fs -q -t ext4 -L siwroot -d "$ROOT" "$OUT/rootfs.ext4.new" 1G
mv "$OUT/rootfs.ext4.new" "$OUT/rootfs.ext4"

# --- 6. initramfs: busybox and the boot modules; mounts /dev/vda and switch_roots ----------
say "initrd.gz"
I=$OUT/initramfs; rm -rf "$I"; mkdir -p "$I"/{bin,dev,proc,sys,newroot}
cp /bin/busybox "$I/bin/busybox"
for a in sh mount umount modprobe switch_root sleep cat echo mkdir poweroff; do
  ln -s busybox "$I/bin/$a"
done
ln -s bin "$I/sbin"
install_modules "$I" $MODS_BOOT
install -m755 "$HERE/initramfs-init.sh" "$I/init"
(cd "$I" && find . | cpio -o -H newc --quiet | gzip -1 >"$OUT/initrd.gz.new")
mv "$OUT/initrd.gz.new" "$OUT/initrd.gz"

cat >"$CACHE/current.env.new" <<ENV
KVER=$KVER
KPKGVER=$KPKGVER
STAMP_IMAGE=$STAMP
ENV
mv "$CACHE/current.env.new" "$CACHE/current.env"
say "done: $(du -sh "$OUT/rootfs.ext4" | cut -f1) image, siw.ko $(du -h "$OUT/siw.ko" | cut -f1)"
