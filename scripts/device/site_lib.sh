# Sourced, never run: unpack the sglang tree (SGLang + NIXL + deps) on the lent machine, for bench_lib.sh and
# calibrate.sh. The slim archive (47 MB) and the tracked tree (21.7 MB in late 2026-11) no longer fit one call's
# 64 MiB together, so the archive may travel in parts, one per call of the same warm lease:
#   split -n 2 -d .device/site-slim/site.tar.xz .device/site-split/site.tar.xz.part   (-> part00, part01)
#   echo 2 > .device/site-split/PARTS   (not carried: the count is in each call's SITE_PARTS, default 2)
# Each call carries one part (carry=[".device/site-split/site.tar.xz.part00"], then ...part01); this stages it under
# $SITE_STAGE and unpacks once all SITE_PARTS parts are there. SITE_SPLIT_DIR names the folder the parts travel in
# (default .device/site-split; lease 14's four 11.8 MB parts: .device/lease14). A whole archive (SITE_ARCHIVE, default
# .device/site-slim/site.tar.xz) is still taken when carried. Once the tree is there, host_probe_once writes
# $OUT/host-probe.json (scripts/device/host_probe.py, ~10 s; HOST_PROBE=0 skips it) before any engine starts.
host_probe_once() {  # the host probe (host_probe.py) once per call, before the engines; only where a GPU is
  [ "${HOST_PROBE:-1}" = 0 ] && return 0
  command -v nvidia-smi >/dev/null 2>&1 || return 0
  local out=${OUT:-/tmp}/host-probe.json
  [ -f "$out" ] && return 0
  python3 "$(dirname "${BASH_SOURCE[0]}")/host_probe.py" --out "$out" ${HOST_PROBE_ARGS:-} 2>&1 | sed 's/^/[host-probe] /' || true
}
unpack_site() {  # $1 = target dir; returns 0 when the tree is there, 3 when parts are still missing, 1 on failure
  _unpack_site "$@"; local rc=$?
  [ $rc = 0 ] && host_probe_once
  return $rc
}
_unpack_site() {
  local site=$1 whole=${SITE_ARCHIVE:-.device/site-slim/site.tar.xz} stage=${SITE_STAGE:-/root/site-parts}
  local parts=${SITE_PARTS:-2} split=${SITE_SPLIT_DIR:-.device/site-split} p have
  [ -f $site/.installed_site ] && return 0
  if [ -f "$whole" ]; then
    rm -rf $site; mkdir -p $site; tar -C $site -xJf "$whole" && touch $site/.installed_site && return 0
    return 1
  fi
  local carried=0; mkdir -p $stage
  for p in $split/site.tar.xz.part*; do [ -f "$p" ] && cp "$p" $stage/ && carried=$((carried + 1)); done
  have=$(ls $stage/site.tar.xz.part* 2>/dev/null | wc -l)
  if [ "$have" -lt "$parts" ]; then
    echo "sglang tree: $have of $parts parts staged in $stage; carry the next part ($split/) in a call of this warm lease"
    [ $carried -gt 0 ] && return 3 || return 1
  fi
  rm -rf $site; mkdir -p $site
  cat $(ls $stage/site.tar.xz.part* | sort) | tar -C $site -xJ && touch $site/.installed_site && rm -rf $stage
}
