#!/bin/bash
# Repack the carried SGLang site archive smaller, so that it fits beside the working tree in the device tool's
# 64 MiB (2026-11-24: the tracked tree had grown to ~8 MB on disk and the 59.4 MB archive no longer fitted).
#   bash scripts/device/slim_site_archive.sh .device/site/site.tar.xz .device/site-slim/site.tar.xz
# Drops what `python -m sglang.launch_server` never imports (checked in SGLang 0.5.17's source):
#   sglang/multimodal_gen (diffusion serving, imported by the `sglang` CLI only), sglang/test (imported only
#   with SGLANG_TEST_SCRIPTED_RUNTIME=1 or under TYPE_CHECKING), sglang/benchmark, nixl_cu13.scripts (examples),
#   sgl_kernel/flashmla_ops.abi3.so (FlashMLA attention backend only; sgl_kernel/flash_mla.py imports it inside
#   try/except; the calibration uses --attention-backend triton)
# strips the debug sections of shared objects built with them (2026-11-26: 59.4 -> ~47 MB; the tracked tree had
# grown to ~13 MB)
# and packs the rest grouped by file type (similar files next to each other). XZ_OPTS overrides the xz preset
# (default: -9e -T2 with a 192 MiB dictionary, ~8 min on 2 cores; "-9 -T2" takes about half).
# FA3_WHEEL=<the unstripped sglang_kernel-0.4.5 wheel> puts FA3 back (sgl_kernel/flash_ops.abi3.so, 1.12 GB, which
# build_site_archive.sh's strip_sgl_kernel.sh drops), so `--attention-backend fa3` (SGLang's default on SM90) runs:
#   FA3_WHEEL=/tmp/sglang_kernel-0.4.5-cp310-abi3-manylinux2014_x86_64.whl XZ_OPTS="-6 -T2" \
#     bash scripts/device/slim_site_archive.sh .device/site/site.tar.xz .device/site-fa3/site.tar.xz
set -eu
IN=${1:?input site.tar.xz}; OUT=${2:?output site.tar.xz}
if [ -n "${FA3_WHEEL:-}" ] && ! unzip -l "$FA3_WHEEL" sgl_kernel/flash_ops.abi3.so >/dev/null 2>&1; then
  echo "FA3_WHEEL=$FA3_WHEEL: not a wheel holding sgl_kernel/flash_ops.abi3.so; give the unstripped one (pip download --no-deps sglang-kernel==0.4.5, manylinux2014_x86_64)" >&2; exit 2
fi
W=$(mktemp -d); trap 'rm -rf "$W"' EXIT
tar -C "$W" -xJf "$IN"
if [ -n "${FA3_WHEEL:-}" ]; then
  [ -d "$W/sgl_kernel" ] || { echo "$IN holds no sgl_kernel/ to put FA3 into" >&2; exit 2; }
  unzip -q -o "$FA3_WHEEL" sgl_kernel/flash_ops.abi3.so -d "$W"
  echo "FA3 kept $(date -u +%FT%TZ): sgl_kernel/flash_ops.abi3.so from $(basename "$FA3_WHEEL")" >> "$W/PRUNED_BY_PROBE.txt"
fi
rm -rf "$W/sglang/multimodal_gen" "$W/sglang/test" "$W/sglang/benchmark" "$W/nixl_cu13.scripts" \
  "$W/sgl_kernel/flashmla_ops.abi3.so"
# debug sections only (DWARF; code, symbols and dynamic tables stay): xgrammar's bindings ship 50 MB of them
find "$W" -name '*.so*' -type f -exec sh -c 'file "$1" | grep -q "with debug_info" && strip --strip-debug "$1"' _ {} \;
echo "slimmed $(date -u +%FT%TZ) from $(basename "$IN"): no sglang/multimodal_gen sglang/test sglang/benchmark nixl_cu13.scripts sgl_kernel/flashmla_ops.abi3.so; strip --strip-debug on shared objects with debug_info (xgrammar/libxgrammar_bindings.so 53 -> 3 MB)" \
  >> "$W/PRUNED_BY_PROBE.txt"
mkdir -p "$(dirname "$OUT")"
(cd "$W" && find . \( -type f -o -type l \) | awk -F/ '{n=$NF; i=index(n,"."); e=(i? substr(n, length(n)-index(reverse(n),".")+2) : ""); print e "\t" $0}
  function reverse(s,  r,k){r=""; for(k=length(s);k>0;k--) r=r substr(s,k,1); return r}' \
  | sort -t$'\t' -k1,1 -k2,2 | cut -f2 > "$W.list")
tar -C "$W" --no-recursion -cf - -T "$W.list" | xz ${XZ_OPTS:--9e -T2 --lzma2=preset=9e,dict=192MiB} > "$OUT"
rm -f "$W.list"
ls -la "$OUT"
