"""Bazel macros for TensorPipe.

Load with: load("//:build_defs.bzl", "tensorpipe_py_tests")
"""

_SLOW_SUFFIX = "_slow_test.py"

# The main of every test (tests/test_main.py): runs the test file given as its
# first argument, without tf.test.TestCase's test_session placeholder, and
# fails when the file ran no test.
_TEST_MAIN = "//tests:test_main.py"

def tensorpipe_py_tests(
        name = None,
        srcs = None,
        deps = [],
        data = [],
        size = "medium",
        tags = [],
        overrides = {},
        **kwargs):
    """One py_test per *_test.py file of the calling package.

    Each test file is a self-contained unittest module that ends with
    `unittest.main()` (or `tf.test.main()`). The test's main is
    tests/test_main.py, which runs that file as __main__, leaves out
    tf.test.TestCase's test_session placeholder and fails a file that runs
    no test. The target name is the file name without ".py"
    (foo_test.py -> :foo_test).

    Slow tests: a file named *_slow_test.py gets the tag "slow". tools/test.sh
    runs `bazel test --test_tag_filters=-slow` and then pytest on the slow
    files (tests/conftest.py gives them the pytest marker "slow"). The file
    name is the single switch so the two runners always agree; passing
    "slow" in `tags` is therefore an error.

    Args:
      name: optional; if given, a test_suite of that name holding all the
        generated tests.
      srcs: test files; default glob(["*_test.py"]) (an empty folder is fine).
      deps: deps of every test, e.g. ["//tensorpipe", "//models"].
      data: data files of every test.
      size: Bazel test size of every test ("small" = 60 s timeout,
        "medium" = 300 s, "large" = 900 s, "enormous" = 3600 s).
      tags: tags of every test (e.g. "exclusive" for timing-sensitive tests,
        "cpu:2" to reserve two cores, "manual" to leave out of //...).
      overrides: per-file attribute overrides, e.g.
        {"pipeline_test.py": {"size": "large", "tags": ["exclusive"],
                              "shard_count": 2, "deps": [...]}}.
        "tags", "deps" and "data" are appended to the common ones; other
        attributes replace them.
      **kwargs: any other py_test attribute, for every test (args, env,
        timeout, flaky, shard_count, ...).
    """
    if "slow" in tags:
        fail("Do not tag tests 'slow' by hand: name the file *" + _SLOW_SUFFIX +
             " (pytest and Bazel then both treat it as slow).")
    if srcs == None:
        srcs = native.glob(["*_test.py"], allow_empty = True)
    for src in overrides:
        if src not in srcs:
            fail("overrides names %s, which is not among the test srcs" % src)

    tests = []
    for src in srcs:
        if not src.endswith("_test.py"):
            fail("test file %s must be named *_test.py" % src)
        attrs = dict(kwargs)
        attrs["size"] = size
        test_tags = list(tags)
        test_deps = list(deps)
        test_data = list(data)
        extra = overrides.get(src, {})
        for key, value in extra.items():
            if key == "tags":
                if "slow" in value:
                    fail("Do not tag tests 'slow' by hand: rename %s to *%s" % (src, _SLOW_SUFFIX))
                test_tags += value
            elif key == "deps":
                test_deps += value
            elif key == "data":
                test_data += value
            else:
                attrs[key] = value
        if src.endswith(_SLOW_SUFFIX):
            test_tags.append("slow")
        test_name = src[:-len(".py")]
        attrs["args"] = ["$(rootpath %s)" % src] + attrs.get("args", [])
        native.py_test(
            name = test_name,
            srcs = [src, _TEST_MAIN],
            main = _TEST_MAIN,
            deps = test_deps,
            data = test_data,
            tags = test_tags,
            python_version = "PY3",
            srcs_version = "PY3",
            **attrs
        )
        tests.append(":" + test_name)

    if name:
        native.test_suite(name = name, tests = tests)
