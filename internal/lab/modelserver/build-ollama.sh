#!/usr/bin/env bash
# build-ollama.sh DEST: the real Ollama server, built from the exact module
# version that go.mod pins (github.com/ollama/ollama), with its CPU backend
# through cgo, into DEST (for example bin/ollama). A second run finds DEST at
# the right version and builds nothing. The binary is also kept in this
# machine's cache (HAPILOT_CACHE, default ~/.cache/hapilot), so that a fresh
# clone on the same machine (CI's) copies it instead of building; the
# headers live there too, at one path, so that the Go build cache's cgo
# objects serve every clone.
#
# The module zip leaves out llama.cpp's vendor/ folder, so three headers come
# from Debian: nlohmann-json3-dev and libstb-dev from this machine's suite
# (installed with apt-get when missing), and miniaudio.h from sid's
# libminiaudio-dev, which Debian 12 lacks: it is fetched from sid
# (internal/lab/debian-archive.sh) and unpacked beside DEST, nothing
# installed. A header that cannot be had stops the build with the
# package's name: it never skips.
set -euo pipefail
dest=$1
top=$(cd "$(dirname "$0")/../../.." && pwd)
version=$(cd "$top" && go list -m -f '{{.Version}}' github.com/ollama/ollama)
# `ollama -v` asks a server for its version too; pointed at a closed port,
# it warns that it cannot connect and prints "client version is X" alone,
# whatever Ollama runs on this machine.
built() { OLLAMA_HOST=127.0.0.1:1 "$dest" -v 2>&1 | sed -n 's/.*client version is //p'; }
if [ -x "$dest" ] && [ "$(built)" = "${version#v}" ]; then
	echo "ollama ${version#v} already built at $dest"
	exit 0
fi
cache=${HAPILOT_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/hapilot}
cached="$cache/ollama-${version#v}"
mkdir -p "$(dirname "$dest")" "$cache"
if [ -x "$cached" ] && cp "$cached" "$dest" && [ "$(built)" = "${version#v}" ]; then
	echo "ollama ${version#v} copied from this machine's cache ($cached) to $dest"
	exit 0
fi
SUDO=""; [ "$(id -u)" = 0 ] || SUDO=sudo
need=""
[ -f /usr/include/nlohmann/json_fwd.hpp ] || need="$need nlohmann-json3-dev"
[ -f /usr/include/stb/stb_image.h ] || need="$need libstb-dev"
if [ -n "$need" ]; then
	echo "build-ollama: installing$need (apt-get)"
	$SUDO apt-get update -qq
	DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq $need >/dev/null ||
		{ echo "build-ollama: could not install$need; install it and run again" >&2; exit 1; }
fi
for h in nlohmann/json_fwd.hpp stb/stb_image.h; do
	[ -f "/usr/include/$h" ] || { echo "build-ollama: /usr/include/$h missing (package$need)" >&2; exit 1; }
done
inc="$cache/ollama-include"
if [ ! -f "$inc/miniaudio/miniaudio.h" ]; then
	. "$(dirname "$0")/../debian-archive.sh"
	work=$(mktemp -d)
	trap 'rm -rf "$work"' EXIT
	debian_download sid "$work" required libminiaudio-dev ||
		{ echo "build-ollama: sid's libminiaudio-dev (miniaudio.h) is needed" >&2; exit 1; }
	dpkg-deb -x "$work"/libminiaudio-dev_*.deb "$work/root"
	h=$(find "$work/root" -name miniaudio.h | head -1)
	[ -n "$h" ] || { echo "build-ollama: libminiaudio-dev has no miniaudio.h" >&2; exit 1; }
	mkdir -p "$inc/miniaudio"
	cp "$h" "$inc/miniaudio/miniaudio.h"
fi
echo "build-ollama: building github.com/ollama/ollama@$version (the first build takes about 6 minutes on 2 cores)"
gobin=$(mktemp -d)
CGO_ENABLED=1 CGO_CPPFLAGS="-I$inc" GOBIN="$gobin" GOFLAGS=-mod=mod \
	go install -ldflags "-X github.com/ollama/ollama/version.Version=${version#v}" "github.com/ollama/ollama@$version"
mv "$gobin/ollama" "$dest"
rmdir "$gobin"
cp "$dest" "$cached.tmp" && mv "$cached.tmp" "$cached"
echo "ollama $(built) built at $dest (and kept at $cached)"
