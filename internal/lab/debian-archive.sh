# debian-archive.sh, sourced by the lab's fetch scripts: packages from a
# Debian suite other than the machine's, with a private apt list and
# cache, so that nothing is installed and the machine's apt state and
# libraries are untouched.

# debian_download SUITE DIR MODE PKG...: each PKG from SUITE, as a .deb in
# DIR. MODE is "required" (a package SUITE lacks stops the script) or
# "optional" (it is skipped, and said so). The caller owns DIR.
debian_download() {
	local suite=$1 dir=$2 mode=$3
	shift 3
	mkdir -p "$dir/apt/lists/partial" "$dir/apt/cache/archives/partial"
	echo "deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://deb.debian.org/debian $suite main" >"$dir/apt/sources.list"
	local apt=(-o "Dir::Etc::SourceList=$dir/apt/sources.list" -o Dir::Etc::SourceParts=/nonexistent
		-o "Dir::State::Lists=$dir/apt/lists" -o "Dir::Cache=$dir/apt/cache" -o Debug::NoLocking=1 -o APT::Sandbox::User=root)
	# One list per DIR: a second call for the same suite reads it again.
	ls "$dir"/apt/lists/*_Packages* >/dev/null 2>&1 || apt-get "${apt[@]}" -qq update
	local p
	for p in "$@"; do
		if ! (cd "$dir" && apt-get "${apt[@]}" -qq download "$p/$suite" 2>/dev/null); then
			if [ "$mode" = required ]; then
				echo "$(basename "$0"): could not fetch $p from $suite" >&2
				return 1
			fi
			echo "$(basename "$0"): $p is not in $suite, skipped" >&2
		fi
	done
}
