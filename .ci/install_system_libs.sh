#!/usr/bin/env bash
# Install the system libraries DeepSpeed's op builders probe for (libaio-dev) when they are missing.
# DeepSpeed checks them by compiling and linking a test program; when the library is absent, the linker's
# "cannot find -laio" errors go to the process's stderr, which in a Jupyter kernel is the notebook's output.
# Never fails the build: without root or apt-get it says so and exits 0 (the errors then stay possible).
set -u
if ldconfig -p 2>/dev/null | grep -q "libaio\.so " || [ -e /usr/lib/x86_64-linux-gnu/libaio.so ]; then
    exit 0
fi
if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null 2>&1; then
    echo "install_system_libs: libaio-dev is missing (sudo apt-get install -y libaio-dev); DeepSpeed's libaio probe" \
         "will print linker errors."
    exit 0
fi
echo "install_system_libs: installing libaio-dev with apt-get..."
export DEBIAN_FRONTEND=noninteractive
if ! apt-get install -y -qq --no-install-recommends libaio-dev >/dev/null 2>&1; then
    apt-get update -qq >/dev/null 2>&1 && apt-get install -y -qq --no-install-recommends libaio-dev >/dev/null 2>&1 \
        || echo "install_system_libs: apt-get install libaio-dev failed; DeepSpeed's libaio probe will print linker errors."
fi
exit 0
