# Python toolchain: runs every py_binary / py_test with the project's venv.
#
# BUILD.tpl is the template; tools/setup.sh writes BUILD from it, putting the
# absolute path of this clone's .venv/bin/python3 in place of the placeholder
# (Bazel 4.2.3 expands no variables in interpreter_path / stub_shebang, and
# the path differs per clone). The generated BUILD is not committed: edit
# BUILD.tpl and re-run tools/setup.sh.
# Selected by --extra_toolchains in .bazelrc.
load("@bazel_tools//tools/python:toolchain.bzl", "py_runtime_pair")

py_runtime(
    name = "venv_py3_runtime",
    interpreter_path = "@VENV_PYTHON@",
    python_version = "PY3",
    stub_shebang = "#!@VENV_PYTHON@",
)

py_runtime_pair(
    name = "venv_py_runtime_pair",
    py2_runtime = None,
    py3_runtime = ":venv_py3_runtime",
)

toolchain(
    name = "venv_py_toolchain",
    toolchain = ":venv_py_runtime_pair",
    toolchain_type = "@bazel_tools//tools/python:toolchain_type",
)
