#!/usr/bin/env bash
# fetch-haproxy.sh SUITE DEST: HAProxy from Debian's SUITE (trixie: 3.0 LTS,
# sid: 3.2 LTS at the time of writing) with the libraries it needs from the
# same suite, unpacked under DEST/root, and DEST/haproxy, a wrapper that
# runs it. The binary is patched (patchelf) to name that suite's own loader
# as its interpreter and its libraries as its RPATH, so that it runs as
# itself: in master-worker mode (-Ws, as Debian's unit runs it) the master
# re-executes its own binary on a reload, which through a loader on the
# command line would find the system's older libc. Nothing is installed:
# the machine's apt state and libraries are untouched (debian-archive.sh),
# so Debian 12's HAProxy 2.6 stays the system's.
set -euo pipefail
suite=$1
dest=$2
command -v patchelf >/dev/null || { echo "fetch-haproxy: patchelf is missing (apt-get install patchelf)" >&2; exit 1; }
if [ -x "$dest/haproxy" ] && ! grep -q ld-linux "$dest/haproxy" && "$dest/haproxy" -v >/dev/null 2>&1; then
	"$dest/haproxy" -v | sed -n 1p
	exit 0
fi
. "$(dirname "$0")/../debian-archive.sh"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
debian_download "$suite" "$work" required haproxy
debian_download "$suite" "$work" optional libc6 libssl3t64 liblua5.4-0 libpcre2-8-0 libjemalloc2 libcrypt1 \
	libopentracing-c-wrapper0t64 libopentracing1 libstdc++6 libgcc-s1 zlib1g libzstd1
rm -rf "$dest"
mkdir -p "$dest/root"
for deb in "$work"/*.deb; do dpkg-deb -x "$deb" "$dest/root"; done
arch=$(dpkg-architecture -qDEB_HOST_MULTIARCH 2>/dev/null || echo x86_64-linux-gnu)
loader=$(cd "$dest/root" && ls usr/lib/"$arch"/ld-linux*.so.* lib64/ld-linux*.so.* 2>/dev/null | head -1 || true)
if [ -z "$loader" ]; then echo "fetch-haproxy: no loader in $suite's libc6" >&2; exit 1; fi
root=$(cd "$dest/root" && pwd)
# --force-rpath: a DT_RPATH, which (unlike RUNPATH) also serves the
# libraries' own needs (liblua's libm).
patchelf --set-interpreter "$root/$loader" --force-rpath --set-rpath "$root/usr/lib/$arch:$root/lib/$arch" "$root/usr/sbin/haproxy"
cat >"$dest/haproxy" <<WRAPPER
#!/bin/sh
# HAProxy from Debian $suite, patched to run with its own loader and
# libraries under $root.
exec "$root/usr/sbin/haproxy" "\$@"
WRAPPER
chmod 755 "$dest/haproxy"
"$dest/haproxy" -v | sed -n 1p
