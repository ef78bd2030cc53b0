#!/usr/bin/env bash
# Finds or fetches the text corpus for the GPT and prints the folder that holds it.
# Order: $NT_DATA_DIR/tinyshakespeare.txt; ./.data/tinyshakespeare.txt; a download from the
# corpus' public source (char-rnn) when the network allows, checked by md5; otherwise a
# fallback corpus built from the license texts every Debian system ships, with a warning.
set -euo pipefail
cd "$(dirname "$0")/.."
want_md5=6fb458f1232090904fb40fe944165e91
if [ -n "${NT_DATA_DIR:-}" ] && [ -f "$NT_DATA_DIR/tinyshakespeare.txt" ]; then
  echo "$NT_DATA_DIR"; exit 0
fi
mkdir -p .data
if [ ! -f .data/tinyshakespeare.txt ]; then
  url=https://raw.githubusercontent.com/karpathy/char-rnn/master/data/tinyshakespeare/input.txt
  if command -v curl >/dev/null && curl -fsSL --max-time 30 -o .data/tiny.tmp "$url" 2>/dev/null &&
     [ "$(md5sum < .data/tiny.tmp | cut -d' ' -f1)" = "$want_md5" ]; then
    mv .data/tiny.tmp .data/tinyshakespeare.txt
    echo "downloaded tiny shakespeare into .data/" >&2
  else
    rm -f .data/tiny.tmp
  fi
fi
if [ -f .data/tinyshakespeare.txt ]; then
  echo "$PWD/.data"; exit 0
fi
mkdir -p .data/fallback
cat /usr/share/common-licenses/* > .data/fallback/tinyshakespeare.txt 2>/dev/null || true
echo "WARNING: tiny shakespeare not found (set NT_DATA_DIR to its folder) and not downloadable;" \
     "training the GPT on the system's license texts instead" >&2
echo "$PWD/.data/fallback"
