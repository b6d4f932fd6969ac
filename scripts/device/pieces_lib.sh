# Sourced, never run: carried pieces ($PIECES_GLOB, default lease 7's .device/lease7/blob.part*, staged to $STAGE7 by
# `eager_profile.sh stage` / `eager_modes.sh stage`, one piece per call) -> the site archive (SITE_ARCHIVE) and the
# runtime + httptools wheel in .device/rt, for bench_lib.sh. Shared by eager_profile.sh, warmup_fix.sh and
# eager_modes.sh. BLOB_SHA256, when set, is checked on the pieces.
assemble_pieces() {  # sets PIECES_DIR (the unpacked archive)
  local x=$STAGE7/x
  if [ ! -f $x/.done ]; then
    mkdir -p $STAGE7
    for f in ${PIECES_GLOB:-.device/lease7/blob.part*}; do [ -f "$f" ] && cp "$f" $STAGE7/; done
    rm -rf $x; mkdir -p $x
    if [ -n "${BLOB_SHA256:-}" ]; then
      local got; got=$(cat $(ls $STAGE7/blob.part* | sort) | sha256sum | cut -d' ' -f1)
      [ "$got" = "$BLOB_SHA256" ] || { echo "pieces: sha256 $got, expected $BLOB_SHA256 (a piece missing?)"; ls -l $STAGE7; exit 1; }
    fi
    cat $(ls $STAGE7/blob.part* | sort) | tar -C $x -x || { echo "pieces do not make the archive"; exit 1; }
    touch $x/.done
  fi
  mkdir -p .device/rt/whl && cp $x/runtime.tar.xz .device/rt/ && cp $x/httptools-*.whl .device/rt/whl/
  export SITE_ARCHIVE=$x/site.tar.xz
  PIECES_DIR=$x
}
