#!/usr/bin/env bash
# The Debian packages a part of CI needs, installed non-interactively when missing (with sudo unless
# already root); nothing is done when everything is there.
#
#   ci/system-packages.sh PART...    PART: native (CMake, g++, protoc and protobuf's headers for
#                                    ci/native.sh) or browser (Chromium for the dashboard tests)
set -euo pipefail
missing=()
for part in "$@"; do
  case "$part" in
    native)
      command -v cmake > /dev/null || missing+=(cmake)
      command -v g++ > /dev/null || missing+=(g++)
      command -v protoc > /dev/null || missing+=(protobuf-compiler)
      [ -f /usr/include/google/protobuf/message_lite.h ] || missing+=(libprotobuf-dev)
      ;;
    browser)
      [ -x /usr/bin/chromium ] || missing+=(chromium)
      ;;
    *)
      echo "ci/system-packages.sh: unknown part '$part' (native, browser)" >&2
      exit 2
      ;;
  esac
done
if ((${#missing[@]})); then
  echo "installing ${missing[*]}"
  as_root=()
  [ "$(id -u)" -eq 0 ] || as_root=(sudo)
  "${as_root[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update -qq
  "${as_root[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
