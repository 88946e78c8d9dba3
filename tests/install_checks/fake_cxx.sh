#!/bin/sh
# A stand-in C++ compiler for the device-build tests. FAKE_CXX_MODE: ok (writes the -o file), fail (exit 1 with an
# error), hang (records its pid and a child's, as the driver and cc1plus, then waits: the test kills the builder).
out=""
while [ $# -gt 0 ]; do
    if [ "$1" = "-o" ]; then out="$2"; fi
    shift
done
case "${FAKE_CXX_MODE:-ok}" in
    ok) echo "not a real library" > "$out" ;;
    fail) echo "hpu_device.cpp:1: error: fake failure" >&2; exit 1 ;;
    hang)
        echo "partial output" > "$out"
        sleep 300 &
        echo "$!" > "$FAKE_CXX_DIR/cc1plus.pid"
        echo "$$" > "$FAKE_CXX_DIR/driver.pid"
        wait ;;
esac
