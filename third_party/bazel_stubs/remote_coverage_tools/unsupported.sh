#!/bin/sh
echo "bazel coverage is not supported offline (see third_party/bazel_stubs/README.md)" >&2
exit 1
