"""`py_test` for pytest files: the native py_test, with tests/pytest_main.py as its entry point.

A BUILD entry stays `py_test(name = "test_x", srcs = ["tests/test_x.py"], deps = [...])`; Bazel
then runs `pytest tests/test_x.py` (the test file itself only defines test functions). Each test
also reads the pins the .venv interpreter was installed from: Bazel does not look inside the
interpreter, so without them a cached result would outlive a change of requirements.
"""

_PYTEST_MAIN = "//:tests/pytest_main.py"
_PINS = "@tr_python//:requirements.txt"

def py_test(name, srcs, args = [], data = [], **kwargs):
    native.py_test(
        name = name,
        srcs = srcs + [_PYTEST_MAIN],
        main = _PYTEST_MAIN,
        args = ["$(rootpath %s)" % src for src in srcs] + args,
        data = data + [_PINS],
        **kwargs
    )
