#!/usr/bin/env bash
# fetch-llama.sh DEST: llama.cpp's llama-server (llama.cpp-tools) and
# llama-finetune (llama.cpp-examples) from Debian sid, with the libraries
# they need from sid, unpacked under DEST/root, and two wrappers,
# DEST/llama-server and DEST/llama-finetune, that run them through sid's own
# loader. Nothing is installed (internal/lab/debian-archive.sh).
#
# ggml looks for its CPU backend beside the executable, which is the loader
# here, so the wrappers set GGML_BACKEND_PATH to one of sid's CPU backends
# (usr/lib/ARCH/ggml/backends0/), chosen by this CPU's flags when they run.
# A second run finds DEST working and fetches nothing.
set -euo pipefail
dest=$1
if [ -x "$dest/llama-server" ] && "$dest/llama-server" --version >/dev/null 2>&1; then
	"$dest/llama-server" --version 2>&1 | grep -m1 '^version' || true
	exit 0
fi
. "$(dirname "$0")/../debian-archive.sh"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# The Depends lines of llama.cpp-tools, llama.cpp-examples, libllama0 and
# libggml0 (dpkg-deb -I), and of the libraries among them (libssl3t64
# needs libzstd1 and zlib1g); debconf and wget|curl serve only the
# package's model-download helper.
pkgs="llama.cpp-tools llama.cpp-examples libllama0 libggml0 libc6 libgcc-s1 libgomp1 libstdc++6 libssl3t64 libzstd1 zlib1g"
# shellcheck disable=SC2086 # one word a package
debian_download sid "$work" required $pkgs
rm -rf "$dest"
mkdir -p "$dest/root"
for deb in "$work"/*.deb; do dpkg-deb -x "$deb" "$dest/root"; done
arch=$(dpkg-architecture -qDEB_HOST_MULTIARCH 2>/dev/null || echo x86_64-linux-gnu)
loader=$(cd "$dest/root" && ls usr/lib/"$arch"/ld-linux*.so.* lib64/ld-linux*.so.* 2>/dev/null | head -1 || true)
[ -n "$loader" ] || { echo "fetch-llama: no loader in sid's libc6" >&2; exit 1; }
backends=usr/lib/$arch/ggml/backends0
ls "$dest/root/$backends"/libggml-cpu-*.so >/dev/null 2>&1 ||
	{ echo "fetch-llama: no CPU backend under $backends in sid's libggml0" >&2; exit 1; }
libpath="\$root/usr/lib/$arch:\$root/lib/$arch"
[ -d "$dest/root/usr/lib/$arch/llama" ] && libpath="$libpath:\$root/usr/lib/$arch/llama"
[ -d "$dest/root/usr/lib/$arch/ggml" ] && libpath="$libpath:\$root/usr/lib/$arch/ggml"
for tool in llama-server llama-finetune; do
	exe=$(cd "$dest/root" && ls usr/bin/"$tool" usr/libexec/llama.cpp/"$tool" usr/lib/llama.cpp/"$tool" 2>/dev/null | head -1 || true)
	[ -n "$exe" ] || { echo "fetch-llama: sid's packages hold no $tool" >&2; exit 1; }
	cat >"$dest/$tool" <<WRAPPER
#!/bin/sh
# $tool from Debian sid (llama.cpp), run with sid's own loader and libraries.
root=\$(dirname "\$(readlink -f "\$0")")/root
if [ -z "\${GGML_BACKEND_PATH:-}" ]; then
	# The best CPU backend this CPU runs: ggml would pick it itself from
	# beside the executable, but the executable is the loader here.
	flags=" \$(grep -m1 '^flags' /proc/cpuinfo 2>/dev/null | cut -d: -f2) "
	has() { for f in "\$@"; do case "\$flags" in *" \$f "*) ;; *) return 1 ;; esac; done; }
	b=x64
	if has avx512f avx512bw avx512vl avx512_vnni avx512_vbmi; then b=icelake
	elif has avx512f avx512bw avx512vl; then b=skylakex
	elif has avx_vnni avx2 fma f16c bmi2; then b=alderlake
	elif has avx2 fma f16c bmi2; then b=haswell
	elif has avx; then b=sandybridge
	elif has sse4_2; then b=sse42
	fi
	[ -f "\$root/$backends/libggml-cpu-\$b.so" ] || b=x64
	[ -f "\$root/$backends/libggml-cpu-\$b.so" ] || b=\$(cd "\$root/$backends" && ls libggml-cpu-*.so | head -1 | sed 's/^libggml-cpu-//; s/\.so\$//')
	GGML_BACKEND_PATH=\$root/$backends/libggml-cpu-\$b.so
	export GGML_BACKEND_PATH
fi
exec "\$root/$loader" --library-path "$libpath" "\$root/$exe" "\$@"
WRAPPER
	chmod 755 "$dest/$tool"
done
"$dest/llama-server" --version 2>&1 | grep -m1 '^version' ||
	{ echo "fetch-llama: llama-server does not run:" >&2; "$dest/llama-server" --version >&2; exit 1; }
