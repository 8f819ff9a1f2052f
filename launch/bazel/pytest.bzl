"""`py_test` for pytest files: the native py_test, with tests/pytest_main.py as its entry point.

A BUILD entry stays `py_test(name = "test_x", srcs = ["tests/test_x.py"], deps = [...])`; Bazel
then runs `pytest tests/test_x.py` (the test file itself only defines test functions).
"""

_PYTEST_MAIN = "//:tests/pytest_main.py"

def py_test(name, srcs, args = [], **kwargs):
    native.py_test(
        name = name,
        srcs = srcs + [_PYTEST_MAIN],
        main = _PYTEST_MAIN,
        args = ["$(rootpath %s)" % src for src in srcs] + args,
        **kwargs
    )
