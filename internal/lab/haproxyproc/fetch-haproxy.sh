#!/usr/bin/env bash
# fetch-haproxy.sh SUITE DEST: HAProxy from Debian's SUITE (trixie: 3.0 LTS,
# sid: 3.2 LTS at the time of writing) with the libraries it needs from the
# same suite, unpacked under DEST/root, and DEST/haproxy, a wrapper that
# runs it through that suite's own loader. Nothing is installed: the
# machine's apt state and libraries are untouched (debian-archive.sh), so
# Debian 12's HAProxy 2.6 stays the system's.
set -euo pipefail
suite=$1
dest=$2
if [ -x "$dest/haproxy" ] && "$dest/haproxy" -v >/dev/null 2>&1; then
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
cat >"$dest/haproxy" <<WRAPPER
#!/bin/sh
# HAProxy from Debian $suite, run with its own loader and libraries.
root=\$(dirname "\$(readlink -f "\$0")")/root
exec "\$root/$loader" --library-path "\$root/usr/lib/$arch:\$root/lib/$arch" "\$root/usr/sbin/haproxy" "\$@"
WRAPPER
chmod 755 "$dest/haproxy"
"$dest/haproxy" -v | sed -n 1p
